"""``python -m agentstream``: the ``agentstream`` command.

``python -m`` puts the current directory first on ``sys.path``; it is taken off before the CLI
imports its stack, so a user's ``h2.py`` or ``redis.py`` there does not shadow a dependency
(``--app`` modules are still found there: :func:`agentstream.app.base.load_app`). What
``agentstream/__init__`` imported before this ran was looked up there already: the console
script ``agentstream`` and ``python -P -m agentstream`` do not look there at all.
"""

import os
import sys

if not sys.flags.safe_path and sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from agentstream.cli.commands import main

main()
