"""DeepEP v2's ``ElasticBuffer`` as a backend (``--moe-a2a-backend deepep_v2``): its rules
(``sizing/deepep_v2.py``), its buffer's bytes as a rank reports them (``backends/reported.py``)."""

from __future__ import annotations

from capwatch.backends.reported import reported_spec
from capwatch.engines import ENGINE
from capwatch.sizing.deepep_v2 import DEEPEP_V2, check_hidden_size

RULES = ENGINE.bind_rules(DEEPEP_V2)  # with the engine's variable and default for the cap
SPEC = reported_spec(RULES, check_hidden_size=check_hidden_size, description=f"""\
--backend deepep_v2 prices {RULES.cap_env_var} (default {RULES.default_cap}) in DeepEP v2's
ElasticBuffer. Its size comes from DeepEP's C++ and the group's NCCL topology, so capwatch cannot compute it
offline: give the num_bytes a rank reported (or the start-up line 'Initialized DeepEP v2 ElasticBuffer: ...
num_bytes=N' logged) at its cap; other caps are priced in proportion, an estimate.""")
