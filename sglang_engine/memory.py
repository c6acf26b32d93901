"""SGLang's memory reserve for a backend's buffer in the advice: the field ``/advice`` prices it in and the words
that say what to do where the recommended cap's buffer outgrows it.

SGLang's automatic ``--mem-fraction-static`` sets a flat share aside for some backends' buffers whatever the cap
(``caps.py``: DeepEP's 2048 MB, ``arg_groups/memory_hook.py``); beyond it the KV pool and CUDA-graph capture pay.
"""

from __future__ import annotations

from capwatch.sizing.byte_units import format_gib
from pydantic import BaseModel

GPU_MEMORY_EXAMPLES_GIB = (80, 141)  # two common GPUs' memory, worked out in the advice (H100, H200)


class ReservePrice(BaseModel):
    """SGLang's part of the advice's price (a base of ``capwatch.advisor.advice.Price``; ``/advice``'s JSON)."""

    # Bytes per rank beyond what SGLang's automatic memory fraction reserves for the backend's buffer (DeepEP's
    # flat 2048 MB); None where SGLang reserves nothing of its own for it.
    over_sglang_reserve_bytes_recommended: int | None = None

    @classmethod
    def of(cls, over_bytes: int | None) -> ReservePrice:
        return cls(over_sglang_reserve_bytes_recommended=over_bytes)


def over_reserve_text(reserve_bytes: int, over_bytes: int, mem_fraction_static: float | None) -> str:
    """What the advice says after "N more than": SGLang's reserve, why its shortfall matters, what to set."""
    return (f"the {format_gib(reserve_bytes)} SGLang's automatic --mem-fraction-static reserves for it whatever the "
            "cap (arg_groups/memory_hook.py), and without room for it the KV pool and CUDA-graph capture run short of "
            f"memory: {mem_fraction_to_set(over_bytes, mem_fraction_static)}")


def mem_fraction_to_set(over_bytes: int, current: float | None) -> str:
    """The --mem-fraction-static that leaves ``over_bytes`` per rank to the buffer: it is a share of the GPU's memory
    (G GiB), so the server's value less over / G; with the value and two common G worked out where the value is
    known."""
    over_gib = over_bytes / 2**30
    if current is None:
        return ("set --mem-fraction-static to the server's value (its server_args line shows it) less "
                f"{over_gib:.2f} / G, G the GPU's memory in GiB")
    worked = "; ".join(f"{current - over_gib / memory:.3f} where G = {memory}" if current > over_gib / memory else
                       f"nothing where G = {memory} (the buffer alone outgrows the static share)"
                       for memory in GPU_MEMORY_EXAMPLES_GIB)
    return f"set --mem-fraction-static to {current:g} - {over_gib:.2f} / G, G the GPU's memory in GiB: {worked}"
