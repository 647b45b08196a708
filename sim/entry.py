"""Entry points named by strings (``"package.module:function"``), so they can run in another process."""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from typing import Any, Callable

__all__ = ["load_entry", "entry_sys_path"]


def load_entry(entry: str | Callable) -> Callable:
    """The function named by ``"package.module:function"`` (a callable passes through)."""
    if callable(entry):
        return entry
    module, sep, name = str(entry).partition(":")
    if not sep or not module or not name:
        raise ValueError(f"entry={entry!r}: expected 'module:function'")
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"entry={entry!r}: {obj!r} is not callable")
    return obj


def entry_sys_path(module: str) -> list[str]:
    """The folder to put on ``sys.path`` so that ``module`` imports in the simulator process as it does
    here (a test module collected by pytest, say); empty when its file is not laid out by its name."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return []
    origin = Path(spec.origin).resolve()
    parts = module.split(".")
    tail = Path(*parts, "__init__.py") if origin.name == "__init__.py" else Path(*parts[:-1], parts[-1] + ".py")
    root = origin
    for _ in tail.parts:
        root = root.parent
    return [str(root)] if (root / tail).resolve() == origin else []
