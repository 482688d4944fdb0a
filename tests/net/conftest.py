"""Every net test runs on both the asyncio and the uvloop event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest
import uvloop
from net_helpers import Runner, T


@pytest.fixture(params=["asyncio", "uvloop"])
def arun(request: pytest.FixtureRequest) -> Runner:
    """Run a coroutine to completion on a fresh loop of the parametrised kind."""
    factory = asyncio.new_event_loop if request.param == "asyncio" else uvloop.new_event_loop

    def run(coro: Coroutine[Any, Any, T]) -> T:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(coro)

    return run
