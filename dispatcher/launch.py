"""Spawn N local rank processes in one torch.distributed group and collect what each returns.

Used by the tests, the benchmarks and ``capwatch demo``::

    results = spawn_ranks(4, my_fn, arg1, arg2)   # my_fn(rank, world_size, arg1, arg2) -> picklable

The rendezvous is a ``TCPStore`` the parent opens on 127.0.0.1 with port 0 (the OS picks a free
port, so concurrent runs never collide); children join it as clients. ``fn`` must be importable
by module path (spawned children re-import it). A child's exception comes back as
:class:`RankFailedError` carrying the child's traceback; a child that dies without reporting
(segfault, ``os._exit``) is reported with its exit code; a run past ``timeout_s`` kills every
child and raises :class:`TimeoutError`.
"""

from __future__ import annotations

import pickle
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

LOOPBACK = "127.0.0.1"


class RankFailedError(RuntimeError):
    def __init__(self, rank: int, detail: str, exitcode: int | None = None):
        where = f"rank {rank}" + (f" (exit code {exitcode})" if exitcode is not None else "")
        super().__init__(f"{where} failed:\n{detail}")
        self.rank = rank
        self.detail = detail
        self.exitcode = exitcode


def _child(rank: int, world_size: int, port: int, backend: str, threads: int, results, fn, args) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    try:
        store = dist.TCPStore(LOOPBACK, port, world_size + 1, is_master=False)
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
        try:
            value = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        # Plain pickle: tensors travel by value, not as shared-memory handles that die with us.
        results.put((rank, "ok", pickle.dumps(value)))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
        raise SystemExit(1)


def spawn_ranks(
    world_size: int,
    fn: Callable[..., Any],
    *args: Any,
    backend: str = "gloo",
    timeout_s: float = 120.0,
    threads_per_rank: int = 1,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` processes; return results by rank."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if world_size <= 0:
        raise ValueError(f"world_size must be positive, got {world_size}")
    context = mp.get_context("spawn")
    # The parent holds the store: world_size clients + itself.
    store = dist.TCPStore(LOOPBACK, 0, world_size + 1, is_master=True, wait_for_workers=False)
    results = context.Queue()
    processes = [
        context.Process(
            target=_child, args=(rank, world_size, store.port, backend, threads_per_rank, results, fn, args),
            name=f"capwatch-rank-{rank}", daemon=True,
        )
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    collected: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(collected) < world_size:
            dead = [rank for rank, process in enumerate(processes)
                    if rank not in collected and process.exitcode not in (None, 0)]
            try:
                # After a death, wait a little longer: the child's own report is the better message.
                rank, status, payload = results.get(timeout=1.0 if dead else 0.2)
            except queue.Empty:
                if dead:
                    raise RankFailedError(dead[0], "exited without reporting a result", processes[dead[0]].exitcode)
                if time.monotonic() > deadline:
                    missing = sorted(set(range(world_size)) - set(collected))
                    raise TimeoutError(f"ranks {missing} of {world_size} did not finish within {timeout_s:.0f} s")
                continue
            if status == "error":
                raise RankFailedError(rank, payload)
            collected[rank] = pickle.loads(payload)
        for process in processes:
            process.join(timeout=max(1.0, deadline - time.monotonic()))
        return [collected[rank] for rank in range(world_size)]
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
        results.close()
        del store
