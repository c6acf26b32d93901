"""``GET /advice`` answers the group's digest: the same advice a fresh computation gives on the same data, and
never stale — not even where ``GET /v1/clusters`` may still show a changed group as last computed (its read
budget). A real SQLite store, the real app and routes; the clock is the app's own, moved by the tests."""

from __future__ import annotations

import json
import tempfile
from contextlib import contextmanager
from pathlib import Path

from capwatch.advisor.advice import ClusterAdvice
from capwatch.service.config import Settings
from capwatch.service.main import create_app, store_options
from capwatch.service.queries import AdviceUnavailable, cluster_advice
from capwatch.service.store.sqlite import Store
from capwatch.telemetry.report import RankReport
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from tests.service.conftest import JSON, FakeClock
from tests.support.simulate import SimulatedRank
from tests.support.waiting import wait_for

WINDOW_S = 60.0
GROUPS = ("g0", "g1")


@contextmanager
def service(directory: Path, recompute_budget_s: float | None = None, source=None):
    """The app on a real store; ``recompute_budget_s`` 0: the list view serves every changed group as last
    computed, the most staleness it allows (and the background refresher is stopped, so the test alone says
    when a digest is computed)."""
    settings = Settings(db_path=directory / "capwatch.db", maintenance_interval_s=3600.0, fold_after_s=1800.0,
                        advisor={"full_confidence_history_s": 1800.0})
    clock = FakeClock()
    store = Store(settings.db_path, store_options(settings), clock)
    try:
        app = create_app(settings, store=store, clock=clock, source=source(store) if source else None)
        if recompute_budget_s is not None:
            app.state.digests.recompute_budget_s = recompute_budget_s
        with TestClient(app, base_url="http://localhost", headers=JSON) as client:
            if recompute_budget_s is not None:
                app.state.digests.stop_refresher()
            yield client, store, clock, settings
    finally:
        store.close()


class Group:
    def __init__(self, cluster: str, ranks: int = 2, cap: int = 4096):
        self.ranks = [SimulatedRank(cluster, rank, ranks, cap=cap) for rank in range(ranks)]

    def window(self, store: Store, clock: FakeClock, peak: int, ranks: int | None = None) -> None:
        """One window: its ranks (all, or the first ``ranks``) report ``peak``; the clock moves past it."""
        begin = clock.now
        clock.now = begin + WINDOW_S
        for rank in self.ranks[:ranks]:
            body = rank.report(begin, begin + WINDOW_S - 1, [peak // 2, peak])
            store.ingest(RankReport.model_validate(body, strict=False), clock.now)


def fresh(store: Store, settings: Settings, cluster: str, now: float) -> dict:
    """What /advice must answer: the advisor computed now, from the store, with nothing cached."""
    advice = cluster_advice(store, cluster, "target", now, settings)
    return json.loads(ClusterAdvice.of_group(advice, cluster, "target", now).model_dump_json())


def listed(client) -> dict[str, dict]:
    return {entry["cluster"]: entry for entry in client.get("/v1/clusters").json()}


def changed(operation: str, arguments: list, groups: dict[str, Group], store: Store, clock: FakeClock,
            settings: Settings) -> bool:
    """Apply ``operation`` when it changes the data or the clock (False: it is a read, the test's own)."""
    if operation == "window":
        name, peak, ranks = arguments
        groups[name].window(store, clock, peak, ranks)
    elif operation == "restart":  # a rank comes back with another cap: the states change
        name, cap = arguments
        rank = groups[name].ranks[-1]
        rank.restart()
        rank.cap = cap
        groups[name].window(store, clock, 200)
    elif operation == "silence":
        clock.now += arguments[0]
    elif operation == "clock_back":
        clock.now -= arguments[0]
    elif operation == "fold":  # every window so far folds into the decaying histogram
        clock.now += settings.fold_after_s + WINDOW_S
        store.maintain()
    elif operation == "prune":  # the other groups go silent past the retention and are pruned
        clock.now += settings.retention_s + WINDOW_S
        groups[arguments[0]].window(store, clock, 300)
        store.maintain()
    else:
        return False
    return True


OPERATIONS = st.one_of(
    st.tuples(st.just("window"), st.sampled_from(GROUPS), st.integers(50, 6000), st.sampled_from([None, 1])),
    st.tuples(st.just("restart"), st.sampled_from(GROUPS), st.sampled_from([512, 2048, 4096, 8192])),
    st.tuples(st.just("silence"), st.sampled_from([30.0, 90.0, 400.0])),  # ranks turn stale, then missing
    st.tuples(st.just("fold")),
    st.tuples(st.just("list")),
    st.tuples(st.just("advice"), st.sampled_from((*GROUPS, "nope"))),
)


@hypothesis_settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(baseline=st.integers(0, 30), operations=st.lists(OPERATIONS, max_size=25))
def test_the_advice_is_what_a_fresh_computation_gives_whatever_happened_before(baseline, operations):
    with tempfile.TemporaryDirectory() as directory, service(Path(directory), recompute_budget_s=0.0) as (
            client, store, clock, settings):
        groups = {name: Group(name) for name in GROUPS}
        for _ in range(baseline):
            for group in groups.values():
                group.window(store, clock, 300)
                clock.now -= WINDOW_S  # both groups report the same window
            clock.now += WINDOW_S
        for operation, *arguments in [*operations, ("advice", "g0"), ("advice", "g1")]:
            if changed(operation, arguments, groups, store, clock, settings):
                continue
            if operation == "list":
                assert client.get("/v1/clusters").status_code == 200
            else:
                cluster = arguments[0]
                response = client.get(f"/v1/clusters/{cluster}/advice")
                try:
                    expected = fresh(store, settings, cluster, clock.now)
                except LookupError:
                    assert response.status_code == 404, response.text
                    continue
                except AdviceUnavailable as unavailable:
                    assert response.status_code == 409 and response.json()["detail"] == str(unavailable)
                    continue
                assert response.status_code == 200, response.text
                assert response.json() == expected


def test_a_changed_group_answers_fresh_advice_while_the_list_may_still_show_its_last_digest(tmp_path):
    with service(tmp_path, recompute_budget_s=0.0) as (client, store, clock, settings):
        group = Group("g0")
        for _ in range(40):
            group.window(store, clock, 300)
        assert "g0" not in listed(client)  # no budget, and no refresher pass since it arrived: not yet listed
        client.app.state.digests.refresh(0.0)  # a refresher pass with no time to compute: listed at once...
        quick = listed(client)["g0"]
        assert quick["pending"] and quick["action"] is None and quick["cap"] == 4096  # ...from its ranks' states
        assert client.get("/v1/clusters/g0/advice").json()["action"] == "lower"
        assert listed(client)["g0"]["action"] == "lower"  # the advice request computed it

        group.window(store, clock, 5000)  # above the 4096 cap: an overflow
        assert listed(client)["g0"]["action"] == "lower"  # past its budget (0 s), the list shows the last digest
        advice = client.get("/v1/clusters/g0/advice").json()
        assert advice["action"] == "raise" and advice["overflow_windows"] == 1
        assert advice == fresh(store, settings, "g0", clock.now)
        assert listed(client)["g0"]["action"] == "raise"  # the advice's computation caught the list up

        # /whatif prices the same data: at the recommended cap it says what the advice says.
        [row] = client.get("/v1/clusters/g0/whatif", params={"cap": advice["recommended_cap"]}).json()
        assert row["predicted_overflow_windows_per_day"] == advice["predicted_overflow_windows_per_day_recommended"]
        assert row["predicted_overflow_rate"] == advice["predicted_overflow_rate_recommended"]
        assert row["workspace_bytes_per_rank"] == advice["workspace_bytes_per_rank_recommended"]


def test_the_advice_is_computed_once_per_change_of_the_group(tmp_path):
    with service(tmp_path) as (client, store, clock, settings):
        group = Group("g0")
        for _ in range(30):
            group.window(store, clock, 300)
        digests = client.app.state.digests
        first = digests.group("g0", "target", clock.now)
        assert digests.group("g0", "target", clock.now) is first  # same data, same rank statuses: reused
        quiet = clock.now + settings.stale_after_s  # the ranks turn stale: recomputed, to the same advice
        assert digests.group("g0", "target", quiet) is not first
        assert digests.group("g0", "target", quiet).advice == first.advice
        group.window(store, clock, 900)  # new data: recomputed
        assert digests.group("g0", "target", clock.now).advice.max_peak_runtime_tokens == 900


class CommitsBetweenReads:
    """The real store, where one report commits right after a reader has taken the rank states: the
    interleaving of a request computing a digest while a rank's report lands, made deterministic."""

    def __init__(self, store: Store):
        self.store = store
        self.pending: tuple[RankReport, float] | None = None

    def __getattr__(self, name: str):
        return getattr(self.store, name)

    def rank_states(self, cluster: str):
        states = self.store.rank_states(cluster)
        if self.pending is not None:
            (report, received), self.pending = self.pending, None
            self.store.ingest(report, received)
        return states


def test_a_report_committed_while_the_advice_is_computed_is_in_the_next_answer(tmp_path):
    with service(tmp_path, source=CommitsBetweenReads) as (client, store, clock, settings):
        group = Group("g0")
        for _ in range(30):
            group.window(store, clock, 300)
        assert client.get("/v1/clusters/g0/advice").json()["current_cap"] == 4096
        group.window(store, clock, 300, ranks=1)  # a new generation: the next read takes the states anew...
        rank = group.ranks[1]
        rank.restart()
        rank.cap = 8192  # the group's cap is the largest its live ranks run
        body = rank.report(clock.now - WINDOW_S, clock.now - 1, [300])
        # ...and this report commits right after it took them (an unchanged generation reuses the states read)
        client.app.state.source.pending = (RankReport.model_validate(body, strict=False), clock.now)
        client.get("/v1/clusters/g0/advice")  # computed from the states read before the commit
        advice = client.get("/v1/clusters/g0/advice").json()
        assert advice["current_cap"] == 8192 and advice == fresh(store, settings, "g0", clock.now)


def test_what_the_list_needs_is_computed_ahead_at_start_and_by_the_refresher(tmp_path):
    """Issue #20, finding 6: the first list after 5,000 new clusters took 3.8 s, 6.6 s after a restart. At start
    every group is computed before the first read; later groups are listed (pending) and then computed by the
    background refresher, not by the reads (their budget is 0 here)."""
    settings = Settings(db_path=tmp_path / "capwatch.db", maintenance_interval_s=3600.0)
    clock = FakeClock()
    store = Store(settings.db_path, store_options(settings), clock)
    try:
        early = [Group(f"early{index}") for index in range(20)]
        for group in early:
            group.window(store, clock, 300)
        app = create_app(settings, store=store, clock=clock)
        app.state.digests.recompute_budget_s = 0.0
        with TestClient(app, base_url="http://localhost", headers=JSON) as client:
            assert app.state.digests.refresh(0.0) == 0  # computed at start, before any read
            assert all(not entry["pending"] and entry["error"] is None for entry in listed(client).values())
            late = Group("late")
            late.window(store, clock, 300)
            wait_for(lambda: "late" in listed(client), 10, "the refresher to list the new group", poll_s=0.05)
            wait_for(lambda: not listed(client)["late"]["pending"], 10, "the refresher to compute it", poll_s=0.05)
            assert listed(client)["late"]["action"] == fresh(store, settings, "late", clock.now)["action"]
    finally:
        store.close()


class ComputedBy:
    """Which threads computed a digest (``digests._compute``): the background refresher, or a request."""

    def __init__(self, monkeypatch):
        import threading

        from capwatch.service import digests

        self.threads: list[str] = []
        original = digests._compute

        def counting(*args, **kwargs):
            self.threads.append(threading.current_thread().name)
            return original(*args, **kwargs)

        monkeypatch.setattr(digests, "_compute", counting)

    def by_requests(self) -> int:
        return sum(name != "capwatch-digests" for name in self.threads)


def test_after_a_restart_the_first_list_computes_nothing(tmp_path, monkeypatch):
    """Issue #20, finding 6: the first list after a restart took 6.6 s, every group computed in that read. Every
    group's digest is computed at start, before the first read (the lifespan), so the read only serves them."""
    settings = Settings(db_path=tmp_path / "capwatch.db", maintenance_interval_s=3600.0)
    clock = FakeClock()
    store = Store(settings.db_path, store_options(settings), clock)
    groups = [Group(f"r{index:03d}") for index in range(100)]
    try:
        for group in groups:
            group.window(store, clock, 300)
    finally:
        store.close()
    computed = ComputedBy(monkeypatch)
    store = Store(settings.db_path, store_options(settings), clock)  # the restart: the same file, a new process
    try:
        app = create_app(settings, store=store, clock=clock)
        with TestClient(app, base_url="http://localhost", headers=JSON) as client:
            app.state.digests.stop_refresher()
            at_start = len(computed.threads)
            assert at_start == len(groups)  # every group, once, before the first read
            entries = listed(client)
            assert sorted(entries) == [f"r{index:03d}" for index in range(100)]
            assert all(not entry["pending"] and entry["action"] is not None for entry in entries.values())
            assert len(computed.threads) == at_start  # the read computed none
    finally:
        store.close()


def test_many_changed_groups_are_left_to_the_refresher_and_listed_from_their_states(tmp_path, monkeypatch):
    """Issue #20, finding 6: under a steady write load a changed cap took 15 to 30 s to show, each read competing
    to compute the changed groups. A read computes changed groups itself only when they are few (a deployment that
    changes little reads what it just wrote); many are the refresher's: it lists every changed group at once from
    its ranks' states (the new cap, ``pending``), then computes them."""
    from capwatch.service import digests

    monkeypatch.setattr(digests, "REFRESH_IDLE_S", 3600.0)  # the refresher runs, and waits for the test's word
    computed = ComputedBy(monkeypatch)
    with service(tmp_path) as (client, store, clock, settings):
        refresher = client.app.state.digests
        many = [Group(f"m{index:03d}") for index in range(digests.READ_RECOMPUTE_MAX_GROUPS + 8)]
        for group in many:
            group.window(store, clock, 300)
        refresher.refresh(float("inf"))  # a pass with time to compute every one
        assert {entry["cap"] for entry in listed(client).values()} == {4096}
        before = computed.by_requests()

        for group in many:  # every group's ranks come back with another cap
            for rank in group.ranks:
                rank.restart()
                rank.cap = 8192
            group.window(store, clock, 300)
        entries = listed(client)
        assert computed.by_requests() == before  # too many for a read: it computed none...
        assert {entry["cap"] for entry in entries.values()} == {4096}  # ...and served them as last computed
        refresher.refresh(0.0)  # a refresher pass with no time to compute: every change listed at once
        entries = listed(client)
        assert {(entry["cap"], entry["pending"]) for entry in entries.values()} == {(8192, True)}
        assert all(entry["action"] is not None for entry in entries.values())  # the advice as last computed
        assert refresher.refresh(float("inf")) == 0
        assert not any(entry["pending"] for entry in listed(client).values())
        before = computed.by_requests()  # the test's own refresh passes computed them (on its thread)

        few = many[:3]  # a few changed groups: the read computes them itself, and lists them fresh
        for group in few:
            group.window(store, clock, 5000)  # above the cap: an overflow
        entries = listed(client)
        # those, and the few whose ranks turned stale as the clock moved (a changed status is a change too)
        assert len(few) <= computed.by_requests() - before <= digests.READ_RECOMPUTE_MAX_GROUPS
        assert not any(entry["pending"] for entry in entries.values())
        for group in few:
            cluster = group.ranks[0].cluster
            assert not entries[cluster]["pending"]
            assert entries[cluster]["action"] == fresh(store, settings, cluster, clock.now)["action"]


def test_a_changed_cap_shows_in_the_list_while_every_group_keeps_changing(tmp_path):
    """Under a write load across many groups, a rank's changed cap shows in the list through the running
    refresher alone (how soon, under the issue's 1,800 writes a second: ``python -m benchmarks many_clusters``)."""
    from capwatch.service import digests

    with service(tmp_path) as (client, store, clock, settings):
        groups = [Group(f"w{index:03d}") for index in range(digests.READ_RECOMPUTE_MAX_GROUPS * 3)]
        for group in groups:
            group.window(store, clock, 300)
        # Too many new groups for a read to compute: each is listed once the refresher has passed (not before).
        wait_for(lambda: len(listed(client)) == len(groups), 30, "the refresher to list every group", poll_s=0.05)
        changed = groups[7]
        assert listed(client)[changed.ranks[0].cluster]["cap"] == 4096
        for rank in changed.ranks:
            rank.restart()
            rank.cap = 8192
        rounds = 0

        def shown() -> bool:
            nonlocal rounds
            rounds += 1
            for group in groups:  # every group changes again before each read
                group.window(store, clock, 300 + rounds % 7)
            return listed(client)[changed.ranks[0].cluster]["cap"] == 8192

        wait_for(shown, 30, "the changed cap to show in the list", poll_s=0.05)


def fresh_list(store: Store, settings: Settings, now: float) -> list[dict]:
    """What ``GET /v1/clusters`` must answer: every cluster's first group computed now, nothing cached."""
    from capwatch.service.cluster_view import role_order
    from capwatch.service.digests import _compute

    answer = []
    for cluster in store.clusters():
        states = store.rank_states(cluster)
        answer.append(json.loads(_compute(store, cluster, role_order(states)[0], states, now, settings).summary_json))
    return answer


LIST_OPERATIONS = st.one_of(
    st.tuples(st.just("window"), st.sampled_from(GROUPS), st.integers(50, 6000), st.sampled_from([None, 1])),
    st.tuples(st.just("restart"), st.sampled_from(GROUPS), st.sampled_from([512, 2048, 4096, 8192])),
    st.tuples(st.just("silence"), st.sampled_from([30.0, 90.0, 400.0])),  # ranks turn stale, then missing
    st.tuples(st.just("clock_back"), st.sampled_from([10.0, 100.0])),
    st.tuples(st.just("fold")),
    st.tuples(st.just("prune"), st.sampled_from(GROUPS)),  # the other group goes silent past the retention
    st.tuples(st.just("advice"), st.sampled_from(GROUPS)),
)


@hypothesis_settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(operations=st.lists(LIST_OPERATIONS, max_size=20))
def test_the_list_is_what_a_fresh_computation_gives_whatever_changed(operations):
    """The list is kept and only the clusters the store says changed, or whose ranks are due to turn stale or
    missing, are read again: whatever happened (new reports, a changed cap, silence, the clock stepping back, a
    fold, a pruned cluster, an advice request between), a read with time to compute answers what computing every
    group afresh answers, and lists exactly the clusters held."""
    with tempfile.TemporaryDirectory() as directory, service(Path(directory), recompute_budget_s=float("inf")) as (
            client, store, clock, settings):
        groups = {name: Group(name) for name in GROUPS}
        for group in groups.values():
            group.window(store, clock, 300)
        assert client.get("/v1/clusters").json() == fresh_list(store, settings, clock.now)
        for operation, *arguments in operations:
            if not changed(operation, arguments, groups, store, clock, settings):
                client.get(f"/v1/clusters/{arguments[0]}/advice")
            assert client.get("/v1/clusters").json() == fresh_list(store, settings, clock.now), operation


def test_the_refresher_shows_ranks_turning_stale_and_missing_and_pruned_clusters_leaving(tmp_path):
    """With too many groups for a read to compute, the refresher alone keeps the list current: ranks that stop
    reporting turn stale, then missing, in the list with no new report (the clock alone changed them), and a
    cluster pruned after the retention leaves the list."""
    from capwatch.service import digests

    with service(tmp_path) as (client, store, clock, settings):
        groups = [Group(f"s{index:03d}") for index in range(digests.READ_RECOMPUTE_MAX_GROUPS + 8)]

        def every_group_reports(which: list[Group]) -> None:  # the same window
            for group in which:
                group.window(store, clock, 300)
                clock.now -= WINDOW_S
            clock.now += WINDOW_S

        every_group_reports(groups)
        wait_for(lambda: len(listed(client)) == len(groups), 30, "the refresher to list every group", poll_s=0.05)
        assert {entry["ranks_reporting"] for entry in listed(client).values()} == {2}

        clock.now += settings.stale_after_s
        wait_for(lambda: {(entry["ranks_stale"], entry["ranks_reporting"]) for entry in listed(client).values()}
                 == {(2, 0)}, 30, "every rank to show stale", poll_s=0.05)
        clock.now += settings.missing_after_s
        wait_for(lambda: {entry["ranks_missing"] for entry in listed(client).values()} == {2}, 30,
                 "every rank to show missing", poll_s=0.05)

        clock.now += settings.retention_s
        every_group_reports(groups[1:])
        store.maintain()  # the first group, silent past the retention, is pruned
        gone = groups[0].ranks[0].cluster
        wait_for(lambda: gone not in listed(client), 30, "the pruned cluster to leave the list", poll_s=0.05)
        entries = listed(client)
        assert len(entries) == len(groups) - 1
        wait_for(lambda: not any(entry["pending"] for entry in listed(client).values()), 30,
                 "the refresher to compute every group")
        assert listed(client) == {entry["cluster"]: entry for entry in fresh_list(store, settings, clock.now)}
