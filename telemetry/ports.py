"""The rank exporters' default port: rank r serves ``/metrics`` on ``DEFAULT_BASE_PORT + r``.

9470: the default before, 9400, is NVIDIA dcgm-exporter's, which runs on most GPU nodes (one of the two failed to
bind, whichever started second). 9470 - 9485 (16 GPUs a node) are none of the common GPU node exporters' ports:
dcgm-exporter 9400, nvidia_gpu_exporter 9835, node-exporter 9100, AMD's device-metrics-exporter 5000. Standard
library only: the demo's command line reads it without the telemetry's dependencies.
"""

from __future__ import annotations

DEFAULT_BASE_PORT = 9470
