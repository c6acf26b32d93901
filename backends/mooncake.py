"""Mooncake EP as a backend (``--moe-a2a-backend mooncake``): its rules (``sizing/mooncake.py``), its buffer's
bytes as the rank's Mooncake EP sizes them (``backends/reported.py``)."""

from __future__ import annotations

from capwatch.backends.reported import reported_spec
from capwatch.sizing.mooncake import MOONCAKE

SPEC = reported_spec(MOONCAKE, f"""\
--backend mooncake prices {MOONCAKE.cap_env_var} (default {MOONCAKE.default_cap}, at most
{MOONCAKE.max_cap_tokens}) in Mooncake EP's buffer. Its size hint is Mooncake EP's C++, so capwatch asks it in the
rank: give the bytes a rank reported at its cap; other caps are priced in proportion, an estimate.""")
