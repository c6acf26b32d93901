"""Mooncake EP as a backend (``--moe-a2a-backend mooncake``): its rules (``sizing/mooncake.py``), its buffer's
bytes as the rank's Mooncake EP sizes them (``backends/reported.py``)."""

from __future__ import annotations

from capwatch.backends.reported import reported_spec
from capwatch.engines import ENGINE
from capwatch.sizing.mooncake import MOONCAKE

RULES = ENGINE.bind_rules(MOONCAKE)  # with the engine's variable and default for the cap
SPEC = reported_spec(RULES, description=f"""\
--backend mooncake prices {RULES.cap_env_var} (default {RULES.default_cap}, at most
{RULES.max_cap_tokens}) in Mooncake EP's buffer. Its size hint is Mooncake EP's C++, so capwatch asks it in the
rank: give the bytes a rank reported at its cap; other caps are priced in proportion, an estimate.""")
