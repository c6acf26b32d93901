"""A backend and the engine are named in their own modules and the registries, not everywhere.

Counted by token (``tests/support/name_count.py``: names and strings of the code, not comments or docstrings).
The goal (issue #30): outside a backend's own modules, at most three modules name it (the registries); outside
the SGLang packages, at most four name SGLang. ``STILL_NAMING`` lists the modules that name them today beyond
that: it may only shrink — a module that starts naming one fails here, and one that stopped must leave the list.
"""

from __future__ import annotations

import pytest

from capwatch.backends import SPECS
from tests.support.checkout import PACKAGE_DIRS
from tests.support.name_count import modules_naming, names_word

FOLDERS = sorted(set(PACKAGE_DIRS.values()))
BACKENDS = tuple(SPECS)  # a backend registered tomorrow is counted from its first day
ENGINE = "sglang"
ENGINE_HOMES = ("sglang_engine/", "sglang_plugin/", "sglang_logs/")
# The registries: where every backend is listed once (the specs; the SGLang plugin's hooks, each naming its floor
# module; SGLang's variable, default and reserve per backend).
REGISTRIES = {"backends/__init__.py", "sglang_plugin/hooks/__init__.py", "sglang_engine/caps.py"}
# Where every engine is listed once.
ENGINE_REGISTRIES = {"capwatch/engines.py"}

STILL_NAMING: dict[str, set[str]] = {
    "deepep": set(),
    "flashinfer": set(),
    ENGINE: set(),
}


def naming_outside_home(word: str) -> set[str]:
    """The modules outside ``word``'s own that name it in code (a backend's own: its name in the file's name)."""
    def own(path: str) -> bool:
        if word == ENGINE:
            return path.startswith(ENGINE_HOMES)
        return word in path.rsplit("/", 1)[-1].lower()
    return {path for path in modules_naming(word, FOLDERS) if not own(path)}


@pytest.mark.parametrize("word", [*BACKENDS, ENGINE])
def test_no_module_starts_naming_a_backend_or_the_engine_and_the_list_only_shrinks(word):
    found = naming_outside_home(word)
    still = STILL_NAMING.get(word, set())
    allowed = still | (REGISTRIES if word != ENGINE else ENGINE_REGISTRIES)
    assert not found - allowed, (f"these modules now name {word} in code; loop over the registry "
                                 f"(capwatch.backends) or move the fact into {word}'s own module: {sorted(found - allowed)}")
    assert not still - found, f"these no longer name {word}: drop them from STILL_NAMING: {sorted(still - found)}"


def test_the_count_reads_code_not_prose():
    assert names_word("from capwatch.backends import deepep\n", "deepep")
    assert names_word("x = config.DeepEP_mode\n", "deepep")
    assert names_word("ENV = 'SGLANG_X'\n", "sglang")
    assert names_word("y = f'{a} deepep {b}'\n", "deepep")
    assert not names_word('"""Prices DeepEP."""\n# and deepep\nx = 1\n', "deepep")
    assert not names_word('def f():\n    """DeepEP\'s buffer."""\n    return 1\n', "deepep")
