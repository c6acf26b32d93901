"""One import name per module, in every process that imports ``tests``: ``capwatch.service``, never ``service``.

Why: an install has one package, ``capwatch``. The test run has the checkout's root on ``sys.path`` (pytest puts
it there to import ``tests``; ``python -m`` adds the working folder), and there the root folders ``service/``,
``dispatcher/`` ... are packages of their own: the same files under a second name, a world no user has. Code that
reached a module by that name passed its tests and failed in every install (the web page was read through
``resources.files("service")``).

``install()`` (called by ``tests/__init__.py``) puts ``OneNameFinder`` first on ``sys.meta_path``: a top-level
import that would load a file of the checkout under another name than its own (``checkout.module_name``) raises
``SecondNameError``, the ``ModuleNotFoundError`` an install raises, saying which name to use. It also refuses to
start where such a module is already loaded. Every process that imports ``tests.*`` is guarded: pytest, the rank
programs, multiprocessing children, the benchmarks. A child that imports nothing of the checkout is started by
``tests.support.launcher`` without the checkout on its path at all.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from importlib.machinery import ModuleSpec, PathFinder
from types import ModuleType

from tests.support.checkout import module_name

# What Python itself names the program it runs (``python -m capwatch``, a multiprocessing child's main module).
PROGRAM_NAMES = ("__main__", "__mp_main__")


class SecondNameError(ModuleNotFoundError):
    def __init__(self, name: str, one_name: str):
        super().__init__(f"No module named {name!r}: it is {one_name}, and only that name exists in an install "
                         f"(the checkout's root is on sys.path here, not in a user's world): import {one_name}",
                         name=name)


def _location(spec: ModuleSpec) -> str | None:
    if spec.origin and spec.has_location:
        return spec.origin
    return next(iter(spec.submodule_search_locations or ()), None)  # a namespace package: its folder


class OneNameFinder:
    """Finds nothing itself: it asks where ``sys.path`` would find a top-level name and refuses a second name."""

    @classmethod
    def find_spec(cls, name: str, path=None, target=None) -> None:
        if path is not None:  # a submodule: its top-level package passed here first
            return None
        spec = PathFinder.find_spec(name)
        location = _location(spec) if spec is not None else None
        one_name = module_name(location) if location else None
        if one_name is not None and one_name != name:
            raise SecondNameError(name, one_name)
        return None

    @classmethod
    def invalidate_caches(cls) -> None:
        pass


def second_names(modules: Mapping[str, ModuleType]) -> dict[str, str]:
    """{name: its one name} for each loaded module of the checkout that is known by another name."""
    found = {}
    for name, module in list(modules.items()):
        location = getattr(module, "__file__", None) or next(iter(getattr(module, "__path__", None) or ()), None)
        one_name = module_name(location) if isinstance(location, str) and name not in PROGRAM_NAMES else None
        if one_name is not None and one_name != name:
            found[name] = one_name
    return found


def installed() -> bool:
    return any(finder is OneNameFinder for finder in sys.meta_path)


def install() -> None:
    """Guard this process from now on; fail if a module already came in under a second name."""
    if installed():
        return
    loaded = second_names(sys.modules)
    if loaded:
        raise ImportError("modules of the checkout were imported under a second name before tests.* was: "
                          + ", ".join(f"{name} (is {one_name})" for name, one_name in sorted(loaded.items())))
    sys.meta_path.insert(0, OneNameFinder)
