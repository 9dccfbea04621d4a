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
parent never leaks a server.
"""

from __future__ import annotations

import runpy

import jinja2


def _no_autoescape(*_args: object, **_kwargs: object):
    """What ``select_autoescape(...)`` returns here: a chooser that never escapes."""
    return lambda _template_name=None: False


def render_prompts_as_text() -> None:
    """Turn llama_cpp's template autoescaping off in this process (it reads
    ``jinja2.select_autoescape`` each time it builds a template renderer)."""
    jinja2.select_autoescape = _no_autoescape


def main() -> None:
    render_prompts_as_text()
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
