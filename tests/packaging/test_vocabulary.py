"""The shared vocabulary: one spelling of every word (``capwatch.vocabulary`` for every layer,
``capwatch.advisor.vocabulary`` for the advisor's own, ``capwatch.service.vocabulary`` for the service's own), one cap alignment (``capwatch.sizing.caps``),
and no product module with a copy of its own."""

from __future__ import annotations

import ast
import typing

import pytest
from capwatch.advisor import vocabulary as advisor_vocabulary
from capwatch.service import vocabulary as service_vocabulary
from capwatch.sizing import caps
from capwatch.backends import SPECS
from hypothesis import given
from hypothesis import strategies as st

from capwatch import vocabulary
from tests.support.checkout import PRODUCT_FOLDERS, REPO_ROOT


@pytest.mark.parametrize("literal, values", [
    (vocabulary.Role, vocabulary.ROLES), (vocabulary.OverflowPolicy, vocabulary.OVERFLOW_POLICIES),
    (vocabulary.OverflowKind, vocabulary.OVERFLOW_KINDS), (vocabulary.OverflowOutcome, vocabulary.OVERFLOW_OUTCOMES),
    (advisor_vocabulary.Action, advisor_vocabulary.ACTIONS),
    (service_vocabulary.RankStatus, service_vocabulary.RANK_STATUSES),
])
def test_each_tuple_is_its_literal(literal, values):
    assert values == typing.get_args(literal) and len(set(values)) == len(values)


@given(st.integers(min_value=0, max_value=1 << 40), st.integers(min_value=1, max_value=1 << 12))
def test_align_up_and_down_bracket_the_value_on_the_grain(value, alignment):
    up, down = caps.align_up(value, alignment), caps.align_down(value, alignment)
    assert up % alignment == 0 and down % alignment == 0
    assert down <= value <= up and up - down in (0, alignment)
    assert (up == value) == (value % alignment == 0)


def test_alignment_defaults_to_the_cap_grain_and_refuses_nonsense():
    assert (caps.align_up(1), caps.align_up(128), caps.align_up(129), caps.align_up(0)) \
        == (128, 128, 256, 0)
    assert caps.align_up(300.5) == 384
    with pytest.raises(ValueError, match="alignment must be positive"):
        caps.align_up(5, 0)


# Each is defined once (capwatch/vocabulary.py, advisor/vocabulary.py, service/vocabulary.py, sizing/caps.py) and imported elsewhere.
ONE_PLACE_NAMES = {"ROLES", "OVERFLOW_POLICIES", "OVERFLOW_KINDS", "OVERFLOW_OUTCOMES", "ACTIONS", "RANK_STATUSES",
                   "CAP_ALIGNMENT", "MAX_CAP_TOKENS", "align_up", "align_down"}


# Each backend's cap variable is spelled once, where its rules are defined (its own sizing module).
CAP_VARIABLES = {spec.rules.cap_env_var for spec in SPECS.values()}


def _product_modules():
    for folder in PRODUCT_FOLDERS:
        yield from sorted((REPO_ROOT / folder).rglob("*.py"))


def test_the_vocabulary_lives_in_one_place():
    """No product module defines its own copy of a vocabulary name, or spells the cap's variable as a
    constant of its own (one rule, one place: a copy is where two spellings drift apart)."""
    copies = []
    spelled: dict[str, list[str]] = {variable: [] for variable in CAP_VARIABLES}
    for path in _product_modules():
        if path.name == "vocabulary.py" or (path.name == "caps.py" and path.parent.name == "sizing"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in CAP_VARIABLES:
                spelled[node.value].append(f"{path}:{node.lineno}")
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in ONE_PLACE_NAMES:
                copies.append(f"{path}:{node.lineno} defines {node.name}")
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) else []
            for target in targets:
                if isinstance(target, ast.Name) and target.id in ONE_PLACE_NAMES:
                    copies.append(f"{path}:{node.lineno} assigns {target.id}")
    copies += [f"{where} spells {variable} again (first at {places[0]})" for variable, places in spelled.items()
               for where in places[1:]]
    assert not copies, "copies of the vocabulary (import them from where they are defined):\n" + \
        "\n".join(copies)


def test_the_schema_and_the_dispatcher_use_the_vocabulary():
    from capwatch.dispatcher import instrumented
    from capwatch.telemetry.report import OverflowCount, RankConfig, RankIdentity

    assert typing.get_args(RankIdentity.model_fields["role"].annotation) == vocabulary.ROLES
    assert typing.get_args(RankConfig.model_fields["overflow_policy"].annotation) == vocabulary.OVERFLOW_POLICIES
    assert typing.get_args(OverflowCount.model_fields["kind"].annotation) == vocabulary.OVERFLOW_KINDS
    assert typing.get_args(OverflowCount.model_fields["outcome"].annotation) == vocabulary.OVERFLOW_OUTCOMES
    for needed in (1, 127, 128, 129, 4097):
        assert instrumented.suggested_cap(needed) == max(caps.CAP_ALIGNMENT, caps.align_up(needed))
