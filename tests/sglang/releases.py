"""Each verified SGLang release, installed on its own for the plugin's tests: folders on PYTHONPATH.

The sglang test venv (``.venv-sglang``, the Makefile's ``sglang-venv``) holds one dependency set:
0.5.22 - 0.5.23's pins (torch 2.14.1, transformers 5.19.0), no sglang and no flashinfer. Each release
adds folders (``.sglang-releases/<requirement>``, each ``pip install --no-deps --target``, each once
however many releases share it): its released sglang wheel, its FlashInfer pin, and its own pins of what
its code imports on the tests' path where they differ from the set — 0.5.19 - 0.5.21 pin transformers
5.12.1 (with the huggingface-hub and tokenizers it accepts), 0.5.19 - 0.5.20 import xgrammar 0.2.1 at
start-up. A rank runs with its release's folders first on ``PYTHONPATH``. What no folder changes:
0.5.19 - 0.5.21 pin torch 2.13.0 and their tests run on torch 2.14.1 (PyPI's only torchvision for torch
2.13 is a CUDA build that cannot load beside the CPU torch 2.13 wheel, and sglang imports torchvision
at start-up; a CUDA torch 2.13 set would add about 2 GB of downloads to every fresh CI run).

    python -m tests.sglang.releases install FOLDER     # what `make sglang-venv` runs
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.support import launcher
from tests.support.checkout import REPO_ROOT

FOLDER = REPO_ROOT / ".sglang-releases"

# One folder each, named by its first requirement; huggingface-hub: the newest transformers 5.12.1 accepts.
GROUPS: dict[str, tuple[str, ...]] = {
    "transformers==5.12.1": ("transformers==5.12.1", "huggingface-hub==1.33.0", "tokenizers==0.22.2"),
}
# Each release's folders, its own sglang first (pins from its METADATA, checked by test_releases.py).
RELEASE_REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "0.5.19": ("sglang==0.5.19", "flashinfer-python==0.6.18", "transformers==5.12.1", "xgrammar==0.2.1"),
    "0.5.20": ("sglang==0.5.20", "flashinfer-python==0.6.18", "transformers==5.12.1", "xgrammar==0.2.1"),
    "0.5.21": ("sglang==0.5.21", "flashinfer-python==0.6.18", "transformers==5.12.1"),
    "0.5.22": ("sglang==0.5.22", "flashinfer-python==0.7.1"),
    "0.5.23": ("sglang==0.5.23", "flashinfer-python==0.7.2"),
}
RELEASES = tuple(RELEASE_REQUIREMENTS)
# Folders no release pins, for what the plugin says beside them: flashinfer-python 0.7.4 (no MoeAlltoAll, so no
# release's FlashinferDispatcher can be built with it; test_flashinfer_unavailable.py).
FLASHINFER_WITHOUT_MOE_ALLTOALL = "flashinfer-python==0.7.4"
UNPINNED_FOLDERS: tuple[str, ...] = (FLASHINFER_WITHOUT_MOE_ALLTOALL,)


def release_path(version: str, root: Path = FOLDER) -> list[Path]:
    """The folders to put first on PYTHONPATH for ``version``, its sglang first."""
    return [root / requirement for requirement in RELEASE_REQUIREMENTS[version]]


def _folders() -> list[str]:
    return list(dict.fromkeys([*(requirement for each in RELEASE_REQUIREMENTS.values() for requirement in each),
                               *UNPINNED_FOLDERS]))


def missing(root: Path = FOLDER) -> list[str]:
    """Releases whose folders are not (completely) installed, then the unpinned folders that are not."""
    return [version for version in RELEASES
            if not all((folder / ".installed").exists() for folder in release_path(version, root))] + \
        [requirement for requirement in UNPINNED_FOLDERS if not (root / requirement / ".installed").exists()]


# Folders install side by side: each is its own pip process and target, mostly download and unpack time.
PARALLEL_INSTALLS = 3


def _install_folder(root: Path, requirement: str) -> str | None:
    """One folder (skipped when installed); why it failed, or None."""
    folder = root.resolve() / requirement
    if (folder / ".installed").exists():
        return None
    installed = launcher.run("-m", "pip", "install", "-q", "--no-deps", "--upgrade", "--target", str(folder),
                             *GROUPS.get(requirement, (requirement,)), timeout_s=3600, stdout=None, stderr=None)
    if installed.returncode != 0:
        return f"pip could not install {requirement} into {folder} (exit {installed.returncode})"
    (folder / ".installed").write_text("")
    return None


def install(root: Path) -> None:
    """Each folder not yet installed, with this interpreter's pip (the sglang test venv's)."""
    with ThreadPoolExecutor(PARALLEL_INSTALLS) as pool:
        failures = [failure for failure in pool.map(lambda requirement: _install_folder(root, requirement), _folders())
                    if failure]
    if failures:
        sys.exit("\n".join(failures))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "install":
        sys.exit("usage: python -m tests.sglang.releases install FOLDER")
    install(Path(sys.argv[2]))
