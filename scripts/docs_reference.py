"""The docs site's generated parts, made from the code and the chart at build time (a mkdocs hook).

A page under ``docs/`` holds a line ``<!-- generated: NAME -->``; when mkdocs builds (``mkdocs
build --strict``, ``mkdocs serve``), :func:`on_page_markdown` replaces it with what
:data:`GENERATORS` ``[NAME]`` makes from the running code: the ``agentstream`` command's help,
every setting with its default and meaning, the wire's JSON schemas and AsyncAPI document, the
failure codes, the metrics, the Helm chart's values and the benchmark results. So a reference
page cannot drift from the code: a setting without a documented meaning, or a placeholder that
names no generator, fails the build (:class:`GenerationError`).

Run as a script, ``python scripts/docs_reference.py NAME`` prints one generated part.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PLACEHOLDER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.M)


class GenerationError(Exception):
    """A generated part cannot be made: the code lacks what the page must say, or no such part."""


def _cli_output(args: list[str]) -> str:
    """What ``agentstream ARGS`` prints (in this process, 100 columns, no colour).

    Raises:
        GenerationError: the command exits non-zero.
    """
    import typer.core
    from typer.testing import CliRunner

    from agentstream.cli.commands import cli

    rich, typer.core.HAS_RICH = typer.core.HAS_RICH, False  # plain text, as click prints it: no boxes
    try:
        result = CliRunner().invoke(
            cli, args, prog_name="agentstream", env={"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}, color=False
        )
    finally:
        typer.core.HAS_RICH = rich
    if result.exit_code != 0:
        raise GenerationError(f"agentstream {' '.join(args)} exited {result.exit_code}: {result.output[-2000:]}")
    return result.output.rstrip() + "\n"


def _commands(group: Any, path: list[str]) -> Iterator[list[str]]:
    """Every command path of a (typer's own) click group, depth first, in the order its help lists them."""
    yield path
    for name, command in getattr(group, "commands", {}).items():
        yield from _commands(command, [*path, name])


def cli_reference() -> str:
    """Each command's ``--help``, as ``agentstream ... --help`` prints it."""
    import typer

    from agentstream.cli.commands import cli

    parts = []
    for path in _commands(typer.main.get_command(cli), []):
        title = " ".join(["agentstream", *path])
        parts.append(f"### `{title}`\n\n```text\n{_cli_output([*path, '--help'])}```\n")
    return "\n".join(parts)


def _bullets(doc: str) -> list[str]:
    """The ``- `` bullets of a module docstring, each joined into one line, reST quotes made Markdown."""
    found: list[str] = []
    inside = False
    for line in doc.splitlines():
        if line.startswith("- "):
            found.append(line[2:].strip())
            inside = True
        elif inside and line.startswith("  ") and line.strip():
            found[-1] += " " + line.strip()
        else:
            inside = False
    return [_markdown(b) for b in found]


def _meaning(variable: str, bullets: list[str]) -> str:
    """The docstring bullet about ``variable``: the first that begins with its name, else the first naming it."""
    for bullet in bullets:
        head, _, rest = bullet.partition(": ")
        if f"`{variable}`" in head and rest:
            return rest
    for bullet in bullets:
        if f"`{variable}`" in bullet or f"`{variable}=" in bullet:
            return bullet
    raise GenerationError(f"the setting {variable} has no meaning in its module's docstring: document it there")


def _default(field: Any) -> str:
    """A settings field's default as the page shows it."""
    if field.default_factory is not None:
        return "(made per process)"
    if field.default is None or field.default == "":
        return "(unset)"
    return f"`{str(field.default).lower() if isinstance(field.default, bool) else field.default}`"


def _settings_table(cls: Any, module: Any) -> str:
    bullets = _bullets(module.__doc__ or "")
    prefix = cls.model_config.get("env_prefix", "")
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in cls.model_fields.items():
        alias = field.validation_alias
        variable = alias.choices[0] if alias is not None and hasattr(alias, "choices") else f"{prefix}{name}".upper()
        meaning = _meaning(variable, bullets).replace("|", "\\|")
        rows.append(f"| `{variable}` | {_default(field)} | {meaning} |")
    return "\n".join(rows) + "\n"


def settings_reference() -> str:
    """Every setting of :class:`agentstream.ops.settings.Settings` and of the gateway's, from the code."""
    from agentstream.ops import settings
    from agentstream_services.gateway import settings as gateway_settings

    return (
        "### The services' settings\n\n"
        + _settings_table(settings.Settings, settings)
        + "\n### The HTTP gateway's settings\n\n"
        + _settings_table(gateway_settings.GatewaySettings, gateway_settings)
    )


def wire_reference() -> str:
    """The JSON schemas of the turn, the reply and a trace entry's event, and the AsyncAPI document."""
    parts = []
    for title, args in (
        ("The turn (`agentstream schema turn`)", ["schema", "turn"]),
        ("The reply (`agentstream schema reply`)", ["schema", "reply"]),
        ("A trace entry's event (`agentstream schema events`)", ["schema", "events"]),
        ("The AsyncAPI document (`agentstream schema asyncapi`)", ["schema", "asyncapi"]),
    ):
        parts.append(f"### {title}\n\n```json\n{_cli_output(args)}```\n")
    return "\n".join(parts)


def failure_codes_reference() -> str:
    """Every :class:`agentstream.wire.failures.FailureCode` with the docstring of its member."""
    from agentstream.wire import failures

    source = Path(failures.__file__).read_text()
    body = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "FailureCode").body
    meanings: dict[str, str] = {}
    for node, after in zip(body, body[1:], strict=False):
        if isinstance(node, ast.Assign) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            meanings[node.targets[0].id] = " ".join(str(after.value.value).split())  # type: ignore[attr-defined]
    rows = ["| code | meaning |", "|---|---|"]
    for member in failures.FailureCode:
        if member.name not in meanings:
            raise GenerationError(f"FailureCode.{member.name} has no docstring: document it in {failures.__name__}")
        rows.append(f"| `{member.value}` | {meanings[member.name].replace('``', '`')} |")
    return "\n".join(rows) + "\n"


def metrics_reference() -> str:
    """Every Prometheus metric :mod:`agentstream.ops.metrics` defines: name, type, labels, help."""
    from prometheus_client.metrics import MetricWrapperBase

    from agentstream.ops import metrics

    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    found = [m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]
    for metric in sorted(found, key=lambda m: m._name):
        kind = metric._type
        name = metric._name + ("_total" if kind == "counter" else "_info" if kind == "info" else "")
        labels = ", ".join(f"`{label}`" for label in metric._labelnames) or ""
        rows.append(f"| `{name}` | {kind} | {labels} | {metric._documentation} |")
    return "\n".join(rows) + "\n"


def _markdown(rest: str) -> str:
    """reST roles and double backquotes of a docstring as Markdown code."""
    return re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", rest).replace("``", "`")


def api_reference() -> str:
    """Every name ``agentstream`` exports (``__all__``): what it is, its signature, the first paragraph of its docstring."""
    import inspect

    import agentstream

    rows = ["| name | what |", "|---|---|"]
    for name in agentstream.__all__:
        obj = getattr(agentstream, name)
        if isinstance(obj, int | str):
            rows.append(f"| `{name}` | the constant `{obj!r}` |")
            continue
        doc = inspect.getdoc(obj) if (inspect.isclass(obj) or inspect.isfunction(obj)) else None
        if not doc:
            rows.append(f"| `{name}` | `{obj}` |")
            continue
        summary = " ".join(doc.split("\n\n", 1)[0].split())
        kind = "function" if inspect.isfunction(obj) else "class"
        cell = _markdown(summary).replace("|", "\\|")
        rows.append(f"| `{name}` | {kind}: {cell} |")
    return "\n".join(rows) + "\n"


def _included(path: Path, links: dict[str, str]) -> str:
    """A Markdown file of the repository, its relative links pointed at the docs pages that hold them."""
    text = path.read_text()
    for old, new in links.items():
        if f"]({old}" not in text:
            raise GenerationError(f"{path.relative_to(ROOT)} no longer links {old}: update {__name__}")
        text = text.replace(f"]({old}", f"]({new}")
    return text


def helm_reference() -> str:
    """The chart's README (checked against values.yaml by tests/deploy/test_deploy_values.py)."""
    return _included(ROOT / "charts/agentstream/README.md", {"../../README.md": "../index.md"})


def bench_results() -> str:
    """bench/RESULTS.md, where every measured figure lives."""
    return _included(
        ROOT / "bench/RESULTS.md", {"../README.md#partitions-and-redis-cluster": "../how-to/redis-cluster.md"}
    )


GENERATORS: dict[str, Callable[[], str]] = {
    "api": api_reference,
    "cli": cli_reference,
    "settings": settings_reference,
    "wire": wire_reference,
    "failure-codes": failure_codes_reference,
    "metrics": metrics_reference,
    "helm-values": helm_reference,
    "bench-results": bench_results,
}


def expand(markdown: str, where: str) -> str:
    """``markdown`` with each placeholder replaced by its generated part.

    Raises:
        GenerationError: a placeholder names no generator (``where`` says which page).
    """

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise GenerationError(f"{where}: no generator {name!r} (known: {', '.join(GENERATORS)})")
        return GENERATORS[name]()

    return PLACEHOLDER.sub(one, markdown)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """The mkdocs hook: expand the page's placeholders."""
    return expand(markdown, page.file.src_uri)


if __name__ == "__main__":
    os.environ.setdefault("COLUMNS", "100")
    sys.stdout.write(GENERATORS[sys.argv[1]]())
