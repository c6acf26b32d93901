"""``GET /v1/clusters`` and ``/metrics`` with thousands of clusters: reads stay under 100 ms after a restart, after
thousands of new clusters arrive and under a steady write load, and a change shows in the list within one
report interval (5 s).

A real SQLite store holds the EP groups (two ranks each, a few windows of history); the app is served as
``capwatch serve`` serves it (uvicorn with the service's bounded HTTP protocol, its background refresher running,
full garbage collections on the service's schedule: ``capwatch.service.gc_schedule``) on loopback, in this
process, and read from another process over a new connection each time, as the page or ``capwatch advise`` reads
it. (Starlette's TestClient, used before, hands every 16 KiB piece of the answer from
its event loop's thread to the caller's: under the write load each hop waited for the GIL, and a list that a real
connection answered in ~130 ms took 2-3.5 s through it.)

- restart: the store opened anew on the filled file (its ranks read back), the app's start (every group's digest
  computed before the first read) and the first reads;
- steady, after one report, after every group changed (a read recomputes for at most 50 ms, the rest is served
  as last computed) and how long the refresher takes to catch every group up;
- new clusters: as many new clusters again arrive at once: the first reads (the new ones listed from their
  ranks' states, ``pending``) and how long until every one is computed;
- under load: a writer thread reports for every cluster at a steady rate while the list is read every 100 ms:
  the reads' median and p99, how long a rank's changed cap takes to show in the list, and the full collections
  that ran meanwhile;
- controls, measured in the same run: ``GET /healthz`` (the floor of any request), the same load again with
  CPython's automatic full collections (what the service did before: the p99 was their pauses), and the first
  read after the new clusters with the digests computed in the request (the refresher stopped: what the service
  did before).

    python -m benchmarks.many_clusters [--quick] [--json]
"""

from __future__ import annotations

import contextlib
import gc
import http.client
import json
import multiprocessing
import socket
import statistics
import tempfile
import threading
import time
import warnings
from pathlib import Path

from benchmarks.standalone import standalone

CLUSTERS = 5000
RANKS = 2
WINDOWS = 3
WRITES_PER_S = 1800  # the load: ~1,800 reports a second across 5,000 clusters
GOAL_MS = 100
REPORT_INTERVAL_S = 5.0
DEFAULT_THRESHOLD2 = 10  # CPython's own third threshold (gc.set_threshold): a full collection as the heap grows


def _groups(prefix: str, clusters: int, cap: int = 1024) -> list:
    from tests.support.simulate import SimulatedRank

    return [[SimulatedRank(f"{prefix}{index:05d}", rank, RANKS, cap=cap) for rank in range(RANKS)]
            for index in range(clusters)]


def _fill(store, groups: list, start: float, windows: int = WINDOWS) -> None:
    from capwatch.telemetry.report import RankReport

    futures = []
    for index, ranks in enumerate(groups):
        for window in range(windows):
            begin = start + 60 * window
            for rank in ranks:
                body = rank.report(begin, begin + 59, [200 + index % 300, 400 + window])
                futures.append(store.submit(RankReport.model_validate(body, strict=False), begin + 60))
    for future in futures:
        future.result()


def _report_everywhere(store, groups: list, begin: float) -> None:
    from capwatch.telemetry.report import RankReport

    futures = [store.submit(RankReport.model_validate(ranks[1].report(begin, begin + 1, [250]), strict=False),
                            begin + 2) for ranks in groups]
    for future in futures:
        future.result()


def _timed_ms(action) -> float:
    started = time.perf_counter()
    action()
    return round((time.perf_counter() - started) * 1e3, 3)


def _until(predicate, timeout_s: float, poll_s: float = 0.05) -> float | None:
    """Seconds until ``predicate()`` holds (None: not within ``timeout_s``)."""
    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s:
        if predicate():
            return round(time.perf_counter() - started, 3)
        time.sleep(poll_s)
    return None


def _read_forever(requests, port: int) -> None:
    """The reading client, in its own process: each request a GET on a new connection, answered with its time
    (to the last byte), size, how many groups are ``pending`` and, when asked, one cluster's cap."""
    while (request := requests.recv()) is not None:
        path, cluster = request
        started = time.perf_counter()
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
        seconds = time.perf_counter() - started
        connection.close()
        cap = None
        if cluster is not None:
            cap = next((entry["cap"] for entry in json.loads(body) if entry["cluster"] == cluster), None)
        requests.send({"ms": seconds * 1e3, "status": response.status, "bytes": len(body),
                       "pending": body.count(b'"pending":true'), "cap": cap})


class Reader:
    """``get(path)``: a GET from the reading process (``_read_forever``)."""

    def __init__(self, port: int):
        self._requests, child = multiprocessing.get_context("spawn").Pipe()
        self._process = multiprocessing.get_context("spawn").Process(target=_read_forever, args=(child, port),
                                                                     daemon=True)
        self._process.start()

    def get(self, path: str, cluster: str | None = None) -> dict:
        self._requests.send((path, cluster))
        answer = self._requests.recv()
        if answer["status"] != 200:
            raise RuntimeError(f"GET {path} answered {answer['status']}")
        return answer

    def ms(self, path: str) -> float:
        return round(self.get(path)["ms"], 3)

    def close(self) -> None:
        self._requests.send(None)
        self._process.join(timeout=30)


class Served:
    """The app served as ``capwatch serve`` serves it (uvicorn, the bounded protocol), on loopback, in a thread of
    this process (the benchmark writes to its store and drives its refresher)."""

    def __init__(self, app, settings):
        from capwatch.service.http_server import bounded_server, serve

        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.server = bounded_server(app, settings, log_level="warning")
        self.thread = threading.Thread(target=serve, args=(self.server, [self.listener]), daemon=True)

    def start(self) -> float:
        """Seconds until it answers (its start computes every group's digest)."""
        started = time.perf_counter()
        self.thread.start()
        if _until(lambda: self.server.started, 300, poll_s=0.01) is None:
            raise RuntimeError("the server did not start within 300 s")
        return time.perf_counter() - started

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)
        self.listener.close()


def _pending(reader: Reader) -> int:
    return reader.get("/v1/clusters")["pending"]


def _all_current(digests) -> bool:
    return digests.refresh(0.0) == 0  # nothing left to compute (a zero budget computes nothing)


def _under_load(reader: Reader, store, groups: list, now: float, rate: float, seconds: float) -> dict:
    """Reports for every cluster at ``rate`` a second from a writer thread; the list read every 100 ms; a cap
    changed every second and timed until the list shows it."""
    from capwatch.telemetry.report import RankReport

    stop = threading.Event()
    written = [0]

    def writer() -> None:
        index, started = 0, time.perf_counter()
        while not stop.is_set():
            due = int((time.perf_counter() - started) * rate)
            futures = []
            while written[0] < due:
                ranks = groups[index % len(groups)]
                begin = now + written[0] * 1e-4
                body = ranks[0].report(begin, begin + 0.5, [150 + index % 200])
                futures.append(store.submit(RankReport.model_validate(body, strict=False), begin + 1))
                index, written[0] = index + 1, written[0] + 1
            for future in futures:
                future.result()
            time.sleep(0.01)

    thread = threading.Thread(target=writer, daemon=True)
    pauses: list[float] = []
    timing = _FullCollectionTimer(pauses)
    gc.callbacks.append(timing)
    thread.start()
    reads, shown = [], []
    try:
        deadline = time.perf_counter() + seconds
        changed = 0
        while time.perf_counter() < deadline:
            # One rank restarts with a doubled cap: how long until the list shows the group's new cap?
            ranks = groups[(changed * 7919) % len(groups)]
            changed += 1
            new_cap = ranks[1].cap * 2
            ranks[1].cap = new_cap
            ranks[1].restart()
            begin = now + 50 + changed
            body = ranks[1].report(begin, begin + 0.5, [100])
            store.submit(RankReport.model_validate(body, strict=False), begin + 1).result()
            cluster = ranks[1].cluster
            started = time.perf_counter()
            seen = None
            while time.perf_counter() - started < 4 * REPORT_INTERVAL_S:
                read = reader.get("/v1/clusters", cluster)
                reads.append(read["ms"] / 1e3)
                if read["cap"] == new_cap:
                    seen = time.perf_counter() - started
                    break
                time.sleep(0.1)
            shown.append(seen)
    finally:
        stop.set()
        thread.join(timeout=30)
        gc.callbacks.remove(timing)
    reads.sort()
    visible = [value for value in shown if value is not None]
    return {"writes_per_s_asked": rate, "writes_per_s_done": round(written[0] / seconds, 1),
            "list_median_ms": round(statistics.median(reads) * 1e3, 2),
            "list_p99_ms": round(reads[min(len(reads) - 1, int(0.99 * len(reads)))] * 1e3, 2),
            "cap_change_visible_median_s": round(statistics.median(visible), 2) if visible else None,
            "cap_change_visible_max_s": round(max(visible), 2) if visible else None,
            "cap_changes": len(shown), "cap_changes_not_visible_in_20_s": len(shown) - len(visible),
            "full_collections": len(pauses), "longest_full_collection_ms": round(max(pauses, default=0.0) * 1e3, 1)}


class _FullCollectionTimer:
    """A ``gc.callbacks`` entry: the seconds each full (generation 2) collection took."""

    def __init__(self, pauses: list[float]):
        self.pauses = pauses
        self.started = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if info["generation"] == 2:
            if phase == "start":
                self.started = time.perf_counter()
            else:
                self.pauses.append(time.perf_counter() - self.started)


@contextlib.contextmanager
def _automatic_full_collections():
    """The control: CPython's own schedule for full collections, as a process that does not set it has."""
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], DEFAULT_THRESHOLD2)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def run(quick: bool = False) -> dict:
    warnings.filterwarnings("ignore", message=".*httpx2.*")
    from capwatch.service.config import Settings
    from capwatch.service.main import create_app, store_options
    from capwatch.service.store.sqlite import Store

    clusters = 300 if quick else CLUSTERS
    repeats = 5 if quick else 15
    rate = 200 if quick else WRITES_PER_S
    now = time.time()
    start = now - 60 * WINDOWS - 30
    figures: dict = {}
    with tempfile.TemporaryDirectory(prefix="capwatch-many-") as folder:
        # Room for the three sets of clusters (the store's bound, CAPWATCH_MAX_CLUSTERS, is 10,000 by default).
        settings = Settings(db_path=Path(folder) / "many.db", maintenance_interval_s=3600.0,
                            max_clusters=3 * clusters)
        store = Store(settings.db_path, store_options(settings))
        served = reader = None
        try:
            groups = _groups("c", clusters)
            load_s = _timed_ms(lambda: _fill(store, groups, start)) / 1e3
            store.close()  # a restart: the store opened anew on the file, its ranks read back
            store = Store(settings.db_path, store_options(settings))
            app = create_app(settings, store=store)
            served = Served(app, settings)
            reader = Reader(served.port)
            figures["restart"] = {"start_ms": round(served.start() * 1e3, 1),
                                  "first_clusters_ms": reader.ms("/v1/clusters"),
                                  "first_metrics_ms": reader.ms("/metrics")}
            figures["healthz_median_ms"] = statistics.median(reader.ms("/healthz") for _ in range(repeats))
            for name, path in (("clusters", "/v1/clusters"), ("metrics", "/metrics")):
                steady = statistics.median(reader.ms(path) for _ in range(repeats))
                changed = []
                for step in range(repeats):
                    rank = groups[step % len(groups)][0]
                    begin = now - 20 + step * 0.001
                    _report_everywhere(store, [[rank, rank]], begin)
                    changed.append(reader.ms(path))
                _report_everywhere(store, groups, now - 10 + len(figures))
                everything = reader.ms(path)
                figures[name] = {"steady_median_ms": steady,
                                 "after_one_report_median_ms": statistics.median(changed),
                                 "after_every_group_changed_ms": everything,
                                 "refresher_catches_up_s": _until(lambda: _all_current(app.state.digests), 120),
                                 "bytes": reader.get(path)["bytes"]}
            fresh = _groups("n", clusters)
            _fill(store, fresh, start, windows=1)
            first = reader.get("/v1/clusters")
            figures["new_clusters"] = {
                "added": clusters, "first_clusters_ms": round(first["ms"], 3), "pending_in_first_read": first["pending"],
                "first_metrics_ms": reader.ms("/metrics"),
                "all_computed_s": _until(lambda: _pending(reader) == 0, 120)}
            figures["under_load"] = _under_load(reader, store, groups + fresh, now, rate, 10 if quick else 30)
            with _automatic_full_collections():  # the control: as the service ran before
                figures["control_under_load_automatic_full_collections"] = _under_load(  # reports dated after
                    reader, store, groups + fresh, now + 1000, rate, 10 if quick else 30)  # the first load's
            # Control: as the service did before, new groups computed in the read (the refresher stopped).
            app.state.digests.stop_refresher()
            app.state.digests.recompute_budget_s = float("inf")
            control = _groups("k", clusters)
            _fill(store, control, start, windows=1)
            figures["control_first_clusters_ms_computed_in_the_read"] = reader.ms("/v1/clusters")
        finally:
            if reader is not None:
                reader.close()
            if served is not None:
                served.stop()
            store.close()
    return {
        "benchmark": "many_clusters",
        "what": (f"GET /v1/clusters and /metrics over {clusters} clusters x {RANKS} ranks (then twice as many), "
                 "over loopback from another process"),
        "cluster_count": clusters, "load_s": round(load_s, 2), "goal_ms": GOAL_MS, **figures,
    }


def render(figures: dict) -> None:
    print(f"{figures['what']} (loaded in {figures['load_s']} s); goal <= {figures['goal_ms']} ms")
    restart = figures["restart"]
    print(f"restart: start {restart['start_ms']} ms, first list {restart['first_clusters_ms']} ms, first /metrics "
          f"{restart['first_metrics_ms']} ms; /healthz {figures['healthz_median_ms']} ms (control)")
    print(f"{'endpoint':>10} {'steady ms':>10} {'after 1 report ms':>18} {'all changed ms':>15} "
          f"{'caught up s':>12} {'bytes':>9}")
    for name in ("clusters", "metrics"):
        entry = figures[name]
        print(f"{name:>10} {entry['steady_median_ms']:>10} {entry['after_one_report_median_ms']:>18} "
              f"{entry['after_every_group_changed_ms']:>15} {entry['refresher_catches_up_s']!s:>12} "
              f"{entry['bytes']:>9}")
    new = figures["new_clusters"]
    print(f"{new['added']} new clusters: first list {new['first_clusters_ms']} ms ({new['pending_in_first_read']} "
          f"pending), all computed in {new['all_computed_s']} s; control (computed in the read): "
          f"{figures['control_first_clusters_ms_computed_in_the_read']} ms")
    for name, what in (("under_load", "full collections scheduled"),
                       ("control_under_load_automatic_full_collections", "control: CPython's automatic ones")):
        load = figures[name]
        print(f"under {load['writes_per_s_done']} writes/s ({what}): list median {load['list_median_ms']} ms, p99 "
              f"{load['list_p99_ms']} ms; a changed cap shows in {load['cap_change_visible_median_s']} s (max "
              f"{load['cap_change_visible_max_s']} s, {load['cap_changes_not_visible_in_20_s']} of "
              f"{load['cap_changes']} not within 20 s); {load['full_collections']} full collections, the longest "
              f"{load['longest_full_collection_ms']} ms")


if __name__ == "__main__":
    standalone("python -m benchmarks.many_clusters", __doc__, run, render)
