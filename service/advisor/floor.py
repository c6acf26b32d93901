"""The smallest cap a deployment can run with: CUDA-graph decode replays a batch of up to the
largest captured size, and each request brings (1 + speculative draft tokens) tokens per step.
Below it the first full decode batch overflows, however quiet the traffic was."""

from __future__ import annotations


def floor_tokens(cuda_graph_max_batch_size: int | None, speculative_tokens: int = 0) -> int | None:
    if cuda_graph_max_batch_size is None:
        return None
    return cuda_graph_max_batch_size * (1 + speculative_tokens)
