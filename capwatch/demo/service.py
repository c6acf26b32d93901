"""Start ``capwatch serve`` as a child process on a loopback port and wait until it answers.

The one launcher of the service: the demo's embedded service, and the tests' and benchmarks' real
server (not an in-process app). It runs ``python -m capwatch serve`` with this interpreter and
``PYTHONSAFEPATH=1``, so it serves the capwatch this process imports (installed or editable), never a
``capwatch/`` folder that happens to be in its working folder (``-m`` would put that first: in a checkout, a
half package without its subpackages). Port: the one given, or a free one
(:func:`capwatch.demo.ports.free_port`); the service's own default is 8321.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from capwatch.demo.ports import LOOPBACK, free_port


class ServiceProcess:
    """``env`` is added to this process's environment (or is the whole environment with
    ``inherit_env=False``); ``python`` is the interpreter whose capwatch serves (another venv's)."""

    def __init__(self, db_path: Path | str, port: int | None = None, extra_args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, log_path: Path | str | None = None, *,
                 python: Path | str = sys.executable, inherit_env: bool = True, cwd: Path | str | None = None):
        self.python = str(python)
        self.inherit_env = inherit_env
        self.cwd = cwd
        self.db_path = Path(db_path)
        self.port = port or free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.extra_args = extra_args
        self.env = env or {}
        self.log_path = Path(log_path) if log_path else self.db_path.with_suffix(".log")
        self.process: subprocess.Popen | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout_s: float = 30.0) -> "ServiceProcess":
        if self.running:  # a second process would orphan the first (nothing would stop it)
            raise RuntimeError(f"capwatch serve is already running on {self.url}")
        env = {**os.environ, **self.env} if self.inherit_env else dict(self.env)
        env["PYTHONSAFEPATH"] = "1"
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [self.python, "-m", "capwatch", "serve", "--host", LOOPBACK, "--port", str(self.port),
             "--db", str(self.db_path), "--log-level", "warning", *self.extra_args],
            env=env, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"capwatch serve exited with {self.process.returncode}: "
                                   f"{self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1) as response:
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"capwatch serve did not answer on {self.url} within {timeout_s} s")

    def kill(self) -> None:
        """SIGKILL the whole process group: no shutdown hook runs."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> "ServiceProcess":
        # ``with ServiceProcess(...):`` starts it; ``with service.start(timeout_s=60):`` is already started.
        return self if self.running else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
