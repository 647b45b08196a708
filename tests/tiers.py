"""Which cases of a parametrized sweep run in ``make test-fast``.

A sweep (every stage count, every lane type and operator, every seed) keeps a few cases in the fast tier,
chosen to cover each axis once, and gives the others the ``slow`` mark: ``make test`` runs every case.
"""

from __future__ import annotations

from typing import Callable, Iterable

import pytest

__all__ = ["sweep"]


def sweep(cases: Iterable, fast: Callable[..., bool], ids: Callable | None = None) -> list:
    """``cases`` (tuples of a parametrize's arguments, or single values) as ``pytest.param``s, each marked
    slow unless ``fast(*case)``; ``ids(*case)`` names a case (default: pytest's own ids)."""
    params = []
    for case in cases:
        args = case if isinstance(case, tuple) else (case,)
        params.append(pytest.param(*args, marks=() if fast(*args) else (pytest.mark.slow,),
                                   id=ids(*args) if ids else None))
    return params
