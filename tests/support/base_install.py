"""The base install, ``pip install a2a-capwatch`` with no extras, in a clean venv, built offline: a fresh venv
holding exactly the distributions in a2a-capwatch's base dependency closure, taken file by file (their RECORD)
from ``.venv-service``, where pip installed them and the product (non-editable). What a laptop that ran
``pip install a2a-capwatch`` (or ``pip install .``) has, and nothing of the service's or the demo's extras."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.support.service import INSTALLED_PYTHON

# Python run in an installed venv: the distributions of a2a-capwatch's base dependency closure (no extras), read from
# the installed metadata. Both the base venv's build (below) and the base commands' import check
# (tests/packaging/test_service_without_torch.py) start their scripts with it.
BASE_CLOSURE = """
import importlib.metadata as metadata
from pip._vendor.packaging.requirements import Requirement

def base_closure():
    \"\"\"{normalized name: Distribution} of the base install's closure.\"\"\"
    wanted, found = ["a2a-capwatch"], {}
    while wanted:
        name = wanted.pop()
        key = name.lower().replace("_", "-")
        if key in found:
            continue
        found[key] = distribution = metadata.distribution(name)
        for line in distribution.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                wanted.append(requirement.name)
    return found
"""

# Run by .venv-service's python: every file of every distribution in the base closure, (relative to its
# site-packages, where it lies).
BASE_FILES = BASE_CLOSURE + """
import json
closure = base_closure()
files = [(str(path), str(distribution.locate_file(path))) for distribution in closure.values()
         for path in distribution.files or [] if not str(path).startswith("..")]
print(json.dumps({"distributions": sorted(closure), "files": files}))
"""


def build_base_venv(folder: Path) -> Path:
    """A venv at ``folder`` with the base install; its python."""
    subprocess.run([str(INSTALLED_PYTHON), "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    listing = subprocess.run([str(INSTALLED_PYTHON), "-c", BASE_FILES], check=True, capture_output=True, text=True,
                             timeout=120, cwd=folder)
    target = next(folder.glob("lib/python3*/site-packages"))
    for name, located in json.loads(listing.stdout)["files"]:  # a venv may see another's site-packages (a .pth)
        origin, copy = Path(located), target / name
        if origin.is_file() and not copy.exists():
            copy.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(origin, copy)
    return folder / "bin" / "python"
