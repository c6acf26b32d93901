"""SGLang ranks forked from a zygote (``rank_zygote.py``) instead of each importing sglang again: about 10 s of
CPU saved a rank, most of what the plugin's tests cost.

A zygote serves one interpreter, its flags (``-O``), and the environment it was started with, its path (one
release's folders) included. A rank is forked from one only where its environment differs from the zygote's
in nothing the import read by name (the reads the zygote reported decide), and only in the variables these tests
set (``SGLANG_*``, ``CAPWATCH_*``; pytest's ``PYTEST_CURRENT_TEST``). Otherwise another zygote starts, with the
rank's environment. Zygotes live until ``stop_all`` (the sglang tests' package fixture), at most
``MAX_ZYGOTES`` at a time.

``CAPWATCH_TEST_FRESH_RANKS=1`` starts every rank as a fresh ``python -m`` instead (``RankRun(fork=False)`` does
so for one run), as does a machine with an NVIDIA GPU (``fresh_ranks``).
"""

from __future__ import annotations

import glob
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Collection, Sequence
from pathlib import Path

from tests.support import launcher

# What differs from run to run: the tests' settings, and the test pytest names in each child's environment.
VARIES = ("SGLANG_", "CAPWATCH_", "PYTEST_CURRENT_TEST")


def fresh_ranks() -> bool:
    """Every rank a fresh ``python -m``: when asked, and on a machine with an NVIDIA GPU, where sglang's import
    initializes CUDA (its module-level ``is_cuda()``), which a forked child can no longer use."""
    return os.environ.get("CAPWATCH_TEST_FRESH_RANKS") == "1" or bool(glob.glob("/dev/nvidia[0-9]*"))


class Messages:
    """The JSON lines a zygote sends on one connection, one at a time: two can arrive in one read (a child that
    ends at once: its pid and its exit code)."""

    def __init__(self, connection: socket.socket):
        self.connection, self._buffer = connection, b""

    def next(self, timeout: float | None) -> dict | None:
        """The next message; None past ``timeout`` (seconds; None: no limit); EOFError if the zygote closed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.connection], [], [], left)[0]:
                return None
            chunk = self.connection.recv(65536)
            if not chunk:
                raise EOFError
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def close(self) -> None:
        self.connection.close()


class ForkedRank:
    """A rank forked by a zygote: the part of ``subprocess.Popen`` the tests use (``pid``, ``returncode``,
    ``poll``, ``wait``, ``kill``). Its exit code comes from the zygote, its parent."""

    def __init__(self, messages: Messages, pid: int, args: Sequence[str]):
        self.pid, self.args, self.returncode = pid, list(args), None
        self._messages = messages

    def poll(self) -> int | None:
        return self._returncode(0)

    def wait(self, timeout: float | None = None) -> int:
        returncode = self._returncode(timeout)
        if returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return returncode

    def kill(self) -> None:
        try:
            running = self.poll() is None  # an exit already reported: its pid is no longer this rank's
        except RuntimeError:  # its zygote is gone: the rank may still run
            running = True
        if running:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _returncode(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            try:
                message = self._messages.next(timeout)
            except (EOFError, OSError):
                raise RuntimeError(f"the zygote of rank process {self.pid} ({' '.join(self.args)}) ended "
                                   "before it") from None
            if message is not None:
                self.returncode = message["returncode"]
                self._messages.close()
        return self.returncode


class Zygote:
    """One ``rank_zygote`` process: started, then ready once it has imported and said what it read."""

    def __init__(self, python: Path | str, flags: Sequence[str], env: dict[str, str], *, ready_timeout_s: float,
                 unset: Collection[str] = (), path_first: Sequence[Path | str] = (), first_import: str = ""):
        """Started by ``launcher.start`` as a rank would be (``env``, ``unset``, ``path_first`` as there), ready
        within ``ready_timeout_s`` (its import: a rank's start-up); ``first_import``: the zygote's default
        (SGLang's scheduler module) unless a test of the zygote names another."""
        self.python, self.flags, self.ready_timeout_s = str(python), tuple(flags), ready_timeout_s
        self.env = launcher.environment(env, imports_tests=True, unset=unset, path_first=path_first)
        self.folder = Path(tempfile.mkdtemp(prefix="capwatch-zygote-"))  # short: a socket path has 108 bytes
        self.socket_path = self.folder / "socket"
        self._log = self.folder / "zygote.log"
        with open(self._log, "wb") as log:
            self.process = launcher.start(
                *self.flags, "-m", "tests.sglang.rank_zygote", str(self.socket_path),
                *([first_import] if first_import else []), python=python, env=env, unset=unset, imports_tests=True,
                path_first=path_first, cwd=self.folder, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)
        self.reads: dict[str, str | None] | None = None

    def serves(self, python: Path | str, flags: Sequence[str]) -> bool:
        """Its interpreter and flags (its path is in the environment ``accepts`` compares)."""
        return (str(python), tuple(flags)) == (self.python, self.flags)

    def accepts(self, env: dict[str, str]) -> bool:
        """Whether a rank with this environment is what a fresh process would be (see the module docstring):
        decided without the zygote where a variable outside ``VARIES`` differs, else once it is ready."""
        differ = {key for key in env.keys() | self.env.keys() if env.get(key) != self.env.get(key)}
        if not all(key.startswith(VARIES) for key in differ):
            return False
        self._wait_ready()
        return not differ & self.reads.keys()

    def fork(self, module: str, args: Sequence[str], env: dict[str, str], cwd: Path | str, log: Path) -> ForkedRank:
        self._wait_ready()
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(str(self.socket_path))
        connection.sendall(json.dumps({"module": module, "args": list(args), "env": env, "cwd": str(cwd),
                                       "log": str(log)}).encode() + b"\n")
        messages = Messages(connection)
        try:
            forked = messages.next(None)
        except EOFError:
            raise RuntimeError(f"the zygote did not fork {module}:\n{self._tail()}") from None
        return ForkedRank(messages, forked["pid"], [module, *args])

    def stop(self) -> None:
        """SIGTERM: the zygote kills the ranks it still has and exits (SIGKILL if it does not)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process.wait(timeout=30)
        self.process.stdout.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def is_ready(self) -> bool:
        """Ready now (its line read if it is there), without waiting."""
        if self.reads is None and select.select([self.process.stdout], [], [], 0)[0]:
            self._wait_ready()
        return self.reads is not None

    def _wait_ready(self) -> None:
        if self.reads is not None:
            return
        deadline = time.monotonic() + self.ready_timeout_s
        stdout = self.process.stdout
        while not select.select([stdout], [], [], 1.0)[0]:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self._fail("did not get ready")
        line = stdout.readline()
        if not line:
            self._fail("ended before it was ready")
        self.reads = json.loads(line)["reads"]

    def _fail(self, what: str) -> None:
        """Stopped and forgotten (no later rank waits on it), and the test fails with its log."""
        tail = self._tail()
        self.stop()
        if self in _zygotes:
            _zygotes.remove(self)
        raise RuntimeError(f"the rank zygote {what}:\n{tail}")

    def _tail(self) -> str:
        return self._log.read_text(errors="replace")[-3000:] if self._log.exists() else ""


# Each holds torch and sglang imported (about 0.7 GB): the least recently used stops past this many.
MAX_ZYGOTES = 8
_zygotes: list[Zygote] = []  # least recently used first


def start_rank(module: str, *args: str, python: Path | str, flags: Sequence[str] = (), env: dict[str, str],
               unset: Collection[str] = (), cwd: Path | str, log: Path, path_first: Sequence[Path | str] = (),
               ready_timeout_s: float) -> ForkedRank:
    """``python [FLAGS] -m MODULE ARGS`` as ``launcher.start`` would run it (its environment, a folder outside
    the checkout, output into ``log``), forked from a zygote that agrees with it (a new one ready within
    ``ready_timeout_s``)."""
    zygote, environment = _zygote_for(python, flags, env, unset, path_first, ready_timeout_s, wait=True)
    return zygote.fork(module, args, environment, launcher.outside_checkout(cwd), log)


def warm(python: Path | str, flags: Sequence[str], env: dict[str, str], unset: Collection[str],
         path_first: Sequence[Path | str], ready_timeout_s: float) -> None:
    """The zygote ranks with this environment will fork from, started now unless a ready one agrees: an import
    uses one core, so several warm side by side. One still importing is not asked (warm distinct ones)."""
    _zygote_for(python, flags, env, unset, path_first, ready_timeout_s, wait=False)


def _zygote_for(python: Path | str, flags: Sequence[str], env: dict[str, str], unset: Collection[str],
                path_first: Sequence[Path | str], ready_timeout_s: float, *,
                wait: bool) -> tuple[Zygote, dict[str, str]]:
    """One that agrees with the rank's whole environment (returned with it; the zygote the most recently used
    after this), else a new one: the least recently used stops past ``MAX_ZYGOTES``."""
    environment = launcher.environment(env, imports_tests=True, unset=unset, path_first=path_first)
    zygote = next((each for each in _zygotes if each.serves(python, flags) and (wait or each.is_ready())
                   and each.accepts(environment)), None)
    if zygote is None:
        zygote = Zygote(python, flags, env, ready_timeout_s=ready_timeout_s, unset=unset, path_first=path_first)
        if len(_zygotes) >= MAX_ZYGOTES:
            _zygotes.pop(0).stop()
    else:
        _zygotes.remove(zygote)
    _zygotes.append(zygote)
    return zygote, environment


def stop_all() -> None:
    while _zygotes:
        _zygotes.pop().stop()
