"""A FlashInfer workspace's send/receive counter words on CPU, viewed by the product's own ``WorkspaceCounts``
(the layout the plugin and the dispatcher read), at the metainfo offsets FlashInfer's MoeAlltoAll reports."""

from __future__ import annotations

import torch
from capwatch.dispatcher.flashinfer_backend import WorkspaceCounts

# Byte offsets of the send and the receive counters in one rank's workspace row (a layout FlashInfer could report).
SEND_COUNTERS_BYTE, RECV_COUNTERS_BYTE = 16, 80
METAINFO_INDEX = {"SEND_COUNTERS_OFFSET_INDEX": 0, "RECV_COUNTERS_OFFSET_INDEX": 1}


def workspace_counter_words(rank_bytes: torch.Tensor, ep_size: int) -> torch.Tensor:
    """``[2, ep_size]`` int32: the send row and the receive row of ``rank_bytes`` (uint8), as the backend views them."""
    return WorkspaceCounts(rank_bytes, [SEND_COUNTERS_BYTE, RECV_COUNTERS_BYTE], METAINFO_INDEX, ep_size).traffic()
