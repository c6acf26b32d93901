"""``capwatch demo`` and what it alone needs: the whole product on one machine.

| module | what it is |
|---|---|
| ``session`` | the demo's chain: workload -> service -> rank processes -> advice -> table |
| ``trace`` | JSON Lines traces: read (bounded, one line per error) and write |
| ``replay_clock`` | when each step happens (a trace's ``t``, else every 25 ms): the ranks' pace and report dates |
| ``rank_process`` | the body of one demo rank: instrumented dispatcher, exporter, reporter |
| ``progress`` | ``RankProgress``: what each rank process tells the foreground (phase, steps, overflows), by field name |
| ``ranks`` | ``spawn_ranks``: N local rank processes in one gloo group, failures reported by root cause |
| ``service`` | ``ServiceProcess``: ``capwatch serve`` as a child process on a loopback port |
| ``ports`` | free loopback ports |
| ``workload`` | the generated workload (token counts per step, expert popularity); the advice-quality benchmark replays it too |

Tests and benchmarks launch ranks and services with the same ``ranks`` and ``service`` modules.
"""
