"""``python -m agentstream.cli.llama_server --config_file server.json``: llama-cpp-python's
OpenAI-compatible server (``llama_cpp.server``), with its chat template rendered as text.

llama-cpp-python (0.3.x) renders the ``chatml-function-calling`` template in a Jinja
environment with ``autoescape=select_autoescape(["html", "xml"])``, which escapes a template
made from a string: every message is HTML-escaped into the prompt (``It's`` → ``It&#39;s``). The
model copies the entities into its answer, the answer goes back into the history, and the next
turn escapes it again (``&amp;#39;``, ``&amp;amp;#39;``...). A prompt is not HTML, so this
process turns autoescaping off for the templates it renders (only here, in the server's own
process) and then runs the server unchanged. The stored outputs are then the model's own text.

Linux: the server also asks the kernel to send it SIGTERM when the process that started it dies
(``PR_SET_PDEATHSIG``, set by :class:`agentstream.cli.localmodel.LocalModelServer`), so a killed
parent never leaks a server; the server then removes its temp dir (its config and log), which
the parent would have removed.
"""

from __future__ import annotations

import os
import runpy
import shutil
import signal
import sys
from pathlib import Path

import jinja2


def _no_autoescape(*_args: object, **_kwargs: object):
    """What ``select_autoescape(...)`` returns here: a chooser that never escapes."""
    return lambda _template_name=None: False


def render_prompts_as_text() -> None:
    """Turn llama_cpp's template autoescaping off in this process (it reads
    ``jinja2.select_autoescape`` each time it builds a template renderer)."""
    jinja2.select_autoescape = _no_autoescape


TEMP_PREFIX = "agentstream-localmodel-"
"""The prefix of the temp dir :class:`agentstream.cli.localmodel.LocalModelServer` runs the server in."""


def own_temp_dir(argv: list[str]) -> Path | None:
    """The folder of ``--config_file`` when it is a local-model temp dir (:data:`TEMP_PREFIX`), else None."""
    for i, word in enumerate(argv):
        value = argv[i + 1] if word == "--config_file" and i + 1 < len(argv) else None
        if word.startswith("--config_file="):
            value = word.partition("=")[2]
        if value:
            folder = Path(value).resolve().parent
            return folder if folder.name.startswith(TEMP_PREFIX) else None
    return None


def main() -> None:
    render_prompts_as_text()
    parent, folder = os.getppid(), own_temp_dir(sys.argv[1:])
    # uvicorn puts back the handler it found and raises SIGTERM again once it has shut down: with
    # the default one the process would end there, before the `finally` below
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    try:
        runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
    finally:
        # the command that started it died without stopping it (kill -9: the kernel sent SIGTERM,
        # PR_SET_PDEATHSIG): nobody else removes its temp dir, which was left in /tmp each time
        if folder is not None and os.getppid() != parent:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
