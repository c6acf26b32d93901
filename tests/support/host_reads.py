"""``forbid_host_reads()``: make any device -> host read inside a block raise.

On a GPU, ``torch.cuda.set_sync_debug_mode("error")`` catches syncs; on CPU there is no sync to
catch, so this patches the Tensor methods that copy a value to the host (``item``, ``tolist``,
``cpu``, ``numpy``, and the implicit ``bool``/``int``/``float`` conversions that ``if tensor:``
or ``range(tensor)`` would make). A test wraps a hot path in it so that adding a host read fails.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


class HostReadError(AssertionError):
    pass


@contextlib.contextmanager
def forbid_host_reads() -> Iterator[None]:
    saved = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def forbidden(name: str):
        def read(self, *args, **kwargs):
            raise HostReadError(f"Tensor.{name}() on the hot path reads a device value back to the host")
        return read

    try:
        for name in HOST_READS:
            setattr(torch.Tensor, name, forbidden(name))
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)
