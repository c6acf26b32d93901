"""A live EP group for the tests: N rank processes (capwatch.demo.ranks.spawn_ranks) serving
tests/telemetry/rank_program.py, commanded from the test thread."""

from __future__ import annotations

import multiprocessing
import queue
import time
from concurrent.futures import Future, ThreadPoolExecutor

from capwatch.demo.ranks import spawn_ranks

from .rank_program import RankPlan, serve_rank

REPLY_TIMEOUT_S = 120


class RankGroup:
    def __init__(self, world_size: int, plan: RankPlan):
        context = multiprocessing.get_context("spawn")
        self.world_size = world_size
        self.plan = plan
        self.commands = [context.Queue() for _ in range(world_size)]
        self.replies = context.Queue()
        self.stop_event = context.Event()
        self._executor = ThreadPoolExecutor(1)
        self.result: Future = self._executor.submit(
            spawn_ranks, world_size, serve_rank, plan, self.commands, self.replies, self.stop_event,
            timeout_s=600)
        self.status = self._collect()

    def _collect(self) -> list[dict]:
        """One reply per rank, by rank; a rank that died surfaces its own traceback."""
        statuses: dict[int, dict] = {}
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while len(statuses) < self.world_size:
            if self.result.done():
                self.result.result()  # raises RankFailedError with the child's traceback
                raise AssertionError("ranks exited without replying")
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks {sorted(set(range(self.world_size)) - set(statuses))} did not reply")
            try:
                _, status = self.replies.get(timeout=0.5)
            except queue.Empty:
                continue
            statuses[status["rank"]] = status
        return [statuses[rank] for rank in range(self.world_size)]

    def send(self, command: str, argument=None) -> None:
        for commands in self.commands:
            commands.put((command, argument))

    def command(self, command: str, argument=None) -> list[dict]:
        self.send(command, argument)
        self.status = self._collect()
        return self.status

    def start_running(self) -> None:
        self.stop_event.clear()
        self.send("until")

    def stop_running(self) -> list[dict]:
        self.stop_event.set()
        self.status = self._collect()
        return self.status

    @property
    def metrics_urls(self) -> list[str]:
        return [status["metrics_url"] for status in self.status]

    def exit(self) -> list[dict]:
        self.send("exit")
        return self.result.result(timeout=REPLY_TIMEOUT_S)

    def close(self) -> None:
        """Teardown: ask politely; spawn_ranks kills whatever is left when it returns or times out."""
        if not self.result.done():
            self.stop_event.set()
            self.send("exit")
            try:
                self.result.result(timeout=60)
            except Exception:
                pass
        self._executor.shutdown(wait=False)
