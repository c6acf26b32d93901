"""What each rank process runs for the multi-rank tests: many scenarios in one process group,
results returned to the parent, which asserts (so failures read as pytest diffs)."""

from __future__ import annotations

import dataclasses
import sys

import torch
from capwatch.dispatcher.backend import DispatchPairingError
from capwatch.dispatcher.counters import DispatchCounters
from capwatch.dispatcher.instrumented import CapOverflowError, InstrumentedDispatcher
from capwatch.dispatcher.torch_backend import TorchA2ABackend

from tests.support.host_reads import HostReadError, forbid_host_reads

from .moe import INVALID_EXPERT_ID, MoECase, expert_fn, make_inputs


def _local(case: MoECase, rank: int):
    inputs = make_inputs(case)
    ids, x, weights = inputs.experts[rank], inputs.hidden_states[rank], inputs.router_weights[rank]
    return inputs, ids, [x, ids, weights]


def _broken_hook(event) -> None:
    raise RuntimeError("reporter is down")


def _dispatcher(case: MoECase, cap: int, policy: str = "raise", role: str = "target", events=None):
    backend = TorchA2ABackend(case.num_experts, case.top_k)
    counters = DispatchCounters(cap, case.ep_size, role=role)
    # A hook that fails must neither stop the one after it nor replace the overflow error.
    hooks = [_broken_hook, events.append] if events is not None else []
    return InstrumentedDispatcher(backend, counters, cap, overflow_policy=policy, on_overflow=hooks)


def _snapshot(dispatcher: InstrumentedDispatcher) -> dict:
    return dataclasses.asdict(dispatcher.counters.snapshot())


def moe_step(rank: int, case: MoECase, cap: int, policy: str = "raise") -> dict:
    """One full MoE communication step; also a bare dispatch to look at the received rows."""
    inputs, ids, payloads = _local(case, rank)
    dispatcher = _dispatcher(case, cap, policy)
    rows = case.runtime_max_tokens_per_rank
    output = dispatcher.run(ids, payloads, rows, expert_fn(rank, case, inputs.expert_weights),
                            invalid_token_expert_id=INVALID_EXPERT_ID, expert_id_payload_index=1)
    result = {"output": output, "counters": _snapshot(dispatcher)}
    if rows <= cap:
        received = dispatcher.backend.dispatch(ids, payloads, rows, INVALID_EXPERT_ID, 1)
        result["received_hidden"] = received[0].clone()
        result["received_ids"] = received[1].clone()
        result["send_counts"] = dispatcher.backend.send_counts.clone()
        result["recv_counts"] = dispatcher.backend.recv_counts.clone()
        dispatcher.backend.combine(torch.zeros(case.ep_size, rows, case.hidden, dtype=case.dtype), rows)
    return result


def overflow_raise(rank: int, case: MoECase, cap: int, runtime_tokens: int) -> dict:
    """A guard that must raise on every rank before any collective, counted and announced."""
    inputs, ids, payloads = _local(case, rank)
    events = []
    dispatcher = _dispatcher(case, cap, "raise", events=events)
    try:
        dispatcher.run(ids, payloads, runtime_tokens, expert_fn(rank, case, inputs.expert_weights))
        message, notes = None, []
    except CapOverflowError as error:
        message = str(error)
        notes = getattr(error, "__notes__", [])
    # Nothing was sent, so the group and the backend are still usable.
    rows = case.runtime_max_tokens_per_rank
    ok_dispatcher = _dispatcher(case, max(cap, rows))
    after = ok_dispatcher.run(ids, payloads, rows, expert_fn(rank, case, inputs.expert_weights), INVALID_EXPERT_ID, 1)
    return {
        "message": message,
        "notes": notes,
        "counters": _snapshot(dispatcher),
        "events": [dataclasses.asdict(event) for event in events],
        "output_after": after,
        "optimize_flag": sys.flags.optimize,
    }


def pairing(rank: int, case: MoECase) -> dict:
    _, ids, payloads = _local(case, rank)
    backend = TorchA2ABackend(case.num_experts, case.top_k)
    rows = case.runtime_max_tokens_per_rank
    errors = {}
    try:
        backend.combine(torch.zeros(case.ep_size, rows, case.hidden), rows)
    except DispatchPairingError as error:
        errors["combine_first"] = str(error)
    backend.dispatch(ids, payloads, rows)
    try:
        backend.dispatch(ids, payloads, rows)
    except DispatchPairingError as error:
        errors["dispatch_twice"] = str(error)
    backend.combine(torch.zeros(case.ep_size, rows, case.hidden, dtype=case.dtype), rows)
    return errors


def shared_layers(rank: int, case: MoECase, num_layers: int, steps: int) -> dict:
    """Layers share one counters object; only layer 0 records steps. A draft keeps its own."""
    inputs, ids, payloads = _local(case, rank)
    rows = case.runtime_max_tokens_per_rank
    backend = TorchA2ABackend(case.num_experts, case.top_k)
    counters = DispatchCounters(rows, case.ep_size)
    layers = [InstrumentedDispatcher(backend, counters, rows, step_leader=(layer == 0)) for layer in range(num_layers)]
    draft = InstrumentedDispatcher(backend, DispatchCounters(rows, case.ep_size, role="draft"), rows)
    compute = expert_fn(rank, case, inputs.expert_weights)
    for _ in range(steps):
        draft.run(ids, payloads, rows, compute, INVALID_EXPERT_ID, 1)
        for layer in layers:
            layer.run(ids, payloads, rows, compute, INVALID_EXPERT_ID, 1)
    return {"target": dataclasses.asdict(counters.snapshot()), "draft": dataclasses.asdict(draft.counters.snapshot())}


def overflowing_layers(rank: int, case: MoECase, cap: int, num_layers: int, steps: int) -> dict:
    """Layers sharing counters overflow the cap every step: counted once per step, not per layer."""
    inputs, ids, payloads = _local(case, rank)
    rows = case.runtime_max_tokens_per_rank
    backend = TorchA2ABackend(case.num_experts, case.top_k)
    compute = expert_fn(rank, case, inputs.expert_weights)
    result = {}
    for policy in ("chunk", "raise"):
        counters, events = DispatchCounters(cap, case.ep_size), []
        layers = [InstrumentedDispatcher(backend, counters, cap, overflow_policy=policy, step_leader=(layer == 0),
                                         on_overflow=[events.append]) for layer in range(num_layers)]
        outputs, raised = [], 0
        for _ in range(steps):
            try:
                for layer in layers:
                    outputs.append(layer.run(ids, payloads, rows, compute, INVALID_EXPERT_ID, 1))
            except CapOverflowError:
                raised += 1  # a raise ends the step
        if policy == "raise":  # a layer other than the leader raising on its own still counts, once
            try:
                layers[-1].run(ids, payloads, rows, compute)
            except CapOverflowError:
                raised += 1
        result[policy] = {"counters": dataclasses.asdict(counters.snapshot()), "events": len(events),
                          "raised": raised, "outputs": outputs}
    return result


def bare_backend_more_tokens_than_rows(rank: int, case: MoECase) -> dict:
    """A bare backend refuses T > R before any collective, and stays usable."""
    _, ids, payloads = _local(case, rank)
    backend = TorchA2ABackend(case.num_experts, case.top_k)
    rows = ids.shape[0]
    try:
        backend.dispatch(ids, payloads, rows - 1)
        message = None
    except ValueError as error:
        message = str(error)
    received = backend.dispatch(ids, payloads, rows)
    backend.combine(torch.zeros(case.ep_size, rows, case.hidden, dtype=case.dtype), rows)
    return {"message": message, "received_rows": received[0].shape[1]}


def hot_path_without_host_reads(rank: int, case: MoECase, cap: int) -> str | None:
    """The instrumented step, plain and chunked, with every Tensor host read made to raise."""
    inputs, ids, payloads = _local(case, rank)
    rows = case.runtime_max_tokens_per_rank
    compute = expert_fn(rank, case, inputs.expert_weights)
    plain, chunked = _dispatcher(case, max(cap, rows)), _dispatcher(case, cap, "chunk")
    try:
        with forbid_host_reads():
            plain.run(ids, payloads, rows, compute, INVALID_EXPERT_ID, 1)
            chunked.run(ids, payloads, rows, compute, INVALID_EXPERT_ID, 1)
    except HostReadError as error:
        return f"{type(error).__name__}: {error}"
    return None


def run_all(rank: int, world_size: int, plan: dict) -> dict:
    """Run every scenario named in ``plan`` ({name: (function name, args)}) in order."""
    import torch.distributed as dist

    functions = {f.__name__: f for f in (moe_step, overflow_raise, pairing, shared_layers, overflowing_layers,
                                         bare_backend_more_tokens_than_rows, hot_path_without_host_reads)}
    results = {name: functions[function](rank, *args) for name, (function, args) in plan.items()}
    results["group"] = (dist.get_rank(), dist.get_world_size())
    return results
