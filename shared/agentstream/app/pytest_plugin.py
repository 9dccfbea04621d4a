"""A pytest plugin, registered by installing agentstream (entry point ``pytest11``, name
``agentstream``): ``async def`` tests run without a marker or a setting.

The testing kit (:mod:`agentstream.app.testing`) is used from ``async def`` tests (``async with
TestBed(app) as bed``). Under a plain pytest such a test fails with "async def functions are not
natively supported"; with pytest-asyncio installed in its default strict mode it needs
``@pytest.mark.asyncio`` on each test. This plugin runs a coroutine test function that no other
plugin has taken in a new event loop (``asyncio.run``), so the docs' testing example runs as written
in a fresh project.

What another plugin runs stays its own: pytest-asyncio turns the tests it takes (marked, or all
of them in its auto mode) into plain functions before this hook sees them, and a test marked
``anyio`` or ``trio`` is left to that plugin. Fixtures of the test are given as pytest resolves
them; an ``async def`` fixture still needs a plugin that runs it (pytest-asyncio, anyio). Turn
the plugin off with ``-p no:agentstream``.
"""

from __future__ import annotations

import asyncio
import inspect

import pytest

OTHER_PLUGINS_MARKERS = ("asyncio", "anyio", "trio")
"""Markers whose plugin runs the coroutine test itself."""


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run an ``async def`` test no other plugin took in ``asyncio.run`` → True; None (pytest's
    own call, or another plugin's) for every other test."""
    function = pyfuncitem.obj
    if not inspect.iscoroutinefunction(function):
        return None
    if any(pyfuncitem.get_closest_marker(name) is not None for name in OTHER_PLUGINS_MARKERS):
        return None
    arguments = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(function(**arguments))
    return True
