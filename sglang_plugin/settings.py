"""The SGLang plugin's settings: the rank agent's (``agent/settings.py``) and SGLang's own switch."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

from capwatch.agent import settings as agent_settings
from capwatch.agent.settings import PREFIX, SettingsError
from capwatch.sglang_plugin.apply.settings import ApplySettings, ApplySettingsError, load_apply

__all__ = ["PREFIX", "PluginSettings", "SettingsError", "load"]


@dataclass(frozen=True)
class PluginSettings(agent_settings.AgentSettings):
    # CAPWATCH_ALLOW_NEWER_SGLANG: run an SGLang newer than the verified ones on the newest adapters
    # (only when every hook target and signature still matches them).
    allow_newer_sglang: bool = False
    apply: ApplySettings = ApplySettings()  # CAPWATCH_APPLY and its settings: the launcher's (docs/apply.md)


def load(environ: Mapping[str, str] = os.environ) -> PluginSettings:
    """The plugin's settings from the environment; SettingsError naming the variable that cannot be used."""
    settings = agent_settings.load(environ, PluginSettings, switches={"allow_newer_sglang": "ALLOW_NEWER_SGLANG"})
    try:
        return dataclasses.replace(settings, apply=load_apply(environ))
    except ApplySettingsError as error:
        raise SettingsError(str(error)) from None
