"""The release folders the tests run on hold what each release pins (read from its installed METADATA), and
they are exactly the releases the plugin has adapters for, each beside the FlashInfer its adapter accepts first."""

from __future__ import annotations

import importlib
import pkgutil
import re

import pytest

from capwatch.sglang_plugin import releases
from capwatch.sglang_plugin.floors import flashinfer as flashinfer_floor
from capwatch.sglang_plugin import floors
from capwatch.sglang_plugin.hooks import BACKENDS, FLOORS
from capwatch.sglang_plugin.hooks import flashinfer as flashinfer_hooks
from tests.sglang.releases import GROUPS, RELEASE_REQUIREMENTS, RELEASES, release_path

NOT_PINNED_BY_SGLANG = {"huggingface-hub"}  # chosen by capwatch: the newest transformers 5.12.1 accepts


def _name(requirement: str) -> str:
    return re.split(r"[\[=<>!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def pins_of(version: str) -> dict[str, str]:
    """``name -> exact version`` of every ``==`` pin in the release's METADATA."""
    metadata = release_path(version)[0] / f"sglang-{version}.dist-info" / "METADATA"
    pins = {}
    for line in metadata.read_text().splitlines():
        match = re.fullmatch(r"Requires-Dist: ([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^;\s]+)(?:\s*;.*)?", line.strip())
        if match:
            pins[_name(match.group(1))] = match.group(2)
    return pins


def test_the_tests_install_exactly_the_verified_releases():
    assert RELEASES == releases.VERIFIED
    assert set(flashinfer_hooks.ADAPTERS) == set(flashinfer_floor.FLOOR_RULES) == set(releases.VERIFIED)


@pytest.mark.parametrize("name", BACKENDS)
def test_each_backends_hook_module_names_its_own_floor_for_every_release_it_hooks(name):
    """One registry (``hooks/__init__.py``): a backend's hook module names its floor module, which has a rule for
    every release the hooks are verified on."""
    hooks = BACKENDS[name]
    assert hooks.NAME == hooks.FLOOR.NAME == name and FLOORS[name] is hooks.FLOOR
    assert set(hooks.ADAPTERS) <= set(hooks.FLOOR.FLOOR_RULES)


def test_every_floor_module_is_named_by_a_registered_backend():
    """A ``floors/<backend>.py`` no hook module names would never run: it is a backend not registered."""
    backends_floors = {
        info.name for info in pkgutil.iter_modules(floors.__path__)
        if hasattr(importlib.import_module(f"{floors.__name__}.{info.name}"), "FLOOR_RULES")}
    assert backends_floors == {module.__name__.rsplit(".", 1)[-1] for module in FLOORS.values()}


@pytest.mark.parametrize("version", RELEASES, ids=lambda version: f"sglang-{version}")
def test_each_release_folder_holds_that_releases_own_pins(version):
    pins = pins_of(version)
    assert pins, f"no pins read from sglang {version}'s METADATA"
    requirements = [each for requirement in RELEASE_REQUIREMENTS[version][1:]
                    for each in GROUPS.get(requirement, (requirement,))]
    for requirement in requirements:
        name, pinned = _name(requirement), requirement.split("==")[1]
        if name not in NOT_PINNED_BY_SGLANG:
            assert pins.get(name) == pinned, f"sglang {version} pins {name}=={pins.get(name)}, the folder {pinned}"
    assert pins["flashinfer-python"] == flashinfer_hooks.ADAPTERS[version].flashinfer[0]  # its own pin first
    assert pins["torch"] in ("2.13.0", "2.14.1")  # the set is 2.14.1: 0.5.19 - 0.5.21 differ (docs/sglang.md)
