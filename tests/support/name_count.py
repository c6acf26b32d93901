"""Which product modules name a word in their code: by token, comments and docstrings left out.

The issue's count ("code outside a backend's own modules names that backend in at most three modules"): a
module names ``deepep`` when one of its names (identifiers, attributes, imported modules) or string literals
other than a docstring contains it, case-insensitive."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

from tests.support.checkout import REPO_ROOT


def _docstring_lines(source: str) -> set[int]:
    """The lines of every module, class and function docstring (their string tokens are prose, not code)."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def names_word(source: str, word: str) -> bool:
    """Whether ``source``'s code (not its comments or docstrings) holds ``word`` in a name or a string."""
    word = word.lower()
    docstrings = _docstring_lines(source)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NAME and word in token.string.lower():
            return True
        if (token.type == tokenize.STRING or token.type == getattr(tokenize, "FSTRING_MIDDLE", -1)) \
                and token.start[0] not in docstrings and word in token.string.lower():
            return True
    return False


def modules_naming(word: str, folders: list[str]) -> set[str]:
    """The product files (paths relative to the repository) under ``folders`` whose code names ``word``."""
    found = set()
    for folder in folders:
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            if names_word(path.read_text(), word):
                found.add(str(Path(path).relative_to(REPO_ROOT)))
    return found
