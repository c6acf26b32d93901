"""``capwatch demo``: the whole product on one machine, in one visible chain.

    workload (generated or a trace) -> service (uvicorn subprocess, SQLite under the state folder)
      -> N rank processes (gloo group; instrumented dispatcher; exporter + reporter each)
      -> progress -> final advice from the service's API -> table (or JSON) and the URLs

The embedded service runs the real advisor with its clock compressed: a demo "day" lasts
seconds, so the advisor's history and confidence thresholds are scaled to match (see
``DEMO_ADVISOR_SETTINGS``). A service given with ``--service-url`` keeps its own settings.
The ranks replay the workload on its own clock (``capwatch.demo.replay_clock``), so the same
workload gets the same advice on any machine, under any load.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from capwatch.demo.ports import LOOPBACK, block_is_free, free_port, free_port_block, port_is_free
from capwatch.demo.progress import Phase, shared_progress
from capwatch.demo.rank_process import RankPlan
from capwatch.demo.replay_clock import REPORT_INTERVAL_S, replay_clock, replay_origin
from capwatch.demo.workload import DEFAULT_MODEL, Workload, WorkloadSpec, generate_token_counts, scaled_geometry
from capwatch.telemetry.ports import DEFAULT_BASE_PORT
from capwatch.usage_errors import CommandError

DEFAULT_PORT = 8321  # the service's own default
DEFAULT_METRICS_PORT = DEFAULT_BASE_PORT
DEFAULT_CAP = 4096  # SGLang's default for the FlashInfer A2A cap
DEFAULT_STEPS = 1200
DEFAULT_RANKS = 4
DEFAULT_POLICY = "chunk"  # the demo always ends with advice; --overflow-policy raise shows the crash
SERVICE_START_TIMEOUT_S = 60.0
DEMO_WINDOW_S = 1  # the embedded service's advisor window; the replay's report interval divides it
# The advisor's clock, compressed so a demo "day" (30 s of replay: the default 1,200 steps at 25 ms) counts as
# a full history.
DEMO_ADVISOR_SETTINGS = {
    "CAPWATCH_WINDOW_S": str(DEMO_WINDOW_S),
    "CAPWATCH_ADVISOR__MIN_SAMPLES": "10",
    "CAPWATCH_ADVISOR__MIN_HISTORY_S": "10",
    "CAPWATCH_ADVISOR__HALF_LIFE_S": "60",
    "CAPWATCH_ADVISOR__FULL_CONFIDENCE_HISTORY_S": "30",
    "CAPWATCH_ADVISOR__CHANGE_MIN_HISTORY_S": "15",
}


@dataclass(frozen=True)
class DemoOptions:
    trace: Path | None = None
    cap: int = DEFAULT_CAP
    ranks: int | None = None
    steps: int | None = None
    overflow_policy: str = DEFAULT_POLICY
    model: str = DEFAULT_MODEL
    cluster: str = "demo"
    json: bool = False
    port: int | None = None
    metrics_port: int | None = None
    hold_s: float = 0.0
    service_url: str | None = None
    state_dir: Path | None = None
    seed: int = 0


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "capwatch"


# --- the workload --------------------------------------------------------------------------------

def build_workload(options: DemoOptions) -> Workload:
    if options.trace is not None:
        from capwatch.demo.trace import read_trace

        workload = read_trace(options.trace)
        if options.ranks is not None and options.ranks != workload.ranks:
            raise CommandError(f"--ranks {options.ranks} disagrees with the trace, which has {workload.ranks} ranks "
                               "per step; drop --ranks (the trace decides)")
        if options.steps is not None:
            workload.token_counts = workload.token_counts[: options.steps]
            if workload.step_times_s is not None:
                workload.step_times_s = workload.step_times_s[: options.steps]
        return workload
    ranks = options.ranks or DEFAULT_RANKS
    steps = options.steps or DEFAULT_STEPS
    spec = WorkloadSpec(ranks=ranks, steps=steps, day_steps=800, seed=options.seed,
                        hot_rank=1 if ranks > 1 else None)
    return Workload(token_counts=generate_token_counts(spec), source="generated", notes={"spec": spec})


# --- ports and the service -----------------------------------------------------------------------

def choose_service_port(requested: int | None) -> int:
    if requested is not None:
        if requested and not port_is_free(requested):
            raise CommandError(f"port {requested} on {LOOPBACK} is in use; pass another --port (0 picks a free one)")
        return requested or free_port()
    return DEFAULT_PORT if port_is_free(DEFAULT_PORT) else free_port()


def choose_metrics_base(requested: int | None, ranks: int) -> int:
    """Rank r exports on base + r. An explicit base must be free; 0 is any free block; the default slides
    to a free block."""
    if requested == 0:
        try:
            return free_port_block(ranks)
        except OSError as error:
            raise CommandError(f"--metrics-port 0: {error}; pass a base port") from None
    if requested is not None:
        if not block_is_free(requested, ranks):
            raise CommandError(f"metrics ports {requested}..{requested + ranks - 1} are not all free; "
                               "pass another --metrics-port")
        return requested
    for base in range(DEFAULT_METRICS_PORT, DEFAULT_METRICS_PORT + 2000, max(ranks, 1)):
        if block_is_free(base, ranks):
            return base
    raise CommandError(f"no free block of metrics ports near {DEFAULT_METRICS_PORT}; pass --metrics-port")


def get_json(url: str, timeout_s: float = 10.0):
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def usable_state_dir(folder: Path) -> Path:
    """Create ``folder`` if missing and prove a file can be written in it; a path that is a file, or
    a folder nobody can write (``/proc``, a read-only mount), is a usage error (one line, exit 2)."""
    import tempfile

    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise CommandError(f"--state-dir {folder}: not a folder the demo can write to "
                           f"({error.strerror or error}); pass a writable folder") from None
    return folder


class EmbeddedService:
    """``capwatch serve`` (``capwatch.demo.service.ServiceProcess``) with the demo's database and settings."""

    def __init__(self, state_dir: Path, port: int):
        from capwatch.demo.service import ServiceProcess

        self.state_dir = state_dir
        self.database = state_dir / "demo.sqlite3"
        self.log_path = state_dir / "demo-service.log"
        self.process = ServiceProcess(self.database, port=port, env=DEMO_ADVISOR_SETTINGS, log_path=self.log_path)
        self.url = self.process.url

    def start(self) -> "EmbeddedService":
        usable_state_dir(self.state_dir)
        # The demo's own database, recreated each run so the page shows this run only.
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{self.database}{suffix}").unlink(missing_ok=True)
        self.log_path.unlink(missing_ok=True)
        try:
            self.process.start(timeout_s=SERVICE_START_TIMEOUT_S)
        except (RuntimeError, TimeoutError) as error:
            raise CommandError(f"the service did not start: {error}\n{self.log_tail()}") from None
        return self

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        self.process.stop()


# --- the ranks -----------------------------------------------------------------------------------

class RankGroup:
    """The rank processes, launched by ``capwatch.demo.ranks.spawn_ranks`` on a background thread so
    the foreground can show progress and fetch the advice while ranks hold their exporters up."""

    def __init__(self, plan: RankPlan, ranks: int, timeout_s: float):
        self.plan = plan
        self.ranks = ranks
        self.progress = shared_progress(ranks)
        self.timeout_s = timeout_s
        self.outcomes: list[dict] | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="capwatch-demo-ranks", daemon=True)

    def _run(self) -> None:
        from capwatch.demo.rank_process import run_rank
        from capwatch.demo.ranks import spawn_ranks

        try:
            self.outcomes = spawn_ranks(self.ranks, run_rank, self.plan, self.progress, timeout_s=self.timeout_s)
        except BaseException as error:  # reported by the foreground
            self.error = error

    def start(self) -> "RankGroup":
        # The ranks start with Ctrl-C ignored (a disposition children inherit): the demo stops them
        # itself, so a Ctrl-C never leaves a rank blocked in a collective or prints N tracebacks.
        in_main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if in_main_thread else None
        try:
            self._thread.start()
            deadline = time.monotonic() + 60
            while (len(self._children()) < self.ranks and self._thread.is_alive()
                   and time.monotonic() < deadline):
                time.sleep(0.02)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        return self

    @staticmethod
    def _children() -> list:
        import multiprocessing

        return [child for child in multiprocessing.active_children() if child.name.startswith("capwatch-rank-")]

    @property
    def steps_done(self) -> int:
        return min(record.steps_done for record in self.progress)

    @property
    def overflow_events(self) -> int:
        return sum(record.overflow_events for record in self.progress)

    @property
    def raised(self) -> bool:
        return any(record.raised for record in self.progress)

    @property
    def reports_lost(self) -> int:
        return sum(record.reports_lost for record in self.progress)

    @property
    def reports_merged(self) -> int:
        return sum(record.reports_merged for record in self.progress)

    @property
    def all_reported(self) -> bool:
        return all(record.phase >= Phase.REPORTED for record in self.progress)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def wait(self, timeout_s: float | None = None) -> None:
        self._thread.join(timeout_s)

    def kill(self) -> None:
        """On Ctrl-C: end the rank processes now (a rank blocked in a collective never notices)."""
        children = self._children()
        for child in children:
            child.kill()
        for child in children:
            child.join(timeout=5)  # reaped here: an orphaned zombie may never be


# --- the chain -----------------------------------------------------------------------------------

def run_demo(options: DemoOptions) -> int:
    from rich.console import Console
    from rich.markup import escape

    from capwatch.advice_table import print_advice
    from capwatch.output_format import print_json_lines
    from capwatch.service_client import fetch_advice

    out = Console(highlight=False)
    err = Console(stderr=True, highlight=False, quiet=options.json)
    workload = build_workload(options)
    try:
        geometry = scaled_geometry(options.model, workload.ranks)
    except ValueError as error:  # an unknown model name
        raise CommandError(str(error)) from None
    if geometry.num_experts < workload.ranks:
        raise CommandError(f"{options.model} has {geometry.num_experts} experts, fewer than {workload.ranks} ranks")
    state_dir = options.state_dir or default_state_dir()

    service: EmbeddedService | None = None
    if options.service_url:
        service_url = options.service_url.rstrip("/")
        try:
            get_json(f"{service_url}/healthz", timeout_s=5.0)
        except (urllib.error.URLError, OSError, ValueError) as error:
            raise CommandError(f"no capwatch service answers at {service_url}/healthz ({error}); start one with "
                               "`capwatch serve` or drop --service-url") from None
    else:
        port = choose_service_port(options.port)
        usable_state_dir(state_dir)  # before anything is printed or started
    metrics_base = choose_metrics_base(options.metrics_port, workload.ranks)
    if not options.service_url:
        err.print(f"[dim]starting the service on {LOOPBACK}:{port} "
                  f"(database {escape(str(state_dir / 'demo.sqlite3'))}) ...[/dim]")
        service = EmbeddedService(state_dir, port).start()
        service_url = service.url

    clock = replay_clock(workload, replay_origin(time.time(), DEMO_WINDOW_S))
    plan = RankPlan(
        cluster=options.cluster, token_counts=workload.token_counts, clock=clock, cap=options.cap,
        overflow_policy=options.overflow_policy, model=geometry.name,
        hidden_size=geometry.hidden_size, priced_hidden_size=geometry.priced_hidden_size,
        num_experts=geometry.num_experts, top_k=geometry.top_k, moe_layers=1, zipf_exponent=1.0,
        service_url=service_url, metrics_base_port=metrics_base,
        hold_s=options.hold_s, seed=options.seed,
        # The embedded service inherits CAPWATCH_TOKEN from the environment; so do the reporters.
        bearer_token=os.environ.get("CAPWATCH_TOKEN") or None,
    )
    group = RankGroup(plan, workload.ranks, timeout_s=max(600.0, 3 * clock.duration_s + options.hold_s + 120))
    err.print(f"[bold]{workload.ranks} ranks[/bold] x {workload.steps} decode steps ({escape(workload.source)}), "
              f"{geometry.name} routing (E={geometry.num_experts}, top-{geometry.top_k}; CPU hidden size "
              f"{geometry.hidden_size}, workspace priced at H={geometry.priced_hidden_size}), cap {options.cap}, "
              f"policy {options.overflow_policy}, torch.distributed gloo")
    err.print(f"replay clock: {escape(clock.source)}, the last step at {clock.duration_s:g} s; the ranks date and "
              f"cut their reports on it (one per {REPORT_INTERVAL_S:g} s of it), so this machine's speed does not "
              "change the advice")
    previous_sigterm = (signal.signal(signal.SIGTERM, _raise_interrupt)
                        if threading.current_thread() is threading.main_thread() else None)
    try:
        group.start()
        _show_progress(group, workload, err)
        if group.raised or options.hold_s == 0:
            group.wait(60)  # the ranks are closing their telemetry; an overflow skips the hold
        if group.error is not None:  # a crash, not a usage error: exit 1 with the rank's own traceback
            err.quiet = False
            err.print(f"capwatch demo: the rank processes failed: {group.error}", markup=False, style="red")
            return 1
        if group.reports_lost:  # the advice must not pass for one computed from everything the ranks did
            err.quiet = False
            err.print(f"capwatch demo: warning: {group.reports_lost} reports of the ranks did not reach the service "
                      "(refused, or not acknowledged in time: see the service's log); the advice below lacks them",
                      markup=False, style="yellow")
        if group.reports_merged:  # counted, but at a coarser time resolution than the ranks reported
            err.quiet = False
            err.print(f"capwatch demo: warning: {group.reports_merged} reports of the ranks were merged into the next "
                      "while the service did not keep up; the advice below sees their peaks in fewer, longer windows",
                      markup=False, style="yellow")
        advice = fetch_advice(service_url, options.cluster, "target", timeout=30.0)[0]
        outcomes = group.outcomes or []
        overflow = next((outcome["overflow"] for outcome in outcomes if "overflow" in outcome), None)
        if options.json:
            print_json_lines([advice])  # one object a line, as advise --format json and plan print it
        else:
            print_advice([advice], out)
            _print_urls(out, service_url, options.cluster, metrics_base, workload.ranks,
                        hint=service is not None and options.hold_s == 0)
        sys.stdout.flush()  # the advice is out before any hold
        if overflow is not None:
            err.quiet = False
            err.print("capwatch demo: the dispatcher raised: " + overflow, soft_wrap=True, markup=False, style="red")
            return 1
        if options.hold_s > 0 and not options.json:
            err.print(f"holding the service and the exporters up for {options.hold_s:.0f} s (Ctrl-C ends) ...")
        if options.hold_s > 0:
            group.wait()
        return 0
    except KeyboardInterrupt:
        group.kill()
        raise
    finally:
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)
        if group.running:
            group.wait(30)
        if service is not None:
            service.stop()


def _raise_interrupt(signum, frame) -> None:
    """SIGTERM (``timeout``, a supervisor) ends the demo like Ctrl-C: ranks and service stopped."""
    raise KeyboardInterrupt


def _show_progress(group: RankGroup, workload: Workload, err) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    counts = workload.token_counts
    columns = [TextColumn("[bold]decode steps"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("R {task.fields[runtime]:>5}  peak {task.fields[peak]:>5}  overflows {task.fields[overflows]}")]
    with Progress(*columns, console=err, transient=False, disable=err.quiet) as progress:
        task = progress.add_task("steps", total=workload.steps, runtime=0, peak=0, overflows=0)
        peak = 0
        while group.running and not group.all_reported:
            done = group.steps_done
            if done:
                runtime = max(counts[done - 1])
                peak = max(peak, runtime)
                progress.update(task, completed=done, runtime=runtime, peak=peak, overflows=group.overflow_events)
            time.sleep(0.2)
        done = group.steps_done
        seen = min(len(counts), done + 1) if group.raised else done  # the step that raised was dispatched too
        peak = max([peak] + [max(step) for step in counts[:seen]])
        progress.update(task, completed=done, runtime=max(counts[seen - 1]) if seen else 0, peak=peak,
                        overflows=group.overflow_events)
    if not group.all_reported:
        group.wait(5)


def _print_urls(out, service_url: str, cluster: str, metrics_base: int, ranks: int, hint: bool) -> None:
    out.print()
    lines = [
        ("web dashboard", f"{service_url}/?cluster={cluster}"),
        ("advice (API)", f"{service_url}/v1/clusters/{cluster}/advice"),
        ("API schema", f"{service_url}/openapi.json"),  # Swagger UI (/docs) is off: it loads a CDN script
        ("service metrics", f"{service_url}/metrics"),
        ("rank metrics", f"http://{LOOPBACK}:{metrics_base}/metrics"
                         + (f" ... :{metrics_base + ranks - 1}/metrics (rank r on {metrics_base} + r)" if ranks > 1 else "")),
    ]
    for name, url in lines:
        out.print(f"{name:<16} {url}", soft_wrap=True, markup=False)
    if hint:
        out.print("[dim](the service and exporters stop with the demo; --hold SECONDS keeps them up)[/dim]")

