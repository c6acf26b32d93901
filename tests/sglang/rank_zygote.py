"""A zygote for SGLang rank programs: one process of the sglang test venv, for one release's folders and one
environment, that imports once what every rank imports first and forks each rank from there
(``tests/sglang/zygotes.py`` starts it and asks it for ranks).

A rank started as ``python -m PROGRAM`` spends about 10 s of CPU importing sglang (torch, transformers,
FlashInfer, SGLang's own modules) before it does anything a test looks at, and the suite starts dozens. A
scheduler process of SGLang's starts by importing ``sglang.srt.managers.scheduler`` (``multiprocessing``'s spawn
imports the module of ``run_scheduler_process`` before calling it); the zygote imports exactly that, then forks
a child per request. The child takes the request's environment, working folder and log, and runs the program as
``python -m`` does (``runpy``, as ``__main__``): ``load_plugins()``, where capwatch is first imported, and all
after it run in the child as in a fresh process. Nothing else runs in the zygote: no thread of Python's, no torch
op, no collective.

What a child cannot take from its request is what the import already read. The zygote records each variable the
import read by name (``os.environ[...]``, ``get``, ``in``, ``setdefault``) with the value it saw (None: absent)
and says them when ready; the client forks a rank only where its environment agrees with them. Scans of the whole
environment (tqdm, networkx, fsspec and sglang look for their own prefixes: TQDM_, NETWORKX_, FSSPEC_, SGL_) are
not reads by name. What the import wrote into the environment (sglang points third-party caches at its own
folder) is written into each child's too.

Protocol, one JSON line each way on a Unix socket: the zygote prints ``{"reads": {...}}`` on stdout once it is
ready; a request ``{"module", "args", "env", "cwd", "log"}`` is answered ``{"pid"}`` once forked and
``{"returncode"}`` (as ``subprocess`` gives it) when the child ends. The zygote exits on SIGTERM or when the
process that started it is gone, killing the children it still has.

    python [-O] -m tests.sglang.rank_zygote SOCKET [FIRST_IMPORT]

FIRST_IMPORT: another module in place of SGLang's scheduler (the zygote's own tests, ``test_zygotes.py``).
Not here: a separate hash seed per child (children of one zygote share it, as they share what the import
built), and a machine with a GPU (``zygotes.fresh_ranks``).
"""

from __future__ import annotations

import collections
import gc
import json
import os
import runpy
import selectors
import signal
import socket
import sys

# What SGLang's spawned scheduler imports before run_scheduler_process runs (its module).
FIRST_IMPORT = "sglang.srt.managers.scheduler"
PARENT_CHECK_S = 1.0
REQUEST_TIMEOUT_S = 10.0  # a client that connects and sends nothing must not hold the zygote


class EnvironmentReads:
    """Each variable read by name while installed, with the value it had then. A scan's own reads are not
    counted: the keys iterating the environment yielded, read in the order they came, as ``items()``,
    ``copy()`` and ``dict(os.environ)`` read them; any other read ends the scan's turn."""

    def __init__(self):
        self.values: dict[str, str | None] = {}
        self._scanned: collections.deque[str] = collections.deque()
        self._environ_type = type(os.environ)
        self._originals = (self._environ_type.__getitem__, self._environ_type.__iter__)

    def __enter__(self) -> "EnvironmentReads":
        getitem, iterate = self._originals
        values, scanned = self.values, self._scanned

        def recording_getitem(environ, key):
            if scanned and scanned[0] == key:  # a scan reading what it just listed
                scanned.popleft()
                return getitem(environ, key)
            scanned.clear()
            try:
                value = getitem(environ, key)
            except KeyError:
                values.setdefault(key, None)
                raise
            values.setdefault(key, value)
            return value

        def recording_iter(environ):
            for key in iterate(environ):
                scanned.append(key)
                yield key

        self._environ_type.__getitem__, self._environ_type.__iter__ = recording_getitem, recording_iter
        return self

    def __exit__(self, *exc) -> None:
        self._environ_type.__getitem__, self._environ_type.__iter__ = self._originals


def _send(connection: socket.socket, message: dict) -> None:
    try:
        connection.sendall(json.dumps(message).encode() + b"\n")
    except OSError:  # the client is gone; its child is still reaped
        pass


def import_recorded(first_import: str) -> tuple[dict[str, str | None], dict[str, str | None]]:
    """``first_import`` imported: the variables it read by name (with their values) and what it wrote into the
    environment (None: removed). Whatever it prints goes to the log: stdout carries only the ready line."""
    before = dict(os.environ)
    stdout = os.dup(1)
    os.dup2(2, 1)
    with EnvironmentReads() as reads:
        __import__(first_import)
    sys.stdout.flush()
    os.dup2(stdout, 1)
    os.close(stdout)
    written = {key: value for key, value in os.environ.items() if before.get(key) != value}
    written.update({key: None for key in before if key not in os.environ})
    return reads.values, written


def serve(socket_path: str, first_import: str = FIRST_IMPORT) -> tuple[dict, dict[str, str | None]]:
    """Imports, says ready, forks a child per request. Returns only in a child: its request, and what the import
    wrote into the environment (None: removed)."""
    reads, written = import_recorded(first_import)
    # What the import made stays out of the children's collections (Python's advice for a fork without exec):
    # their pages stay shared, and a child's exit does not walk them (about 3 s of CPU a rank otherwise).
    gc.freeze()

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(16)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    stopping = []
    # Handlers only to wake the select below (the wakeup fd), and to stop on SIGTERM; a child gets the import's back.
    import_handlers = {signal.SIGCHLD: signal.signal(signal.SIGCHLD, lambda *_: None),
                       signal.SIGTERM: signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))}
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    parent = os.getppid()
    print(json.dumps({"reads": reads}), flush=True)

    while os.getppid() == parent and not stopping:
        for key, _ in selector.select(timeout=PARENT_CHECK_S):
            if key.fileobj is listener:
                connection, _ = listener.accept()
                try:
                    connection.settimeout(REQUEST_TIMEOUT_S)
                    request = json.loads(connection.makefile("rb").readline())  # one line; cut short: invalid
                    connection.settimeout(None)
                    pid = os.fork()
                except (OSError, ValueError):  # a client gone mid-request, or not one, or no fork: others go on
                    connection.close()
                    continue
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    for number, handler in import_handlers.items():
                        signal.signal(number, handler)
                    for each in (selector, listener, connection, *children.values()):
                        each.close()
                    os.close(wake_read)
                    os.close(wake_write)
                    return request, written
                _send(connection, {"pid": pid})
                children[pid] = connection
            else:
                os.read(wake_read, 4096)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            connection = children.pop(pid, None)  # None: a process the import started
            if connection is not None:
                _send(connection, {"returncode": os.waitstatus_to_exitcode(status)})
                connection.close()
    for pid in children:  # stopped, or the test run that started the zygote is gone: so are its ranks
        os.kill(pid, signal.SIGKILL)
    sys.exit(0)


def become(request: dict, written: dict[str, str | None]) -> None:
    """This forked child turns into the requested ``python -m MODULE ARGS``: output into its log, stdin from
    /dev/null, its environment (with what the import wrote), working folder."""
    environment = dict(request["env"])
    for key, value in written.items():
        if value is None:
            environment.pop(key, None)
        else:
            environment[key] = value
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)  # first: what fails is in it
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.environ.clear()
    os.environ.update(environment)
    os.chdir(request["cwd"])
    sys.argv = [request["module"], *request["args"]]  # random is reseeded by CPython itself after a fork


if __name__ == "__main__":
    child_request, import_wrote = serve(*sys.argv[1:3])
    become(child_request, import_wrote)
    runpy.run_module(child_request["module"], run_name="__main__", alter_sys=True)
