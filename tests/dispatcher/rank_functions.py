"""Rank functions for the launcher tests and the ``python -O`` guard check (spawned children
import them by module path)."""

from __future__ import annotations

import json
import os
import sys


def fail_on_rank_one(rank: int, world_size: int) -> int:
    if rank == 1:
        raise ValueError("boom from rank one")
    return rank


def exit_without_reporting(rank: int, world_size: int) -> None:
    os._exit(7)


def peer_fails_first(rank: int, world_size: int) -> int:
    """Rank 1 breaks the group (rank 0, blocked in an all_reduce, fails at once with gloo's
    "Connection closed by peer") and only then raises its own error: the peer's failure is the
    first to arrive, the root cause is rank 1's."""
    import time

    import torch
    import torch.distributed as dist

    if rank == 1:
        dist.destroy_process_group()
        time.sleep(1.0)
        raise ValueError("the root cause, on rank one")
    dist.all_reduce(torch.ones(1))
    return rank


def crash_while_peer_waits(rank: int, world_size: int) -> int:
    """Rank 1 dies without a word while rank 0 waits for it in a collective."""
    import torch
    import torch.distributed as dist

    if rank == 1:
        os._exit(9)
    dist.all_reduce(torch.ones(1))
    return rank


def group_facts(rank: int, world_size: int, token: str) -> dict:
    import torch.distributed as dist

    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "token": token}


def main() -> None:
    """``python -O -m tests.dispatcher.rank_functions``: the guards with asserts stripped.

    One rank in this very process (a real gloo group of one): every torch import under -O
    compiles from source, so spawning more would only cost time; multi-rank guards are covered
    by test_multirank."""
    import torch.distributed as dist

    from .moe import MoECase

    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        result = _overflow_then_local(0, 1, MoECase(5, (6,), 5, 3, 8))
    finally:
        dist.destroy_process_group()
    print(json.dumps({"parent_optimize": sys.flags.optimize, "ranks": [result]}))


def _overflow_then_local(rank: int, world_size: int, case) -> dict:
    from .moe import MoECase
    from .scenarios import overflow_raise

    over_cap = overflow_raise(rank, case, 4, 6)
    uniform = MoECase(case.seed, (3,) * world_size, case.num_experts, case.top_k, case.hidden)
    local = overflow_raise(rank, uniform, 16, 2)
    return {
        "optimize": over_cap["optimize_flag"],
        "over_cap_message": over_cap["message"],
        "over_cap_counted": over_cap["counters"]["overflow_events"][("runtime_over_cap", "raised")],
        "local_message": local["message"],
        "local_counted": local["counters"]["overflow_events"][("local_over_runtime", "raised")],
    }


if __name__ == "__main__":
    main()
