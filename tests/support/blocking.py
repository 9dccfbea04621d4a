"""Blocking calls in the event loop fail the tests (blockbuster).

While the fixture :func:`blocking_calls` is active (autouse in tests/integration and tests/e2e),
a blocking call made in a running event loop by the package's own code (``agentstream``,
``agentstream_services``: a frame of theirs on the stack) raises
:class:`blockbuster.BlockingError`: ``time.sleep``, file reads and writes, ``os.stat`` and the
other file-system calls, a blocking socket's ``connect``/``send``/``recv`` (a sync Redis client),
a ``threading.Lock`` acquired while held, ``input()``. The code under test may catch that error
(a handler's failure is a logged error and a retry, a tool's failure an error result), so every
one raised is also recorded here, and the fixture fails the test at teardown when any was. A
blocking call of the tests' own code (a sync Redis client checking what the services wrote) is
not the package's and is not counted; a call in a thread (``asyncio.to_thread``, a sync tool's
daemon thread) is outside the loop and allowed.

Calls that are harmless (a log line to stderr, start-up before the service serves) are allowed by
:data:`ALLOWED`, each with the reason."""

from __future__ import annotations

import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import blockbuster.blockbuster as _blockbuster
from blockbuster import BlockBuster, BlockingError

SCANNED = ["agentstream", "agentstream_services"]
"""The packages whose blocking calls count (the stack of the call holds a frame of theirs)."""

ALLOWED: list[tuple[str, set[str]]] = [
    # a log line written to stderr (a pipe the platform drains, or a terminal): the services' one
    # output stream; handing each line to a thread would reorder them and lose the last ones at exit
    ("logging/__init__.py", {"emit"}),
    # start-up, before a service's consumers run (in its own process nothing else is waiting on the
    # loop yet): a service's build reads its configuration files (AGENTSTREAM_MODELS_FILE, the
    # gateway's keys file), and the gateway's app is built (starlette checks the console's folder once)
    ("agent_loop/service.py", {"build"}),
    ("compaction/service.py", {"build"}),
    ("gateway/service.py", {"build"}),
    ("gateway/api.py", {"create_api"}),
    # FastAPI looks up an endpoint's source file once per endpoint (cached), for its error messages
    ("fastapi/routing.py", {"_extract_endpoint_context"}),
    # the first guess of a file's type reads the system's mime.types, once per process
    ("mimetypes.py", {"init"}),
    # a module imported the first time a code path needs it runs its body once per process (the
    # import system's own reads are allowed by blockbuster already; its module's top-level code,
    # e.g. multiprocessing's os.getcwd, is the same one-off)
    ("<frozen importlib._bootstrap>", {"_find_and_load"}),
    # redis-py 8 looks its own version up (importlib.metadata: a scan of sys.path) for each new
    # connection, for CLIENT SETINFO: at start and when a pool grows, not per command (a fix in the
    # package would hand redis-py its version once; not made yet)
    ("redis/utils.py", {"get_lib_version"}),
    # redis-py makes its TLS context once per process at the first TLS connection (the CA file's
    # paths are looked up then); every later connection reuses it
    ("redis/utils.py", {"get_shared_ssl_context"}),
]
"""Places (file name ending, function names) in whose calls a blocking call is allowed, with why."""


@dataclass
class BlockingCalls:
    """What the detector caught: one ``(function, stack)`` per blocking call, in order."""

    seen: list[tuple[str, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, function: str, stack: str) -> None:
        with self._lock:
            self.seen.append((function, stack))

    def take(self) -> list[tuple[str, str]]:
        """The calls caught so far → that list; the record is empty afterwards."""
        with self._lock:
            seen, self.seen = self.seen, []
        return seen

    def report(self) -> str:
        """Every call caught, each with the stack it was made from."""
        return "\n".join(
            f"blocking call to {function} in the event loop, from:\n{stack}" for function, stack in self.seen
        )


@contextmanager
def detecting_blocking_calls() -> Iterator[BlockingCalls]:
    """Detect blocking calls of the package in the event loop while the block runs → the record.

    Each one raises :class:`blockbuster.BlockingError` where it was made and is recorded, also
    when the code under test catches the error."""
    calls = BlockingCalls()

    class RecordedBlockingError(BlockingError):
        def __init__(self, func: str) -> None:
            super().__init__(func)
            calls.record(func, "".join(traceback.format_stack(limit=25)[:-1]))

    detector = BlockBuster(scanned_modules=SCANNED)
    # os.getcwd asks the kernel for the process's folder: it touches no disk (error messages name it)
    del detector.functions["os.getcwd"]
    for function in detector.functions.values():
        for filename, functions in ALLOWED:
            function.can_block_in(filename, functions)
    # blockbuster raises the error its module names: a subclass there records every one raised
    # (the module's own name for it; tests/integration/test_blocking_detector.py fails if that changes)
    original = _blockbuster.BlockingError
    _blockbuster.BlockingError = RecordedBlockingError
    detector.activate()
    try:
        yield calls
    finally:
        detector.deactivate()
        _blockbuster.BlockingError = original
