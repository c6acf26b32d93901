"""The smallest cap a deployment can run with: CUDA-graph decode replays a batch of up to the
largest captured size, and each request brings (1 + speculative draft tokens) tokens per step.
Below it the first full decode batch overflows, however quiet the traffic was."""

from __future__ import annotations

from capwatch.service.advisor.stage import Stage


def floor_tokens(cuda_graph_max_batch_size: int | None, speculative_tokens: int = 0) -> int | None:
    if cuda_graph_max_batch_size is None:
        return None
    return cuda_graph_max_batch_size * (1 + speculative_tokens)


def raise_to_floor(tokens: float, floor_cap: int | None, cuda_graph_max_batch_size: int | None,
                   speculative_tokens: int) -> Stage:
    if floor_cap is None or tokens >= floor_cap:
        return Stage("floor", tokens)
    return Stage("floor", floor_cap, (f"raised to the floor {floor_cap}: the largest CUDA-graph decode batch "
                                      f"{cuda_graph_max_batch_size} x (1 + {speculative_tokens} speculative tokens)",))
