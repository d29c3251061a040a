"""Loading the project's scripts (bench/, which is not a package) in tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"


def load_script(path: Path, name: str) -> ModuleType:
    """The file at `path` as module `name`, registered in sys.modules first: dataclasses look their
    module up while a class is made."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
