"""Which app serves the embedded Redis of a data folder: one at a time.

``run`` and ``dev`` keep the embedded Redis's data in one folder by default
(``~/.cache/agentstream/redis``), and every command that opens the folder shares its server, its
namespace and its consumer groups. Two commands of two apps there took each other's turns: with
``dev`` of one app running, ``run`` of another app had its turn taken and refused by the first
(``names agent 'helper', which this app does not have``). Now each serving command claims the
folder for its app before the embedded Redis starts; a command of another app is refused with
one line that names the app, command, process and folder holding it (commands of the same app
share the folder, as services of one app share their groups).

A claim is a file ``claims/<pid>.json`` in the folder, locked (``flock``, shared) by the process
for as long as it runs: the kernel drops the lock when the process ends, however it ends (a
``kill -9`` too), so a claim whose file is not locked is stale and is removed. The look and the
claim happen under an exclusive lock of ``claims/.lock``, so two commands starting at once cannot
both miss each other. :func:`refusal` decides (pure); :class:`FolderClaim` does the file work.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

from agentstream.errors import AgentStreamError


@dataclass(frozen=True)
class Claim:
    """One command's claim on a data folder.

    Attributes:
        app: the app path as given (``weather:app``).
        app_id: what makes two apps the same: the app module's file and the attribute.
        command: the command (``run``, ``dev``).
        pid: its process id.
        cwd: the folder it runs in (an app path is relative to it).
    """

    app: str
    app_id: str
    command: str
    pid: int
    cwd: str


def refusal(folder: str, mine: Claim, holders: list[Claim]) -> str | None:
    """Why ``mine`` may not serve from ``folder`` while ``holders`` (live claims) do, or None
    when every holder serves the same app."""
    other = next((c for c in holders if c.app_id != mine.app_id), None)
    if other is None:
        return None
    return (
        f"the data folder {folder} is in use by `agentstream {other.command} --app {other.app}` (pid {other.pid}, "
        f"in {other.cwd}), which serves another app: its services would take this command's turns. Stop it, or "
        "give this command a folder of its own with --data-dir (or set REDIS_URL)"
    )


class FolderClaim:
    """A claim on ``folder`` for the life of this object (see the module docstring).

    Args:
        folder: the embedded Redis's data folder.
        claim: this command's claim.
        shown: the folder as messages name it.

    Raises:
        AgentStreamError: from :meth:`take`: the folder is in use by another app (:func:`refusal`),
            or the claim cannot be written (the message names the file).
    """

    def __init__(self, folder: Path, claim: Claim, *, shown: str | None = None) -> None:
        self.dir = Path(folder).expanduser() / "claims"
        self.claim = claim
        self.shown = shown or str(folder)
        self._file: IO[str] | None = None
        self._path = self.dir / f"{claim.pid}.json"

    def holders(self) -> list[Claim]:
        """The live claims of other processes; stale ones are removed on the way."""
        live = []
        for path in sorted(self.dir.glob("*.json")):
            if path == self._path:
                continue
            try:
                with open(path, encoding="utf-8") as f:
                    try:
                        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:  # its process holds it: alive
                        live.append(Claim(**json.load(f)))
                        continue
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(path)  # nobody holds it: its process has ended
            except (OSError, ValueError, TypeError):  # unreadable or foreign: not a claim of a live command
                continue
        return live

    def take(self) -> FolderClaim:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            with open(self.dir / ".lock", "a") as mutex:
                fcntl.flock(mutex, fcntl.LOCK_EX)
                problem = refusal(self.shown, self.claim, self.holders())
                if problem:
                    raise AgentStreamError(problem)
                claim_file = open(self._path, "w", encoding="utf-8")  # held open until release: its lock is the claim
                fcntl.flock(claim_file, fcntl.LOCK_SH)
                json.dump(asdict(self.claim), claim_file)
                claim_file.flush()
                self._file = claim_file
        except OSError as exc:
            raise AgentStreamError(f"cannot claim the data folder {self.shown} ({self._path}): {exc}") from None
        return self

    def release(self) -> None:
        """Remove the claim (safe to call twice)."""
        claim_file, self._file = self._file, None
        if claim_file is None:
            return
        with contextlib.suppress(OSError):
            os.remove(self._path)
        claim_file.close()

    def __enter__(self) -> FolderClaim:
        return self.take()

    def __exit__(self, *exc: object) -> None:
        self.release()


def app_identity(app_path: str, module_file: str | None) -> str:
    """What makes two app paths the same app: the module's real file (``module_file``, else
    the module name) and the attribute."""
    module, _, attr = app_path.partition(":")
    where = os.path.realpath(module_file) if module_file else module
    return f"{where}:{attr}"
