"""Engines shared by a module's tests, each test starting from a fresh engine's state.

An engine is dear to build (its load check, its calibration), so a module builds it once; what it learns from
one test's answers (the budget's estimates, the drafters', the cost curve's timings) must not decide another's.
"""

import pytest

from engine.serve.engine import Engine


def forget(value) -> None:
    """Every engine in `value` (an engine, or a dict, tuple or list holding engines) forgets what it learnt."""
    if isinstance(value, Engine):
        value.forget_learning()
    elif isinstance(value, dict):
        for v in value.values():
            forget(v)
    elif isinstance(value, (tuple, list)):
        for v in value:
            forget(v)


def forgetting(*names: str):
    """An autouse fixture for a module: before each test that uses one of the fixtures `names`, the engines they
    hold forget their learning (Engine.forget_learning). Assign it to a module-level name to use it."""

    @pytest.fixture(autouse=True)
    def _forget(request):
        for name in names:
            if name in request.fixturenames:
                forget(request.getfixturevalue(name))

    return _forget
