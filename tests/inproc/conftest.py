"""The fast loop (tests/inproc/harness.py): every test here is an ``async def``
run on a fresh ``ManualLoop``; the fixture ``h`` is a started in-process daemon."""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

import pytest

from tests.inproc.harness import Harness, run_on_manual_loop


class Unstarted:
    """The ``h`` fixture before the loop runs: the harness is made on the test's loop."""

    def __init__(self, root: Path) -> None:
        self.root = root


@pytest.fixture
def h(tmp_path: Path) -> Unstarted:
    return Unstarted(tmp_path)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    fn = pyfuncitem.obj
    if not inspect.iscoroutinefunction(fn):
        return None
    args: dict[str, Any] = {
        name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames
    }

    async def main() -> None:
        if isinstance(args.get("h"), Unstarted):
            async with Harness(args["h"].root) as harness:
                await fn(**{**args, "h": harness})
        else:
            await fn(**args)

    cwd = os.getcwd()  # a program run from its source changes to its run's folder
    try:
        run_on_manual_loop(main)
    finally:
        os.chdir(cwd)
    return True
