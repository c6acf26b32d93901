"""NIXL EP as a backend (``--moe-a2a-backend nixl``): its rules (``sizing/nixl.py``), its RDMA buffer's bytes as the
rank's NIXL EP sizes them (``backends/reported.py``)."""

from __future__ import annotations

from capwatch.backends.reported import reported_spec
from capwatch.engines import ENGINE
from capwatch.sizing.nixl import NIXL

RULES = ENGINE.bind_rules(NIXL)  # with the engine's variable and default for the cap
SPEC = reported_spec(RULES, description=f"""\
--backend nixl prices {RULES.cap_env_var} (default {RULES.default_cap}, at most {RULES.max_cap_tokens}) in
NIXL EP's RDMA buffer. Its size hint is NIXL EP's C++, so capwatch asks it in the rank: give the bytes a rank
reported at its cap; other caps are priced in proportion, an estimate.""")
