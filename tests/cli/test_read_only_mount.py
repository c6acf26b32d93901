"""Issue #36 (symptom 9): a database on a read-only mount was refused without naming the mount (it read like a
permissions problem). A real read-only tmpfs, mounted in a private mount namespace (``unshare -rm``)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.support.launcher import PYTHON, environment, outside_checkout


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs none /mnt"], capture_output=True,
                          timeout=30).returncode == 0


pytestmark = pytest.mark.skipif(not _unshare_works(), reason="no private mount namespace (unshare -rm) here")


@pytest.mark.parametrize("existing", [False, True], ids=["new-file", "existing-file"])
def test_a_database_on_a_read_only_mount_names_the_mount(tmp_path, existing):
    mount = tmp_path / "ro"
    mount.mkdir()
    prepare = f"mount -t tmpfs none {mount} && "
    if existing:
        prepare += f"{PYTHON} -c \"import sqlite3; sqlite3.connect('{mount}/capwatch.db').close()\" && "
    script = (prepare + f"mount -o remount,ro {mount} && exec {PYTHON} -m capwatch serve --port 1 "
              f"--db {mount}/capwatch.db")
    result = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=120,
                            env=environment(), cwd=outside_checkout())
    assert result.returncode == 2, (result.stdout, result.stderr)
    line = result.stderr.strip()
    assert f"the file system mounted at {mount} is read-only" in line and "\n" not in line, line
