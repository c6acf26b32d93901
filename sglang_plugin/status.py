"""``capwatch_sglang_plugin_info``: whether the plugin instruments this scheduler, and if not, why.

Its ``state``: ``enabled``; ``disabled`` (capwatch cannot instrument what SGLang runs: a release, a setting, a hook
target); ``backend_unavailable`` (SGLang itself cannot build the backend's dispatcher with what is installed, so
there is nothing to instrument and the server will not run that backend either: :class:`BackendUnavailable`).
"""

from __future__ import annotations

from dataclasses import dataclass

from capwatch.agent.status import StatusCollector
from capwatch.sglang_plugin.releases import installed_version

PLUGIN_INFO = "capwatch_sglang_plugin"
PLUGIN_INFO_HELP = "Whether capwatch instruments this SGLang scheduler, and why not."

ENABLED, DISABLED, BACKEND_UNAVAILABLE = "enabled", "disabled", "backend_unavailable"


@dataclass(frozen=True)
class BackendUnavailable:
    """A backend SGLang cannot build with the installed libraries (a hook module's ``problem`` returns it): what is
    installed and why it cannot work, then what to do. Not capwatch's adapter failing: SGLang's own dispatcher
    raises at model construction."""

    installed: str  # what is installed and why SGLang cannot build the dispatcher with it
    remedy: str  # what to install or set instead

    def __str__(self) -> str:
        return f"{self.installed}; {self.remedy}"


def library_missing(dispatcher: str, library: str, error: BaseException | None, install: str) -> BackendUnavailable:
    """SGLang's ``dispatcher`` cannot be built because ``library`` does not import here (``error``: why, where
    SGLang kept it): the one line a hook's ``problem`` returns for it, with what to install (``install``)."""
    why = f" ({type(error).__name__}: {error})" if error is not None else ""
    sglang = installed_version("sglang")
    return BackendUnavailable(
        f"{f'sglang {sglang}' if sglang else 'SGLang'}'s {dispatcher} cannot be built: {library} does not import{why}",
        f"install {install} in the server's environment (`python -c 'import {library}'` there shows why it does not "
        "load), or pick another --moe-a2a-backend")


def state_of(reason: str | BackendUnavailable | None) -> str:
    """The info metric's ``state`` for a start that found ``reason`` (None: nothing stood in the way)."""
    if reason is None:
        return ENABLED
    return BACKEND_UNAVAILABLE if isinstance(reason, BackendUnavailable) else DISABLED


def plugin_status(state: str, reason: str, versions: dict[str, str | None]) -> StatusCollector:
    """The plugin's info metric in one scheduler process."""
    return StatusCollector(PLUGIN_INFO, PLUGIN_INFO_HELP, state, reason, versions)
