"""Spawn N local rank processes in one torch.distributed group and collect what each returns.

Used by the tests, the benchmarks and ``capwatch demo``::

    results = spawn_ranks(4, my_fn, arg1, arg2)   # my_fn(rank, world_size, arg1, arg2) -> picklable

The rendezvous is a ``TCPStore`` the parent opens on 127.0.0.1 with port 0 (the OS picks a free
port, so concurrent runs never collide); children join it as clients. ``fn`` must be importable
by module path (spawned children re-import it). A run past ``timeout_s`` kills every child and
raises :class:`TimeoutError`.

When ranks fail, the error is the root cause, not whichever failure arrived first: one rank's
exception makes its peers fail too (gloo's "Connection closed by peer ... remote worker
crashing"), often sooner than the failing rank's own report arrives. So every rank's outcome
is collected (the survivors get a grace period, then are killed) and :class:`RankFailedError`
names the rank whose own code failed, in this order of blame:

1. a rank whose ``fn`` raised an exception of its own (not a lost connection to a peer);
2. a rank that died without reporting (segfault, ``os._exit``), with its exit code;
3. otherwise the first failure reported (a lost peer, a failed rendezvous).

The other ranks' failures are summarized in the message, one line each.
"""

from __future__ import annotations

import pickle
import queue
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

LOOPBACK = "127.0.0.1"
# How long the other ranks may take to report once one has failed (a peer of a dead rank notices
# the closed connection at once; one in a compute loop reaches its next collective soon after).
FAILURE_GRACE_S = 10.0
# Text of the errors a rank gets when a *peer* fails (gloo's tcp transport, c10d's store client).
PEER_FAILURE_MARKERS = (
    "Connection closed by peer", "Connection reset by peer", "remote worker", "Broken pipe",
    "Connection refused", "connectFullMesh failed",
)

FailureKind = Literal["raised", "peer", "died"]
BLAME_ORDER: tuple[FailureKind, ...] = ("raised", "died", "peer")


@dataclass(frozen=True)
class RankFailure:
    rank: int
    kind: FailureKind
    detail: str  # the rank's traceback, or what is known of its death
    exitcode: int | None = None

    @property
    def summary(self) -> str:
        last_line = self.detail.strip().splitlines()[-1] if self.detail.strip() else self.kind
        return f"rank {self.rank}: {last_line}"


class RankFailedError(RuntimeError):
    """The root-cause failure of a run: ``rank``, its own ``detail`` (traceback) and, for a rank
    that died without reporting, its ``exitcode``. ``others`` holds the rest of the failures."""

    def __init__(self, rank: int, detail: str, exitcode: int | None = None, others: tuple[RankFailure, ...] = ()):
        where = f"rank {rank}" + (f" (exit code {exitcode})" if exitcode is not None else "")
        message = f"{where} failed:\n{detail}"
        if others:
            message += "\nthen, as a consequence:\n" + "\n".join(f"  {other.summary}" for other in others)
        super().__init__(message)
        self.rank = rank
        self.detail = detail
        self.exitcode = exitcode
        self.others = others


def is_peer_failure(error: BaseException) -> bool:
    """Whether ``error`` is what a rank gets when another rank fails (a lost connection)."""
    import torch.distributed as dist

    text = str(error)
    return isinstance(error, dist.DistError) and not isinstance(error, dist.DistStoreError) \
        or any(marker in text for marker in PEER_FAILURE_MARKERS)


def _join_group(store, rank: int, world_size: int) -> None:
    """Return once every rank has joined the group. Without it a rank whose ``fn`` is quick can
    finish and exit while a peer's gloo ``connectFullMesh`` still reads from it: that peer then
    fails with "Connection closed by peer" before its own code ever runs. The keys live in the
    parent's store, which outlives every rank."""
    store.set(f"capwatch/joined/{rank}", "1")
    store.wait([f"capwatch/joined/{peer}" for peer in range(world_size)])


def _child(rank: int, world_size: int, port: int, backend: str, threads: int, results, fn, args) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    running_fn = False
    try:
        store = dist.TCPStore(LOOPBACK, port, world_size + 1, is_master=False)
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
        try:
            _join_group(store, rank, world_size)
            running_fn = True
            value = fn(rank, world_size, *args)
            running_fn = False
        finally:
            if dist.is_initialized():  # fn may have torn the group down itself
                dist.destroy_process_group()
        # Plain pickle: tensors travel by value, not as shared-memory handles that die with us.
        results.put((rank, "ok", pickle.dumps(value)))
    except BaseException as error:
        kind = "raised" if running_fn and not is_peer_failure(error) else "peer"
        results.put((rank, kind, traceback.format_exc()))
        raise SystemExit(1)


def root_cause(failures: list[RankFailure]) -> RankFailedError:
    """The failure to blame (see the module docstring), with the others as its consequences.
    ``failures`` is in the order they were noticed."""
    blamed = min(failures, key=lambda failure: BLAME_ORDER.index(failure.kind))
    others = tuple(failure for failure in failures if failure is not blamed)
    return RankFailedError(blamed.rank, blamed.detail, blamed.exitcode, others)


def spawn_ranks(
    world_size: int,
    fn: Callable[..., Any],
    *args: Any,
    backend: str = "gloo",
    timeout_s: float = 120.0,
    threads_per_rank: int = 1,
    failure_grace_s: float = FAILURE_GRACE_S,
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
    failures: list[RankFailure] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(collected) + len(failures) < world_size:
            settled = set(collected) | {failure.rank for failure in failures}
            dead = [rank for rank, process in enumerate(processes)
                    if rank not in settled and process.exitcode not in (None, 0)]
            try:
                # After a death, wait a little longer: the child's own report is the better message.
                rank, status, payload = results.get(timeout=1.0 if dead else 0.2)
            except queue.Empty:
                for rank in dead:
                    failures.append(RankFailure(rank, "died", "exited without reporting a result",
                                                processes[rank].exitcode))
                    deadline = min(deadline, time.monotonic() + failure_grace_s)
                if time.monotonic() > deadline:
                    if failures:
                        break
                    missing = sorted(set(range(world_size)) - set(collected))
                    raise TimeoutError(f"ranks {missing} of {world_size} did not finish within {timeout_s:.0f} s")
                continue
            if status == "ok":
                collected[rank] = pickle.loads(payload)
            else:
                failures.append(RankFailure(rank, status, payload))
                # Someone failed: the rest get a grace period to report their side, then are killed.
                deadline = min(deadline, time.monotonic() + failure_grace_s)
        if failures:
            raise root_cause(failures)
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
