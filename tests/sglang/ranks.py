"""Launch SGLang scheduler ranks (``rank_program.py``) of one release with the sglang venv's python (forked from a
zygote, ``zygotes.py``, or fresh), scrape them."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import torch
from prometheus_client.parser import text_string_to_metric_families

from tests.sglang import zygotes
from tests.sglang.releases import RELEASES, missing, release_path
from tests.support import launcher
from tests.support.checkout import REPO_ROOT
from tests.support.ports import free_port

SGLANG_VENV = REPO_ROOT / ".venv-sglang"
START_TIMEOUT_S = 240  # importing sglang takes ~10 s a process (or a zygote) on a quiet machine, more on a busy one
EXIT_TIMEOUT_S = 60
UNSET = ("PROMETHEUS_MULTIPROC_DIR",)  # a rank's variables that the test run's own must not set

# A tiny MoE (Qwen2-MoE shape): what ServerArgs reads from the model folder, nothing to download.
MODEL = {"hidden_size": 64, "top_k": 2, "num_experts": 8}
MODEL_CONFIG = {
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": MODEL["hidden_size"],
    "intermediate_size": 128, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 0,
    "num_experts": MODEL["num_experts"], "num_experts_per_tok": MODEL["top_k"], "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16", "decoder_sparse_step": 1, "norm_topk_prob": True,
}


def sglang_python() -> Path:
    return Path(os.environ.get("CAPWATCH_SGLANG_PYTHON", SGLANG_VENV / "bin" / "python"))


def sglang_missing() -> str | None:
    """Why the SGLang tests cannot run here, or None."""
    python = sglang_python()
    if not python.exists():
        return f"no sglang test venv at {python.parent.parent} (make test builds it)"
    absent = missing()
    if absent:
        return (f"the SGLang tests' folders of {', '.join(absent)} (sglang releases, unpinned folders) are not "
                "installed (make test installs them)")
    # find_spec, not import: importing sglang takes seconds.
    check = "import importlib.util as u, sys; sys.exit(0 if u.find_spec('sglang') and u.find_spec('capwatch') else 1)"
    if launcher.run("-c", check, python=python, path_first=release_path(RELEASES[-1]), timeout_s=60).returncode != 0:
        return f"{python} has no capwatch installed, or the sglang release folders no sglang"
    return None


@dataclass
class RankRun:
    """One group of ranks: the plan, the processes, their logs and records."""

    run_dir: Path
    world: int
    env: dict[str, str]
    sglang_release: str = RELEASES[-1]  # the sglang release the ranks run (its folder first on PYTHONPATH)
    # Folders before the release's own (a test's fake dist-info that says another version).
    extra_path: tuple[Path, ...] = ()
    optimize: bool = False
    metrics_base_port: int = 0
    program: str = "tests.sglang.rank_program"  # a module run as ``python -m PROGRAM RUN_DIR RANK``
    # Forked from a zygote that imported sglang once (zygotes.py); False: each rank a fresh ``python -m``.
    fork: bool = True
    processes: list[subprocess.Popen | zygotes.ForkedRank] = field(default_factory=list)

    def start(self, plan: dict) -> "RankRun":
        model_dir = self.run_dir / "model"
        model_dir.mkdir(parents=True, exist_ok=True)
        (model_dir / "config.json").write_text(json.dumps(MODEL_CONFIG))
        full_plan = {"world": self.world, "master_port": free_port(), "model_dir": str(model_dir), "model": MODEL,
                     **plan}
        (self.run_dir / "plan.json").write_text(json.dumps(full_plan))
        for rank in range(self.world):
            log_path = self.run_dir / f"rank-{rank}.log"
            if self._forks():
                self.processes.append(zygotes.start_rank(
                    self.program, str(self.run_dir), str(rank), python=sglang_python(), flags=self._flags(),
                    env=self.env, unset=UNSET, cwd=self.run_dir, log=log_path, path_first=self._path_first(),
                    ready_timeout_s=START_TIMEOUT_S))
                continue
            with open(log_path, "wb") as log:
                self.processes.append(launcher.start(
                    *self._flags(), "-m", self.program, str(self.run_dir), str(rank), python=sglang_python(),
                    env=self.env, unset=UNSET, imports_tests=True, cwd=self.run_dir, stdout=log,
                    path_first=self._path_first(), stderr=subprocess.STDOUT))
        return self

    def warm(self) -> "RankRun":
        """The zygote this run's ranks will fork from, importing from now on (several warm side by side)."""
        if self._forks():
            zygotes.warm(sglang_python(), self._flags(), self.env, UNSET, self._path_first(), START_TIMEOUT_S)
        return self

    def _forks(self) -> bool:
        return self.fork and not zygotes.fresh_ranks()

    def _flags(self) -> list[str]:
        return ["-O"] if self.optimize else []

    def _path_first(self) -> list[Path]:
        return [*self.extra_path, *release_path(self.sglang_release)]

    def wait_ready(self, mark: str = "ready") -> None:
        """Until every rank has written ``<mark>-<rank>`` (its program's ``ready``, or another point it reached)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all((self.run_dir / f"{mark}-{rank}").exists() for rank in range(self.world)):
            failed = [rank for rank, process in enumerate(self.processes) if process.poll() is not None]
            if failed or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"ranks {failed or 'all'} did not reach {mark}:\n{self.logs()}")
            time.sleep(0.2)

    def release(self) -> list[int]:
        (self.run_dir / "release").write_text("")
        return self.wait_exit()

    def wait_exit(self, timeout_s: float = EXIT_TIMEOUT_S) -> list[int]:
        codes = []
        deadline = time.monotonic() + timeout_s
        for process in self.processes:
            try:
                codes.append(process.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"a rank did not exit:\n{self.logs()}") from None
        return codes

    def kill(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)

    def log(self, rank: int) -> str:
        return (self.run_dir / f"rank-{rank}.log").read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(f"--- rank {rank} ---\n{self.log(rank)[-3000:]}" for rank in range(self.world))

    def record(self, rank: int) -> dict:
        return torch.load(self.run_dir / f"rank-{rank}.pt")

    def metrics(self, rank: int) -> dict[tuple[str, tuple], float]:
        """Every sample of the rank's /metrics: (name, sorted labels) -> value."""
        url = f"http://127.0.0.1:{self.metrics_base_port + rank}/metrics"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(url, timeout=10) as response:
            text = response.read().decode()
        return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
                for family in text_string_to_metric_families(text) for sample in family.samples}
