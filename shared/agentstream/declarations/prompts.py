"""Prompt files: every text an agent's models read, with a layer of overrides per group of models.

A prompt file is a YAML document::

    system: |                        # a Jinja template (plain text: nothing is escaped)
      You are a careful assistant.
      {% block tools %}Use the tools when a question needs them.{% endblock %}
    texts:                           # plain texts by key, read by code (placeholders filled there)
      nudge: "Answer from the tool result."
    tools:                           # what the model reads of a tool, replacing its own texts
      calculator:
        description: Evaluate arithmetic.
        arguments: {expression: "The expression, e.g. 2 * (3 + 4)"}
    models:                          # layers: overrides for some model endpoints
      - endpoints: [default]
        blocks: {tools: "{{ super() }} Call exactly one tool first."}
        texts: {nudge: "Reply with one sentence."}

A layer may replace only blocks and texts that the base defines (``{{ super() }}`` extends a base
block), and no two layers may name one endpoint. The texts one model reads carry a digest
(16 hex characters of a sha256), so a change to any of them shows as another digest.

Templates render in Jinja's immutable sandbox (``jinja2.sandbox.ImmutableSandboxedEnvironment``):
prompt files are often edited by people who are not the service's operators, so a template may
read its variables and call Jinja's filters, but not reach Python's internals (``__class__``,
``__globals__``), call methods that change a value (``list.append``) or build huge ranges;
what the sandbox forbids fails with a :class:`PromptFileError` naming the file and line. Only
prompt files are templates: user text, tool results and metadata are never rendered.

An agent's system prompt (``Agent(system_prompt=...)``) is one of three things, written anew for
each model call from the turn it answers (:func:`system_text`):

- a text, with ``{citation}`` (the example citation of the agent's citation style, such as
  ``[1]``) and ``{context}`` (the context text the turn brings, see :func:`turn_context`) filled
  in one pass (:func:`fill_prompt`): text the turn brings is never read as a placeholder, and
  every other brace stays as written;
- a function of (the parsed turn, the example citation or None) that returns the text;
- a :class:`PromptFile`: the texts of the layer that names the endpoint the call goes to (the
  turn's model), rendered with ``citation`` and ``context``; its tool texts replace the tools'
  own descriptions for that model.

Files are read at startup (the app module calls :func:`load_prompt_file`, and an agent given a
file checks at construction that its templates read only ``citation`` and ``context`` and that
its tool texts name tools and arguments the agent has); the context library only ever sees the
rendered strings, so it stays pure. ``agentstream prompt FILE --model ID``
prints what one model reads. Files are looked up in ``AGENTSTREAM_PROMPTS_DIR``, then in the
prompt files shipped with agentstream (the repository's ``prompts/``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
import jinja2.sandbox
import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from agentstream.errors import ConfigError

PROMPTS_DIR_ENV = "AGENTSTREAM_PROMPTS_DIR"

PROMPT_VARIABLES = ("citation", "context")
"""The variables an agent's system prompt reads: the example citation of its citation style
(empty without one) and the context text the turn brings (empty without one)."""

_PLACEHOLDER = re.compile(r"\{(citation|context)\}")


class PromptFileError(ConfigError, ValueError):
    """A prompt file that does not fit its agent, or a model layer that does not fit its base."""


def fill_prompt(template: str, *, citation: str = "", context: str = "") -> str:
    """A system prompt text with ``{citation}`` and ``{context}`` filled in one pass.

    Only these two placeholders are read, and only in ``template``: what they are replaced by
    (text a turn brings) is never read again, and every other brace stays as written (a JSON
    example in a prompt needs no escaping). The spaces around the result are removed.

    >>> fill_prompt("Cite as {citation}. {context} {x}", citation="[1]", context="{citation}")
    'Cite as [1]. {citation} {x}'
    """
    values = {"citation": citation, "context": context}
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], template).strip()


def turn_context(turn: Any) -> str:
    """The context text a parsed turn brings for the system prompt: its ``context`` field
    (as a chat-turn input holds it) without the spaces around it, or ``""`` when it has none."""
    context = getattr(turn, "context", None)
    return context.strip() if isinstance(context, str) else ""


PromptFunction = Callable[[Any, "str | None"], str]
"""A system prompt written by code: ``fn(parsed turn, example citation or None) -> text``."""


def prompt_template(template: str) -> PromptFunction:
    """A prompt function that fills ``template``'s ``{citation}`` and ``{context}`` (see
    :func:`fill_prompt`): the same as giving the text itself, for code that composes prompts."""

    def write(turn: Any, citation: str | None) -> str:
        return fill_prompt(template, citation=citation or "", context=turn_context(turn))

    return write


class ToolTexts(BaseModel):
    """What the model reads of one tool: its description and its arguments' descriptions."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str | None = None
    arguments: dict[str, str] = Field(default_factory=dict)


class ModelLayer(BaseModel):
    """Overrides of a prompt file for the model endpoints it names (at least one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoints: tuple[str, ...] = Field(min_length=1)
    blocks: dict[str, str] = Field(default_factory=dict)
    texts: dict[str, str] = Field(default_factory=dict)
    tools: dict[str, ToolTexts] = Field(default_factory=dict)


def _environment(loader: jinja2.BaseLoader | None = None) -> jinja2.Environment:
    # Plain text prompts: no autoescape; a variable that is not given fails the render; the
    # immutable sandbox: no Python internals, no mutating methods (see the module docstring).
    return jinja2.sandbox.ImmutableSandboxedEnvironment(
        loader=loader, undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=False
    )


_TEMPLATE_FILE = "<prompt:{}>"
"""The file name Jinja gives a prompt template's code (``base``: the system template,
``model``: a layer's blocks over it), so a render error's traceback tells which and where."""


@dataclass(frozen=True)
class _Origin:
    """Where a prompt file's templates sit in the file, for error messages.

    ``lines`` maps ``system`` and ``(layer index, block name)`` to the 1-based file line of the
    template's first line.
    """

    path: str | None = None
    lines: Mapping[Any, int] = field(default_factory=dict)


def _template_lines(text: str) -> dict[Any, int]:
    """The file line of the first line of each template in a prompt file's YAML (best effort)."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return {}

    def first_line(node: yaml.Node) -> int:
        block = isinstance(node, yaml.ScalarNode) and node.style in ("|", ">")
        return node.start_mark.line + (2 if block else 1)

    out: dict[Any, int] = {}
    if not isinstance(root, yaml.MappingNode):
        return out
    for key, value in root.value:
        if key.value == "system" and isinstance(value, yaml.ScalarNode):
            out["system"] = first_line(value)
        elif key.value == "models" and isinstance(value, yaml.SequenceNode):
            for index, layer in enumerate(value.value):
                if not isinstance(layer, yaml.MappingNode):
                    continue
                for lkey, lvalue in layer.value:
                    if lkey.value == "blocks" and isinstance(lvalue, yaml.MappingNode):
                        for bkey, bvalue in lvalue.value:
                            out[(index, bkey.value)] = first_line(bvalue)
    return out


class PromptFile(BaseModel):
    """One agent's prompt file (see the module docstring).

    Raises (on construction and :meth:`load`):
        pydantic.ValidationError: another shape; a layer replaces a block or text the base does
            not define; two layers name one endpoint.
        jinja2.TemplateSyntaxError: the system template is not valid Jinja.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    system: str | None = None
    texts: dict[str, str] = Field(default_factory=dict)
    tools: dict[str, ToolTexts] = Field(default_factory=dict)
    models: tuple[ModelLayer, ...] = ()
    _origin: _Origin = PrivateAttr(default_factory=_Origin)

    @model_validator(mode="after")
    def _check_layers(self) -> PromptFile:
        blocks = self.blocks
        seen: dict[str, int] = {}
        for index, layer in enumerate(self.models):
            unknown_blocks = sorted(set(layer.blocks) - blocks)
            if unknown_blocks:
                raise PromptFileError(
                    f"model layer {index} replaces blocks the system template does not define: {unknown_blocks}"
                )
            unknown_texts = sorted(set(layer.texts) - set(self.texts))
            if unknown_texts:
                raise PromptFileError(f"model layer {index} replaces texts the base does not define: {unknown_texts}")
            for endpoint in layer.endpoints:
                if endpoint in seen:
                    raise PromptFileError(f"model layers {seen[endpoint]} and {index} both name endpoint {endpoint!r}")
                seen[endpoint] = index
            for source in layer.blocks.values():
                _environment().parse(source)  # syntax errors surface at load time
        return self

    @model_validator(mode="after")
    def _check_syntax(self) -> PromptFile:
        if self.system is not None:
            _environment().parse(self.system)
        return self

    @property
    def blocks(self) -> frozenset[str]:
        """The names of the system template's blocks."""
        if self.system is None:
            return frozenset()
        return frozenset(b.name for b in _environment().parse(self.system).find_all(jinja2.nodes.Block))

    @property
    def origin_path(self) -> str | None:
        """The path the file was loaded from, or None for one built in code."""
        return self._origin.path

    @property
    def endpoints(self) -> frozenset[str]:
        """Every endpoint a model layer names."""
        return frozenset(e for layer in self.models for e in layer.endpoints)

    @classmethod
    def load(cls, path: str | Path) -> PromptFile:
        """Read the prompt file at ``path`` (UTF-8 YAML).

        Raises:
            yaml.YAMLError, pydantic.ValidationError, jinja2.TemplateSyntaxError: see the class.
        """
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        data = yaml.safe_load(text) or {}
        loaded = cls.model_validate(data)
        loaded._origin = _Origin(path=str(path), lines=_template_lines(text))
        return loaded

    @property
    def variables(self) -> frozenset[str]:
        """Every variable the system template and the layers' blocks read (``super`` and
        ``self`` aside)."""
        env = _environment()
        sources = [self.system] if self.system else []
        sources += [src for layer in self.models for src in layer.blocks.values()]
        found: set[str] = set()
        for source in sources:
            found |= jinja2.meta.find_undeclared_variables(env.parse(source))
        return frozenset(found - {"super", "self"})

    def check_variables(self, known: Iterable[str]) -> None:
        """Refuse a template or block that reads a variable outside ``known``.

        Raises:
            PromptFileError: names the unknown variables and where they are read.
        """
        allowed = set(known) | {"super", "self"}
        env = _environment()
        sources = [("system", self.system)] if self.system else []
        sources += [
            (f"layer {i} block {name!r}", src)
            for i, layer in enumerate(self.models)
            for name, src in layer.blocks.items()
        ]
        for where, source in sources:
            unknown = sorted(jinja2.meta.find_undeclared_variables(env.parse(source)) - allowed)
            if unknown:
                raise PromptFileError(
                    f"the {where} template reads unknown variables {unknown} (known: {sorted(set(known))})"
                )

    def for_model(self, model: str | None) -> Prompts:
        """The texts ``model`` (an endpoint id) reads: the base with the layer naming it over it."""
        index, layer = next(
            ((i, lay) for i, lay in enumerate(self.models) if model is not None and model in lay.endpoints),
            (None, None),
        )
        if layer is None:
            return Prompts(
                template=self.system, blocks={}, texts=dict(self.texts), tools=dict(self.tools), origin=self._origin
            )
        tools = dict(self.tools)
        for name, over in layer.tools.items():
            base = tools.get(name, ToolTexts())
            tools[name] = ToolTexts(
                description=over.description if over.description is not None else base.description,
                arguments={**base.arguments, **over.arguments},
            )
        return Prompts(
            template=self.system,
            blocks=dict(layer.blocks),
            texts={**self.texts, **layer.texts},
            tools=tools,
            origin=self._origin,
            layer=index,
        )


@dataclass(frozen=True)
class Prompts:
    """The texts of one prompt file for one model (see :meth:`PromptFile.for_model`).

    ``origin`` and ``layer`` (the index of the model layer applied) only serve error messages.
    """

    template: str | None
    blocks: Mapping[str, str]
    texts: Mapping[str, str]
    tools: Mapping[str, ToolTexts] = field(default_factory=dict)
    origin: _Origin = field(default_factory=_Origin, compare=False, repr=False)
    layer: int | None = None

    @property
    def source(self) -> str:
        """The template :meth:`system` renders: the base, or a template extending it with the
        layer's blocks."""
        if self.template is None:
            raise PromptFileError("the prompt file has no system template")
        if not self.blocks:
            return self.template
        overrides = "".join(f"{{% block {name} %}}{body}{{% endblock %}}" for name, body in sorted(self.blocks.items()))
        return '{% extends "base" %}' + overrides

    @property
    def digest(self) -> str:
        """16 hex characters of the sha256 of every text this model reads from the file."""
        doc = {
            "template": self.template,
            "blocks": dict(sorted(self.blocks.items())),
            "texts": dict(sorted(self.texts.items())),
            "tools": {k: v.model_dump() for k, v in sorted(self.tools.items())},
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]

    def system(self, **variables: Any) -> str:
        """The system prompt: the template rendered with ``variables`` (surrounding spaces removed).

        Raises:
            PromptFileError: the file has no system template, or the template does what the
                sandbox forbids (the message names the file and line).
            jinja2.UndefinedError: the template reads a variable that is not given.
        """
        sources = {"base": self.template or "", "model": self.source}

        def load(name: str) -> tuple[str, str, Callable[[], bool]] | None:
            source = sources.get(name)
            return None if source is None else (source, _TEMPLATE_FILE.format(name), lambda: True)

        env = _environment(jinja2.FunctionLoader(load))
        try:
            return env.get_template("model").render(**variables).strip()
        except (jinja2.exceptions.SecurityError, OverflowError) as exc:
            raise PromptFileError(f"{self._where(exc)}: the template does what the sandbox forbids: {exc}") from None

    def _where(self, exc: BaseException) -> str:
        """``prompt file 'x.yaml', line N`` for the innermost template frame of ``exc``'s traceback."""
        name, line = None, None
        tb = exc.__traceback__
        while tb is not None:
            filename = tb.tb_frame.f_code.co_filename
            for candidate in ("base", "model"):
                if filename == _TEMPLATE_FILE.format(candidate):
                    name, line = candidate, tb.tb_lineno
            tb = tb.tb_next
        where = f"prompt file {self.origin.path!r}" if self.origin.path else "prompt file (not read from a file)"
        if line is None:
            return where
        if name == "base" or not self.blocks:
            start = self.origin.lines.get("system")
            return f"{where}, line {start + line - 1}" if start else f"{where}, system template line {line}"
        # the layer's blocks are joined into one template: find the block that holds `line`
        at = 1
        for block, body in sorted(self.blocks.items()):
            lines = body.count("\n")
            if line <= at + lines:
                start = self.origin.lines.get((self.layer, block))
                inner = line - at + 1
                if start:
                    return f"{where}, line {start + inner - 1} (model layer {self.layer}, block {block!r})"
                return f"{where}, model layer {self.layer} block {block!r} line {inner}"
            at += lines
        return f"{where}, model layer {self.layer}"

    def text(self, key: str) -> str:
        """The plain text under ``key``.

        Raises:
            PromptFileError: the file defines no such text.
        """
        try:
            return self.texts[key]
        except KeyError:
            raise PromptFileError(f"the prompt file defines no text {key!r} (texts: {sorted(self.texts)})") from None

    def described(self, tools: Sequence[Any]) -> list[Any]:
        """``tools`` with the texts this file gives them in place of their own (copies; others as is).

        Raises:
            PromptFileError: the file gives texts to a tool not in ``tools`` or to an argument the
                tool does not take.
        """
        by_name = {t.name: t for t in tools}
        unknown = sorted(set(self.tools) - set(by_name))
        if unknown:
            raise PromptFileError(f"the prompt file gives texts to tools the agent does not have: {unknown}")
        out = []
        for tool in tools:
            texts = self.tools.get(tool.name)
            if texts is None:
                out.append(tool)
                continue
            properties = tool.parameters.get("properties", {})
            bad = sorted(set(texts.arguments) - set(properties))
            if bad:
                raise PromptFileError(f"the prompt file describes arguments tool {tool.name!r} does not take: {bad}")
            described = copy.copy(tool)
            described.parameters = copy.deepcopy(tool.parameters)
            for arg, text in texts.arguments.items():
                described.parameters["properties"][arg]["description"] = text
            if texts.description is not None:
                described.description = texts.description
            out.append(described)
        return out


def find_prompt_file(name: str) -> Path:
    """A prompt file by name (``demo.yaml``) or path: a path that exists, else
    ``$AGENTSTREAM_PROMPTS_DIR/<name>``, else the prompt files shipped with agentstream.

    Raises:
        ConfigError: nowhere to be found (the message lists where it looked).
    """
    looked: list[str] = []
    direct = Path(name)
    if direct.is_file():
        return direct
    looked.append(str(direct))
    env_dir = os.environ.get(PROMPTS_DIR_ENV)
    if env_dir:
        candidate = Path(env_dir) / name
        if candidate.is_file():
            return candidate
        looked.append(str(candidate))
    shipped = resources.files("agentstream_prompts") / name
    if shipped.is_file():
        return Path(str(shipped))
    looked.append(f"agentstream's shipped prompts/{name}")
    raise ConfigError(f"prompt file {name!r} not found (looked in: {', '.join(looked)})")


def load_prompt_file(name: str, *, variables: Iterable[str] = PROMPT_VARIABLES) -> PromptFile:
    """Find and load a prompt file, and check that its templates read only ``variables`` (by
    default what an agent's system prompt gets: :data:`PROMPT_VARIABLES`).

    Raises:
        ConfigError: not found, or not a valid prompt file (the message names the file).
    """
    path = find_prompt_file(name)
    try:
        prompt_file = PromptFile.load(path)
    except (yaml.YAMLError, jinja2.TemplateSyntaxError, ValueError) as exc:
        raise ConfigError(f"prompt file {str(path)!r} is not valid: {exc}") from exc
    prompt_file.check_variables(variables)
    return prompt_file
