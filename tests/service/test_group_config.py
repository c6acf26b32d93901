"""One builder of a group's configuration (``advisor/group.py``), used by the service and the log reader alike:
its merging rules, and no product module building a ``GroupConfig`` of its own."""

from __future__ import annotations

import ast

import pytest
from capwatch.advisor.group import group_config
from capwatch.backends import spec_of
from capwatch.backends.deepep import DeepEPBuffer
from capwatch.backends.flashinfer import WorkspacePricing
from capwatch.backends.deepep import RULES as DEEPEP
from capwatch.backends.flashinfer import RULES as FLASHINFER
from capwatch.sglang_engine.limits import SGLangLimits

from tests.support.checkout import PRODUCT_FOLDERS, REPO_ROOT

PRICING = WorkspacePricing(8, 7168, 14336)


def test_each_term_is_the_largest_over_the_ranks():
    small = SGLangLimits(max_prefill_buffer_tokens=4096, decode_cuda_graph_max_batch_size=64, tokens_per_request=2)
    large = SGLangLimits(max_prefill_buffer_tokens=8192, decode_cuda_graph_max_batch_size=32, tokens_per_request=1)
    group = group_config(cap=1024, pricing=PRICING, a2a_backend=FLASHINFER.name, engine_limits=[small, None, large],
                         cuda_graph_max_batch_sizes=[None, 160, 96], speculative_tokens=[0, 3, 1],
                         kv_bytes_per_token=70_272)
    assert (group.cap, group.pricing, group.backend, group.kv_bytes_per_token) == (1024, PRICING, FLASHINFER, 70_272)
    assert (group.cuda_graph_max_batch_size, group.speculative_tokens) == (160, 3)
    assert (group.engine_limits.max_prefill_buffer_tokens, group.engine_limits.decode_cuda_graph_max_batch_size,
            group.engine_limits.tokens_per_request) == (8192, 64, 2)


def test_nothing_known_of_the_ranks_leaves_the_terms_unknown():
    group = group_config(cap=512, pricing=PRICING, a2a_backend=FLASHINFER, engine_limits=[None],
                         cuda_graph_max_batch_sizes=[None])
    assert (group.engine_limits, group.cuda_graph_max_batch_size, group.speculative_tokens) == (None, None, 0)


@pytest.mark.parametrize("backend, mode, through_cap", [
    (FLASHINFER.name, None, True), (DEEPEP.name, "low_latency", True), (DEEPEP.name, "auto", False)])
def test_prefill_goes_through_the_cap_by_the_backends_mode(backend, mode, through_cap):
    spec = spec_of(backend)
    params = None if mode is None else DeepEPBuffer(mode=mode, buffer_experts=256)
    group = group_config(cap=256, pricing=PRICING, a2a_backend=backend,
                         prefill_dispatched=spec.prefill_dispatched(params))
    assert group.prefill_dispatched is through_cap and group.backend.name == backend


def test_no_product_module_builds_a_group_config_of_its_own():
    """The service (service/queries.py) and the log reader (sglang_logs/advise.py) once built theirs apart."""
    builders = []
    for folder in PRODUCT_FOLDERS:
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            if path == REPO_ROOT / "advisor" / "group.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == \
                        "GroupConfig":
                    builders.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    assert not builders, "GroupConfig built outside advisor/group.py (call group_config):\n" + "\n".join(builders)
