"""The SGLang releases capwatch is verified against, keyed on the installed version, and the rule for others.

A verified release runs on its own adapters, one module per layer and backend: ``hooks/<backend>.py``
(what the plugin hooks and how that release drives its dispatcher) and ``floors/<backend>.py`` (the
cap's start-up floor, named by the hook module's ``FLOOR``). A release newer than the newest verified one stays disabled unless the operator
opts in (``CAPWATCH_ALLOW_NEWER_SGLANG=1``): then it runs on the newest release's adapters, and only
when every hook target and signature matches them (checked before anything is hooked). An older
release is never enabled.

Every release starts the plugin the same way: ``configure_scheduler_process(server_args, gpu_id, ...)``
(the same first two parameters since 0.5.11) runs in each scheduler process after ``publish`` and before
the model is built (0.5.18 on), and carries the GPU index, so each scheduler of a node serves its own
exporter (base port + GPU index). SGLang's Ray path (``srt/ray/scheduler_actor.py``) never calls
``load_plugins()``: no plugin runs under Ray actors, in any release.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import pkgutil
import re
from dataclasses import dataclass

VERIFIED = ("0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
NEWEST = VERIFIED[-1]

SCHEDULER_MODULE = "sglang.srt.managers.scheduler"
START_HOOK = f"{SCHEDULER_MODULE}.configure_scheduler_process"
START_PARAMETERS = ("server_args", "gpu_id")  # its first two, in every verified release


@dataclass(frozen=True)
class Target:
    """A dotted name the plugin hooks or calls, and the leading parameters it relies on (by name)."""

    name: str
    parameters: tuple[str, ...] = ()


@dataclass(frozen=True)
class Adapter:
    """How a family of SGLang releases builds and drives a backend's dispatch where one set of hook targets serves
    them all: the releases (each verified by the backend's plugin test) and the targets its hooks rely on, every
    name and signature checked before anything is hooked (``first_problem``). A backend whose releases differ in
    more than that keeps an adapter class of its own (FlashInfer's, NIXL EP's)."""

    releases: tuple[str, ...]
    hooked: tuple[Target, ...]

    def targets(self) -> tuple[Target, ...]:
        return self.hooked

    def by_release(self) -> dict[str, "Adapter"]:
        """A hook module's ``ADAPTERS``: this one for each of its releases."""
        return {release: self for release in self.releases}


# Every graph capture of a scheduler goes through one of these (spec runners subclass the two runners), in every
# verified release: each backend's hooks pause its snapshots around them.
CAPTURE_TARGETS = (
    Target("sglang.srt.model_executor.model_runner_components.cuda_graph_setup.capture_cuda_graphs"),
    Target("sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.capture"),
    Target("sglang.srt.model_executor.runner.prefill_cuda_graph_runner.PrefillCudaGraphRunner.capture"),
)


@dataclass(frozen=True)
class ReleaseChoice:
    installed: str  # the sglang version found
    adapter: str  # the verified release whose adapters run it
    newer: bool = False  # a newer release the operator opted in to

    def describe(self) -> str:
        if not self.newer:
            return f"sglang {self.installed}"
        return (f"sglang {self.installed}, newer than the verified {VERIFIED[0]} - {NEWEST}, on the {NEWEST} "
                f"adapters (CAPWATCH_ALLOW_NEWER_SGLANG=1; every hook target and signature matched them)")


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _order(version: str) -> tuple[int, ...] | None:
    """Release ordering: X.Y.Z, then .postN (later), rcN/devN (earlier); None when unreadable."""
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(?:(rc|\.dev|dev|a|b)(\d+)|\.post(\d+))?(?:\+.*)?", version.strip())
    if not match:
        return None
    major, minor, patch, pre, pre_number, post = match.groups()
    suffix = (-1, int(pre_number)) if pre else (1, int(post)) if post else (0, 0)
    return (int(major), int(minor), int(patch), *suffix)


def choose(version: str | None, allow_newer: bool) -> ReleaseChoice | str:
    """The release whose adapters run the installed one, or why none does."""
    known = f"capwatch is verified on sglang {', '.join(VERIFIED)}"
    if version is None:
        return f"sglang is not installed ({known})"
    if version in VERIFIED:
        return ReleaseChoice(version, version)
    order = _order(version)
    if order is None:
        return f"sglang {version} is not a version capwatch can read ({known})"
    if order < _order(NEWEST):
        return f"sglang {version} is not supported ({known})"
    if not allow_newer:
        return (f"sglang {version} is newer than the releases capwatch is verified on ({VERIFIED[0]} - {NEWEST}); "
                f"set CAPWATCH_ALLOW_NEWER_SGLANG=1 to run it on the {NEWEST} adapters when they still match")
    return ReleaseChoice(version, NEWEST, newer=True)


def target_problem(target: Target) -> str | None:
    """Why ``target`` cannot be used (gone, or its leading parameters changed), or None."""
    try:
        found = pkgutil.resolve_name(target.name)
    except Exception as error:  # ImportError, AttributeError, or whatever the import raised
        return f"hook target {target.name} is not there ({type(error).__name__}: {error})"
    if not target.parameters:
        return None
    try:
        names = [name for name in inspect.signature(found).parameters if name != "self"]
    except (TypeError, ValueError) as error:
        return f"hook target {target.name} has no signature capwatch can read ({error})"
    if tuple(names[: len(target.parameters)]) != target.parameters:
        return (f"hook target {target.name} takes ({', '.join(names)}), capwatch's adapter expects "
                f"({', '.join(target.parameters)}, ...)")
    return None


def first_problem(targets) -> str | None:
    for target in targets:
        problem = target_problem(target)
        if problem is not None:
            return problem
    return None
