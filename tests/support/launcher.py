"""Every child Python a test or benchmark starts (``python -m capwatch ...``, a rank program, a probe), started
one way: as a user's would run, seeing capwatch only as it is installed.

- Its working folder lies outside the checkout (``WORKDIR``, or a folder the caller names): ``python -m`` and
  ``-c`` put the working folder on ``sys.path``, and the checkout's root there makes ``service`` importable
  beside ``capwatch.service``, and an installed capwatch lose to the checkout's half package.
- ``PYTHONSAFEPATH=1``: nothing joins ``sys.path`` implicitly, in the child or in the children it starts.
- ``PYTHONPATH`` is the checkout's root only for a child that imports ``tests.*`` (``imports_tests=True``: a
  rank program, a benchmark), and importing ``tests`` installs the one-name guard there
  (``tests/support/one_name.py``). Every other child gets no ``PYTHONPATH``.

``run`` waits for the child (its whole process group is killed past ``timeout_s``), ``start`` returns it running,
``environment`` is what both give it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from tests.support.checkout import REPO_ROOT

PYTHON = sys.executable  # this test run's interpreter (the .venv, capwatch installed editable)
WORKDIR = Path(tempfile.gettempdir())
# The launcher sets these; a caller's value would undo what it is for.
OWN_VARIABLES = ("PYTHONPATH", "PYTHONSAFEPATH", "PYTHONHOME", "PYTHONSTARTUP")


def outside_checkout(folder: Path | str | None = None) -> Path:
    """``folder`` (``WORKDIR`` when None), refused if it lies in the checkout."""
    chosen = Path(folder) if folder is not None else WORKDIR
    resolved = chosen.resolve()
    if resolved == REPO_ROOT or REPO_ROOT in resolved.parents:
        raise ValueError(f"a child's working folder must lie outside the checkout {REPO_ROOT}: {chosen}")
    return chosen


def environment(extra: Mapping[str, str] | None = None, *, imports_tests: bool = False, inherit: bool = True,
                unset: Collection[str] = (), path_first: Sequence[Path | str] = ()) -> dict[str, str]:
    """This process's environment (or none, ``inherit=False``) less ``unset``, with ``extra`` on top, as a child
    gets it. ``path_first``: folders a test installed packages into (an SGLang release), on ``PYTHONPATH``
    before the checkout."""
    given = [name for name in OWN_VARIABLES if name in (extra or {})]
    if given:
        raise ValueError(f"the launcher sets {', '.join(given)} itself (imports_tests=True puts the checkout on "
                         f"the path of a child that imports tests.*)")
    env = {**(os.environ if inherit else {}), **(extra or {})}
    for name in (*OWN_VARIABLES, *unset):
        env.pop(name, None)
    env["PYTHONSAFEPATH"] = "1"
    path = [*map(str, path_first), *([str(REPO_ROOT)] if imports_tests else [])]
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    return env


def start(*args: str, python: Path | str = PYTHON, env: Mapping[str, str] | None = None, inherit_env: bool = True,
          unset: Collection[str] = (), imports_tests: bool = False, cwd: Path | str | None = None,
          path_first: Sequence[Path | str] = (), **popen) -> subprocess.Popen:
    """``python ARGS`` running (``python``: an interpreter, or a console script of one); ``popen`` goes to
    ``subprocess.Popen`` (stdout, start_new_session, ...)."""
    return subprocess.Popen([str(python), *args], cwd=outside_checkout(cwd), **popen,
                            env=environment(env, imports_tests=imports_tests, inherit=inherit_env, unset=unset,
                                            path_first=path_first))


def run(*args: str, timeout_s: float, input: str | bytes | None = None, text: bool = True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, **options) -> subprocess.CompletedProcess:
    """``python ARGS`` to its end, output captured (``start``'s options apply). Past ``timeout_s`` its process
    group (it and whatever it started) is killed and the test fails with what it printed."""
    process = start(*args, stdin=subprocess.PIPE if input is not None else None, stdout=stdout, stderr=stderr,
                    text=text, start_new_session=True, **options)
    try:
        out, err = process.communicate(input, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        out, err = process.communicate()
        raise AssertionError(f"python {' '.join(args)} ran past {timeout_s} s\nstdout:\n{out}\nstderr:\n{err}") \
            from None
    finally:
        _kill_group(process)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def run_capwatch(*args: str, timeout_s: float = 240, **options) -> subprocess.CompletedProcess:
    """``python -m capwatch ARGS``, as ``run``."""
    return run("-m", "capwatch", *args, timeout_s=timeout_s, **options)


def _kill_group(process: subprocess.Popen) -> None:
    """Kill the child's process group while the child runs (its pid names the group only until it is reaped)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
