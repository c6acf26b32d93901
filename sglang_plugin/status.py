"""``capwatch_sglang_plugin_info``: whether the plugin instruments this scheduler, and if not, why."""

from __future__ import annotations

from capwatch.agent.status import StatusCollector

PLUGIN_INFO = "capwatch_sglang_plugin"
PLUGIN_INFO_HELP = "Whether capwatch instruments this SGLang scheduler, and why not."


def plugin_status(state: str, reason: str, versions: dict[str, str | None]) -> StatusCollector:
    """The plugin's info metric in one scheduler process."""
    return StatusCollector(PLUGIN_INFO, PLUGIN_INFO_HELP, state, reason, versions)
