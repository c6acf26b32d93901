"""FlashInfer's MegaMoE layer as a backend (``--moe-a2a-backend flashinfer_megamoe``): its rules
(``sizing/flashinfer_megamoe.py``), its workspace's bytes as a rank reports them (``backends/reported.py``)."""

from __future__ import annotations

from capwatch.backends.reported import reported_spec
from capwatch.engines import ENGINE
from capwatch.sizing.flashinfer_megamoe import FLASHINFER_MEGAMOE

RULES = ENGINE.bind_rules(FLASHINFER_MEGAMOE)  # with the engine's variable for the cap
SPEC = reported_spec(RULES, description=f"""\
--backend flashinfer_megamoe prices {RULES.cap_env_var} (0 or unset: derived by the engine from its largest
batch, else 1024) in FlashInfer's MegaMoE workspace. The workspace lives on the symmetric heap and its layout
depends on the kernel and its tuned knobs, so capwatch cannot size it offline: give the bytes a rank reported at
its cap; other caps are priced in proportion, an estimate.""")
