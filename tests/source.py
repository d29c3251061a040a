"""Parsing the project's own source in tests."""

from __future__ import annotations

import ast
import functools
from pathlib import Path


def parse(path: Path) -> ast.Module:
    """ast.parse of a file, retried once on CPython 3.11.7's spurious "AST constructor
    recursion depth mismatch" SystemError: its AST builder keeps the recursion depth in
    shared state that an earlier failure, or another thread (here: a refused Pulumi run's
    leftover futures, logged while the test runs), can leave off (python/cpython#106905,
    fixed by #106906 in later 3.11 releases). A real syntax error still raises.

    Several tests walk every module of the package: a file is parsed once per text and the
    tree shared, so callers read it and never change it."""
    return _parse(str(path), path.read_text())


@functools.cache
def _parse(path: str, text: str) -> ast.Module:
    try:
        return ast.parse(text, filename=path)
    except SystemError as error:
        if "recursion depth mismatch" not in str(error):
            raise
        return ast.parse(text, filename=path)
