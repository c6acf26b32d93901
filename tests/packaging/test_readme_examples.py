"""The README's `capwatch plan` examples print what the README shows, run as written in the base install
(``pip install .`` with no extras: ``tests/support/base_install.py``), in a pipe as a reader copies them (issue #31,
symptom 9: `plan` outputs were shown in a format the tool no longer prints). And the README says what is true of
installing and of what is supported. ``python -m tests.packaging.test_readme_examples`` rewrites the outputs."""

from __future__ import annotations

import re
import shlex
import sys

import pytest

from tests.support import launcher
from tests.support.base_install import build_base_venv
from tests.support.checkout import REPO_ROOT
from tests.support.service import needs_service_venv, require_current_install

README = REPO_ROOT / "README.md"
BLOCK = re.compile(r"```console\n(.*?)```", re.S)


def plan_examples(text: str) -> list[tuple[str, str]]:
    """(command, the output shown) for every `$ capwatch plan ...` in a console block."""
    examples = []
    for block in BLOCK.findall(text):
        parts = re.split(r"^\$ ", block, flags=re.M)
        for part in parts[1:]:
            command, _, output = part.partition("\n")
            if command.startswith("capwatch plan ") and "|" not in command:
                examples.append((command, output.rstrip("\n")))
    return examples


def printed(python, command: str, folder) -> str:
    result = launcher.run("-m", "capwatch", *shlex.split(command)[1:], python=python, env={"PATH": "/usr/bin:/bin"},
                          inherit_env=False, cwd=folder, timeout_s=120)
    return "\n".join(line.rstrip() for line in (result.stdout + result.stderr).rstrip("\n").splitlines())


@pytest.fixture(scope="module")
def base_python(tmp_path_factory):
    require_current_install()
    return build_base_venv(tmp_path_factory.mktemp("readme-venv") / "venv")


def test_the_readme_shows_plan_examples():
    assert len(plan_examples(README.read_text())) >= 6


@needs_service_venv
@pytest.mark.parametrize("index", range(len(plan_examples(README.read_text()))))
def test_each_plan_example_prints_what_the_readme_shows(base_python, tmp_path, index):
    command, shown = plan_examples(README.read_text())[index]
    assert printed(base_python, command, tmp_path) == "\n".join(line.rstrip() for line in shown.splitlines())


def test_the_readme_says_what_is_supported_and_how_to_install():
    text = README.read_text()
    head = text[:text.index("## Two commands")]
    for engine in ("vLLM", "TensorRT-LLM"):  # named only as not supported yet (MoRI is, since issue #34)
        for sentence in re.findall(rf"[^.]*{engine}[^.]*\.", text):
            assert "not supported" in sentence or "not yet" in sentence, sentence
    assert "0.5.19" in head and "0.5.23" in head and "DeepEP" in head and "FlashInfer" in head
    assert "pip install a2a-capwatch" not in text  # not on the package index
    assert "pip install ." in text
    assert "Needs `pip install 'a2a-capwatch[service]'`" not in text  # advise --sglang-log runs on the base install
    assert (REPO_ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")


if __name__ == "__main__":
    import tempfile
    from pathlib import Path

    folder = Path(tempfile.mkdtemp())
    python = build_base_venv(folder / "venv")
    text = README.read_text()
    for command, shown in plan_examples(text):
        text = text.replace(f"$ {command}\n{shown}\n", f"$ {command}\n{printed(python, command, folder)}\n", 1)
    README.write_text(text)
    sys.exit(0)
