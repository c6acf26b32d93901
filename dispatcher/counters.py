"""Cumulative counters of one rank's A2A dispatcher: on the host what the host knows, on the device
what only the device knows or what a CUDA graph replays.

A step's R and local batch are host ints: an eager step counts them in a host array (no kernel, a
few hundred ns). Under CUDA graph capture the same counts are in-place tensor ops on fixed-shape
views of one device state, captured with the dispatch and replayed with it. The tokens sent and
received are device values (FlashInfer's counter words, DeepEP's layout): an in-place ``add_`` into
the device state, never read back on the hot path. ``snapshot()`` adds the host array and one host
copy of the device state, taken by the telemetry layer off the hot path: on CUDA a non-blocking copy
into a pinned buffer on a side stream, waited on with an event (no device-wide sync). While the
engine captures a CUDA graph, no other thread may touch the device that way, so the capture code
wraps itself in :func:`pause_snapshots` and snapshots return the latest one taken before.

One ``DispatchCounters`` serves all MoE layers of one rank and role: only the step leader (the first layer)
calls ``record_step``, so a forward step is counted once however many layers share the counters; every layer's
dispatch is a call (a host int eagerly; under capture the role's ``layers_per_step`` per captured step, no op per
layer), and the layers of the traffic sample add their per-rank counts (``dispatcher/counting.py`` elects them;
docs/dispatcher.md, "Counting a GPU does not notice"). A speculative draft model keeps its own instance with
``role="draft"``.
"""

from __future__ import annotations

import array
import contextlib
import itertools
import operator
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum

import torch

from capwatch.vocabulary import OVERFLOW_KINDS, OVERFLOW_OUTCOMES, ROLES


class Field(IntEnum):
    """Slots of the flat int64 counter vector (one clone copies them all at once). Internal: the
    snapshot names every value; the order here is no interface. Forward steps and the sum of R are
    no slots: the snapshot reads them off the R histogram (every step adds 1 to one bin), plus the
    exact R of the steps above the cap."""

    RUNTIME_TOKENS_OVER_CAP_SUM = 0  # sum of R over the steps with R > cap (the histogram's last bin is not exact)
    MAX_RUNTIME_TOKENS = 1  # the largest R above the cap (at or below it, the highest non-empty bin says it)
    OVERFLOW_RUNTIME_OVER_CAP_RAISED = 2
    OVERFLOW_RUNTIME_OVER_CAP_CHUNKED = 3
    OVERFLOW_LOCAL_OVER_RUNTIME_RAISED = 4
    # Never counted (local > R always raises), kept so the overflow table has every (kind, outcome).
    OVERFLOW_LOCAL_OVER_RUNTIME_CHUNKED = 5
    CHUNKED_ROUNDS = 6
    MAX_LOCAL_TOKENS = 7  # this rank's own largest local batch (tokens it dispatched in one step) above the cap
    # Counted on the host only: eager calls one by one; captured ones are the captured steps x layers_per_step.
    DISPATCH_CALLS = 8


def overflow_field(kind: str, outcome: str) -> Field:
    if kind not in OVERFLOW_KINDS or outcome not in OVERFLOW_OUTCOMES:
        raise ValueError(f"unknown overflow ({kind!r}, {outcome!r}); kinds {OVERFLOW_KINDS}, outcomes {OVERFLOW_OUTCOMES}")
    return Field[f"OVERFLOW_{kind.upper()}_{outcome.upper()}"]


@dataclass(frozen=True)
class CounterSnapshot:
    """Host copy of the counters at one moment. Histogram bin r < cap+1 counts steps with
    R == r exactly; the last bin (index cap + 1) counts steps with R > cap."""

    cap: int
    ep_size: int
    role: str
    taken_at: float  # unix seconds
    dispatch_calls: int
    forward_steps: int
    tokens_sent: int
    tokens_received: int
    max_runtime_tokens: int
    chunked_rounds: int
    overflow_events: dict[tuple[str, str], int]  # (kind, outcome) -> count
    runtime_tokens_histogram: tuple[int, ...]  # length cap + 2
    tokens_sent_per_rank: tuple[int, ...]  # to each target rank
    tokens_received_per_rank: tuple[int, ...]  # from each source rank
    # Sum of R over all forward steps, exact for R > cap too: the histogram's _sum. Last, with a
    # default, so that constructors written before it keep working.
    runtime_tokens_sum: int = 0
    # This rank's own local batch per step (the tokens it dispatched, not the group's R), binned like
    # the R histogram (last bin: above the cap), and its running max. Empty when steps were recorded
    # without their local batch.
    local_tokens_histogram: tuple[int, ...] = ()
    max_local_tokens: int = 0

    @property
    def overflow_events_total(self) -> int:
        return sum(self.overflow_events.values())


class DispatchCounters:
    """The counters live in one flat int64 device tensor (one host copy per snapshot) and one int64 host array of
    the same layout; the snapshot adds the two. One writer at a time (the engine's thread), as for the device state;
    a snapshot may land between two of its updates, as between two kernels, and the next one catches up. Per-op
    launch cost, not arithmetic, is what a call pays (a few us each on CPU, a kernel launch each on GPU; a graph
    node each when captured), so a call launches only what the host cannot count. An eager step launches nothing:
    its R and local batch are host ints; an eager call is a host int. A sampled dispatch's send/receive counts are
    device values: one ``add_`` of a :class:`TrafficRecord`'s counts, or of FlashInfer's int32 counter words
    (:meth:`record_counter_words`) on CUDA (the kernel casts as it reads); on CPU those are first ``copy_``-ed into
    the int64 record: a mixed-dtype ``add_`` there converts its operand into a new tensor, an allocation per call.

    Under CUDA graph capture nothing on the host runs at replay, so the step goes to the device: **one** ``add_``
    on a two-element view of the state (its R bin and its local-batch bin; plus an ``add_`` and a ``clamp_`` on a
    step above the cap, a ``clamp_`` on a local batch above it). A captured dispatch launches nothing but its
    traffic's one ``add_`` (sampled layers only): its call is counted at snapshot time as ``layers_per_step`` per
    captured step (every MoE layer of the role dispatches once per forward step; the session sets it from the
    role's layers, default 1). No per-call op takes an index: ``index_add_`` copies a strided index, an allocation
    per call. The maxes at or below the cap are the highest non-empty histogram bins; above it the exact value is
    kept. The snapshot's token totals are the sums of the per-rank counts.

    A backend whose counts are per expert (DeepEP's routing, its layout range) adds them as they are into the
    counters' :class:`ExpertTraffic` (:meth:`expert_traffic`): one op per call, folded per rank by the snapshot."""

    def __init__(self, cap: int, ep_size: int, device: torch.device | str | None = None, role: str = "target"):
        if isinstance(cap, bool) or not isinstance(cap, int) or isinstance(ep_size, bool) \
                or not isinstance(ep_size, int) or cap <= 0 or ep_size <= 0:
            raise ValueError(f"cap and ep_size must be positive integers, got cap={cap!r}, ep_size={ep_size!r}")
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        self.cap = cap
        self.ep_size = ep_size
        self.role = role
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        options = dict(dtype=torch.int64, device=self.device)
        num_fields = len(Field)
        sent_offset = num_fields
        received_offset = sent_offset + ep_size
        histogram_offset = received_offset + ep_size
        local_offset = histogram_offset + cap + 2
        self._state = torch.zeros(local_offset + cap + 2, **options)
        # No public views of the device state: eager counts are on the host; snapshot() has them all.
        self._values = self._state[:num_fields]
        self._max_runtime_tokens = self._state[Field.MAX_RUNTIME_TOKENS : Field.MAX_RUNTIME_TOKENS + 1]
        self._max_local_tokens = self._state[Field.MAX_LOCAL_TOKENS : Field.MAX_LOCAL_TOKENS + 1]
        self._histogram_offset = histogram_offset
        self._local_offset = local_offset

        self._traffic = self._state[sent_offset:histogram_offset].view(2, ep_size)
        # Calls per captured step: the MoE layers of the role (one dispatch each per forward step). Set before the
        # first capture by whoever knows the layers (the session's election); a snapshot multiplies the captured
        # steps by it.
        self.layers_per_step = 1
        self.instrumented_layers = 0  # InstrumentedDispatchers built on these counters: a library's layers
        self._runtime_tokens_over_cap_sum = self._values[Field.RUNTIME_TOKENS_OVER_CAP_SUM :
                                                         Field.RUNTIME_TOKENS_OVER_CAP_SUM + 1]
        self._steps = _StepBins(self._state, cap, histogram_offset, local_offset, options)
        # Written by the engine's thread only; a snapshot copies it whole (a memcpy under the GIL) and adds it to
        # the device copy in one op: an int64 array, not a list, whose element-wise sum in Python took 1-3 ms.
        self._host_state = array.array("q", bytes(8 * self._state.numel()))
        # Whether a call right now is eager (counted on the host) rather than captured into a CUDA graph. The
        # engine's thread asks for its current stream on its current device: the counters' device (one GPU per
        # scheduler process) and the stream it captures on. Asking on the legacy default stream is safe because
        # graphs are captured on torch's non-blocking streams; torch's own CUDA RNG asks the same on every
        # random op. Tests swap it to drive the device path.
        self._eager = _always if self.device.type != "cuda" else _not_capturing
        self._words_direct = self.device.type == "cuda"  # int32 words added into int64 without a temporary

        # Snapshots: one host copy at a time; pause_snapshots() waits for it and holds new ones off.
        self.snapshot_poll_s = SNAPSHOT_POLL_S
        self._snapshot_lock = threading.Lock()
        self._expert_traffic: ExpertTraffic | None = None  # made by expert_traffic(), before any capture
        self._snapshots_paused = 0
        self._last_snapshot = self._snapshot_from([0] * self._state.numel())  # the state starts at zero
        if self.device.type == "cuda":
            # Made here, before any capture: allocating pinned memory or a stream later, from the
            # telemetry thread, could land in the middle of the engine's graph capture.
            self._host_copy = torch.empty(self._state.numel(), dtype=torch.int64, pin_memory=True)
            self._copy_stream = torch.cuda.Stream(self.device)
            self._copy_done = torch.cuda.Event()

    # --- hot path: in-place, fixed shapes, no host reads ------------------------------------

    def record_step(self, runtime_tokens: int, local_tokens: int | None = None) -> None:
        """One forward step whose dispatches ran with runtime_max_tokens_per_rank R and this rank's
        local batch of ``local_tokens`` (a host int: the token tensor's shape, never a device read)."""
        cap = self.cap
        runtime_bin = runtime_tokens if runtime_tokens <= cap else cap + 1
        local_bin = None if local_tokens is None else local_tokens if local_tokens <= cap else cap + 1
        if self._eager():
            host = self._host_state
            host[self._histogram_offset + runtime_bin] += 1
            if local_bin is not None:
                host[self._local_offset + local_bin] += 1
                if local_bin > cap and local_tokens > host[Field.MAX_LOCAL_TOKENS]:
                    host[Field.MAX_LOCAL_TOKENS] = local_tokens
            if runtime_bin > cap:  # the histogram's last bin says only "> cap": keep the exact R
                host[Field.RUNTIME_TOKENS_OVER_CAP_SUM] += runtime_tokens
                if runtime_tokens > host[Field.MAX_RUNTIME_TOKENS]:
                    host[Field.MAX_RUNTIME_TOKENS] = runtime_tokens
            return
        steps = self._steps
        if local_bin is None:
            steps.without_local(runtime_bin).add_(steps.one)
        else:
            steps.of(runtime_bin, local_bin).add_(steps.ones)
            if local_bin > cap:
                self._max_local_tokens.clamp_(min=local_tokens)
        if runtime_bin > cap:
            self._runtime_tokens_over_cap_sum.add_(runtime_tokens)
            self._max_runtime_tokens.clamp_(min=runtime_tokens)

    def record_call(self) -> None:
        """One dispatch call whose traffic is not counted (a layer outside the traffic sample): a host int eagerly;
        nothing when captured (the captured steps count their calls)."""
        if self._eager():
            self._host_state[Field.DISPATCH_CALLS] += 1

    def record_dispatch(self, send_counts: torch.Tensor, recv_counts: torch.Tensor) -> None:
        """One dispatch call: tokens this rank sent to / received from each rank ([ep_size])."""
        if self._eager():
            self._host_state[Field.DISPATCH_CALLS] += 1
        self._traffic[0].add_(send_counts)
        self._traffic[1].add_(recv_counts)

    def traffic_record(self) -> "TrafficRecord":
        """A dispatch's record for :meth:`record_traffic`, on the counters' device (make it before any capture)."""
        return TrafficRecord(self.ep_size, self.device)

    def record_traffic(self, record: "TrafficRecord") -> None:
        """One dispatch call and its tokens sent to and received from each rank (``record.counts``, written by the
        caller since its dispatch): one ``add_``, eager or captured (the call a host int, eagerly)."""
        if self._eager():
            self._host_state[Field.DISPATCH_CALLS] += 1
        self._traffic.add_(record.counts)

    def record_counter_words(self, record: "TrafficRecord", counter_words: torch.Tensor) -> None:
        """One dispatch call and its counts as FlashInfer's workspace holds them after it: int32 words
        (``[2, ep_size]``: sent, received; or a backend's own int64 counts), valid until the next dispatch. On CUDA,
        eager or captured, one ``add_`` of the words (the kernel casts as it reads). On CPU a ``copy_`` into the
        int64 ``record`` and one ``add_`` of it: a mixed-dtype ``add_`` there converts its operand into a new tensor
        first. The call is a host int, eagerly."""
        if self._eager():
            self._host_state[Field.DISPATCH_CALLS] += 1
        if self._words_direct:
            self._traffic.add_(counter_words)
        else:
            record.counts.copy_(counter_words)
            self._traffic.add_(record.counts)

    def _capturing(self) -> bool:
        """Whether the calling thread's current stream is capturing a CUDA graph, asked safely from any thread
        (the telemetry's). The hot path asks the cheaper ``_not_capturing`` from the engine's own thread."""
        if self.device.type != "cuda":
            return False
        with torch.cuda.device(self.device):
            # Graphs are never captured on the default stream, and asking the legacy default stream
            # while another thread captures in global mode would itself break that capture.
            if torch.cuda.current_stream() == torch.cuda.default_stream():
                return False
            return torch.cuda.is_current_stream_capturing()

    def record_overflow(self, kind: str, outcome: str, chunked_rounds: int = 0) -> None:
        self._values[overflow_field(kind, outcome)].add_(1)
        if chunked_rounds:
            self._values[Field.CHUNKED_ROUNDS].add_(chunked_rounds)

    # --- off the hot path ---------------------------------------------------------------------

    def snapshot(self) -> CounterSnapshot:
        """Host copy of the counters, from any thread.

        While snapshots are paused (:meth:`pause_snapshots`), or when the calling thread's own
        stream is capturing a graph, nothing touches the device: the latest snapshot taken
        before is returned (its ``taken_at`` tells its age). On CUDA the copy runs on a side
        stream and does not wait for queued steps: a snapshot may land between two kernels of
        one step (every value only grows; the next snapshot catches up).
        """
        with self._snapshot_lock:
            if self._snapshots_paused or self._capturing():
                return self._last_snapshot
            self._last_snapshot = self._snapshot_from(self._counts())
            return self._last_snapshot

    @contextlib.contextmanager
    def pause_snapshots(self) -> Iterator[None]:
        """Hold device copies off for the block (wrap CUDA graph capture in it).

        Entering waits for a copy in flight, then refreshes the snapshot that paused callers get.
        """
        with self._snapshot_lock:
            if not self._snapshots_paused and not self._capturing():
                self._last_snapshot = self._snapshot_from(self._counts())
            self._snapshots_paused += 1
        try:
            yield
        finally:
            with self._snapshot_lock:
                self._snapshots_paused -= 1

    def expert_traffic(self, num_experts: int) -> "ExpertTraffic":
        """The counters' per-expert traffic bins (:class:`ExpertTraffic`) for a model of ``num_experts`` routed
        experts, made by the first call (make them at adoption, before any graph capture: this allocates) and the
        same bins after it; each snapshot folds them into the per-rank counts."""
        with self._snapshot_lock:
            if self._expert_traffic is None:
                self._expert_traffic = ExpertTraffic(self.ep_size, num_experts, self.device)
            elif self._expert_traffic.num_experts != num_experts:
                raise ValueError(f"these counters' expert bins are for {self._expert_traffic.num_experts} experts, "
                                 f"not {num_experts}")
            return self._expert_traffic

    def _counts(self) -> list[int]:
        """The device state plus the host's, slot by slot; the maxes above the cap take the larger; the expert
        bins folded into the per-rank counts."""
        host = self._host_state[:]  # both only grow: a snapshot between two updates is caught up by the next
        device, experts = self._copy_to_host()
        maxes = {field: max(int(device[field]), host[field])
                 for field in (Field.MAX_RUNTIME_TOKENS, Field.MAX_LOCAL_TOKENS)}
        captured_steps = int(device[self._histogram_offset : self._local_offset].sum())  # only captured steps are there
        counts = device.add_(torch.frombuffer(host, dtype=torch.int64)).tolist()
        for field, value in maxes.items():
            counts[field] = value
        counts[Field.DISPATCH_CALLS] += captured_steps * self.layers_per_step
        if experts is not None:
            sent, received = self._expert_traffic.per_rank(experts)
            for rank in range(self.ep_size):
                counts[len(Field) + rank] += sent[rank]
                counts[len(Field) + self.ep_size + rank] += received[rank]
        return counts

    def _copy_to_host(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The device state and the expert bins (None: none made), copied into host memory this snapshot owns
        until the next."""
        bins = self._expert_traffic.bins if self._expert_traffic is not None else None
        if self.device.type != "cuda":
            return self._state.clone(), None if bins is None else bins.clone()
        # Not .cpu(): that allocates, copies synchronously and may wait on the whole device.
        with torch.cuda.device(self.device), torch.cuda.stream(self._copy_stream):
            self._host_copy.copy_(self._state, non_blocking=True)
            if bins is not None:
                self._expert_traffic.host_copy.copy_(bins, non_blocking=True)
            self._copy_done.record(self._copy_stream)
        wait_without_the_gil(self._copy_done, self.snapshot_poll_s)  # this copy only
        return self._host_copy, None if bins is None else self._expert_traffic.host_copy

    def _snapshot_from(self, state: list[int]) -> CounterSnapshot:
        values = state[: len(Field)]
        sent = state[len(Field) : len(Field) + self.ep_size]
        received = state[len(Field) + self.ep_size : self._histogram_offset]
        histogram = state[self._histogram_offset : self._local_offset]
        local_histogram = state[self._local_offset :]
        return CounterSnapshot(
            cap=self.cap,
            ep_size=self.ep_size,
            role=self.role,
            taken_at=time.time(),
            dispatch_calls=values[Field.DISPATCH_CALLS],
            forward_steps=sum(histogram),
            tokens_sent=sum(sent),
            tokens_received=sum(received),
            max_runtime_tokens=max(values[Field.MAX_RUNTIME_TOKENS], _highest_bin(histogram[: self.cap + 1])),
            chunked_rounds=values[Field.CHUNKED_ROUNDS],
            overflow_events={
                (kind, outcome): values[overflow_field(kind, outcome)]
                for kind in OVERFLOW_KINDS
                for outcome in OVERFLOW_OUTCOMES
            },
            runtime_tokens_histogram=tuple(histogram),
            tokens_sent_per_rank=tuple(sent),
            tokens_received_per_rank=tuple(received),
            runtime_tokens_sum=sum(map(operator.mul, range(self.cap + 1), histogram[: self.cap + 1]))
            + values[Field.RUNTIME_TOKENS_OVER_CAP_SUM],
            local_tokens_histogram=tuple(local_histogram),
            max_local_tokens=max(values[Field.MAX_LOCAL_TOKENS], _highest_bin(local_histogram[: self.cap + 1])),
        )


SNAPSHOT_POLL_S = 50e-6  # how often a snapshot asks whether its copy is done (it sleeps between: no GIL held)


def wait_without_the_gil(event, poll_s: float = SNAPSHOT_POLL_S) -> None:
    """Wait for ``event`` (a CUDA event: ``query()``) without holding the GIL: ask, then sleep, until it is done.
    ``Event.synchronize()`` would block inside one C call, and whether it lets the GIL go while it waits is
    torch's choice; here the engine's thread never waits on a snapshot's copy, whatever the copy waits for."""
    while not event.query():
        time.sleep(poll_s)


def _always() -> bool:
    return True


def _not_capturing() -> bool:
    """The hot path's question (``DispatchCounters._eager`` on CUDA): one call, no stream objects; see where it is
    bound for why the engine's thread may ask it without ``_capturing``'s guards."""
    return not torch.cuda.is_current_stream_capturing()


def _highest_bin(histogram: list[int]) -> int:
    """The largest value with a non-zero count (0 if none): the exact max of the steps at or below the cap."""
    return next(itertools.compress(reversed(range(len(histogram))), reversed(histogram)), 0)  # from the top, in C


class TrafficRecord:
    """What one sampled dispatch adds to its role's counters in one ``add_`` (:meth:`DispatchCounters.record_traffic`):
    ``counts``, ``[2, ep_size]`` int64 like the counters: the tokens sent to each rank, then those received from
    each. Made once per counted object, before any graph capture; at every dispatch written in place: a ``copy_``
    from FlashInfer's int32 counter words on CPU (which converts as it copies; on CUDA the words are added as they
    are, :meth:`DispatchCounters.record_counter_words`), or a backend's own counts (per-expert counts go into
    :class:`ExpertTraffic` instead)."""

    def __init__(self, ep_size: int, device: torch.device):
        self.counts = torch.zeros(2, ep_size, dtype=torch.int64, device=device)


class ExpertTraffic:
    """A role's traffic counted per expert, as a backend that routes (token, expert) pairs sees it, in one int64
    device tensor the snapshot copies beside the state and folds per rank (experts ``r x E/ranks`` to
    ``(r + 1) x E/ranks - 1`` live on rank r):

    - ``sent``, ``[num_experts + 1]``: the pairs sent to each expert; a pair without an expert (id -1) lands in the
      last bin, where ``put_`` wraps index -1, and counts for no rank. One ``put_(topk_ids, ones,
      accumulate=True)`` per call: the ids themselves are the index;
    - ``received``, ``[local experts, ep_size]``: the pairs each of this rank's experts received from each rank
      (DeepEP's layout range's count words, added as they are).

    Made once per counters (:meth:`DispatchCounters.expert_traffic`), before any graph capture."""

    def __init__(self, ep_size: int, num_experts: int, device: torch.device):
        if num_experts < ep_size or num_experts % ep_size:
            raise ValueError(f"{num_experts} experts do not divide among {ep_size} ranks")
        self.num_experts = num_experts
        self.experts_per_rank = num_experts // ep_size
        self.bins = torch.zeros(num_experts + 1 + num_experts, dtype=torch.int64, device=device)
        self.sent = self.bins[: num_experts + 1]
        self.received = self.bins[num_experts + 1 :].view(self.experts_per_rank, ep_size)
        self.host_copy = (torch.empty(self.bins.numel(), dtype=torch.int64, pin_memory=True)
                          if self.bins.device.type == "cuda" else None)

    def per_rank(self, bins: torch.Tensor) -> tuple[list[int], list[int]]:
        """A host copy of ``bins`` folded per rank: (pairs sent to each rank, pairs received from each)."""
        sent = bins[: self.num_experts].view(-1, self.experts_per_rank).sum(dim=1)
        received = bins[self.num_experts + 1 :].view(self.experts_per_rank, -1).sum(dim=0)
        return sent.tolist(), received.tolist()


class _StepBins:
    """Where one step's single ``add_`` of a constant ``[1, 1]`` lands: 1 at its R bin and 1 at its local-batch
    bin, a 2-element view of the state itself: no index tensor (``index_add_`` copies a strided index before it
    adds: an allocation per step on CPU), no host -> device copy: one kernel, the same when captured and at every
    replay. (An eager step is counted on the host and uses none of this.)

    The R histogram and the local one are adjacent in the state (``B = cap + 2`` bins each), so a view at
    offset ``r`` with stride ``B + l - r`` (always >= 1) lands on R's bin and the local batch's bin; a step
    without its local batch takes the 1-element view at ``r``. The views are kept (a view is a small host
    object, not device memory) up to ``MAX_KEPT_VIEWS`` (r, l) pairs; past that a step makes its view anew
    (a microsecond).
    """

    MAX_KEPT_VIEWS = 1 << 16

    def __init__(self, state: torch.Tensor, cap: int, histogram_offset: int, local_offset: int, options: dict):
        bins = cap + 2
        if local_offset != histogram_offset + bins:
            raise AssertionError("the local-batch histogram must follow the R histogram")
        self._bins = bins
        self._histogram = state[histogram_offset : histogram_offset + 2 * bins]
        self.ones = torch.ones(2, **options)
        self.one = self.ones[:1]
        self._kept: dict[int, torch.Tensor] = {}

    def of(self, runtime_bin: int, local_bin: int) -> torch.Tensor:
        key = runtime_bin * self._bins + local_bin
        bins = self._kept.get(key)
        if bins is None:
            histogram = self._histogram
            bins = histogram.as_strided((2,), (self._bins + local_bin - runtime_bin,),
                                        histogram.storage_offset() + runtime_bin)
            if len(self._kept) < self.MAX_KEPT_VIEWS:
                self._kept[key] = bins
        return bins

    def without_local(self, runtime_bin: int) -> torch.Tensor:
        return self._histogram[runtime_bin : runtime_bin + 1]


@contextlib.contextmanager
def pause_snapshots(*counters: DispatchCounters) -> Iterator[None]:
    """``DispatchCounters.pause_snapshots`` for several counters at once (target and draft)::

        with pause_snapshots(target_counters, draft_counters):
            capture_cuda_graphs()
    """
    with contextlib.ExitStack() as stack:
        for each in counters:
            stack.enter_context(each.pause_snapshots())
        yield
