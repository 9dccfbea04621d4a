"""The Lua scripts of the runtime, one file per operation, each readable whole.

Every Redis script agentstream sends is a ``<name>.lua`` file in this folder (package data):
the file is the script, byte for byte, so a Lua error's line number is a line of that file.
Helper functions a few scripts share (``read_after``, ``next_fence``, ``release``,
``ack_entries``, ``take``, ``count``) are written out in each of them, the same text each
time (``tests/unit/test_lua_scripts.py`` checks it), instead of strings put together across
modules.
"""

from __future__ import annotations

import functools
from importlib import resources


@functools.cache
def script(name: str) -> str:
    """The text of the script ``<name>.lua`` of this folder, read once per process.

    Args:
        name: the operation's file name without ``.lua`` (``append``, ``admit_turn``...).

    Returns:
        The script's source, to pass to ``register_script`` or ``EVAL``.

    Raises:
        ValueError: no such script in :mod:`agentstream.runtime.lua`.
    """
    path = resources.files(__name__) / f"{name}.lua"
    if not path.is_file():
        raise ValueError(f"no Lua script {name!r} in {__name__} (its file {name}.lua is missing from the package)")
    return path.read_text(encoding="utf-8")
