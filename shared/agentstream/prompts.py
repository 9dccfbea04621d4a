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

Files are read at startup (the app module calls :func:`load_prompt_file`); the context library
only ever sees the rendered strings, so it stays pure. ``agentstream prompt FILE --model ID``
prints what one model reads. Files are looked up in ``AGENTSTREAM_PROMPTS_DIR``, then in the
prompt files shipped with agentstream (the repository's ``prompts/``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentstream.errors import ConfigError

PROMPTS_DIR_ENV = "AGENTSTREAM_PROMPTS_DIR"


class PromptFileError(ConfigError, ValueError):
    """A prompt file that does not fit its agent, or a model layer that does not fit its base."""


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


def _environment() -> jinja2.Environment:
    # Plain text prompts: no autoescape; a variable that is not given fails the render.
    return jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=False)


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

    @model_validator(mode="after")
    def _check_layers(self) -> PromptFile:
        blocks = self.blocks
        seen: dict[str, int] = {}
        for index, layer in enumerate(self.models):
            unknown_blocks = sorted(set(layer.blocks) - blocks)
            if unknown_blocks:
                raise PromptFileError(f"model layer {index} replaces blocks the system template does not define: {unknown_blocks}")
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
            data = yaml.safe_load(fh) or {}
        return cls.model_validate(data)

    def check_variables(self, known: Iterable[str]) -> None:
        """Refuse a template or block that reads a variable outside ``known``.

        Raises:
            PromptFileError: names the unknown variables and where they are read.
        """
        allowed = set(known) | {"super", "self"}
        env = _environment()
        sources = [("system", self.system)] if self.system else []
        sources += [(f"layer {i} block {name!r}", src) for i, layer in enumerate(self.models) for name, src in layer.blocks.items()]
        for where, source in sources:
            unknown = sorted(jinja2.meta.find_undeclared_variables(env.parse(source)) - allowed)
            if unknown:
                raise PromptFileError(f"the {where} template reads unknown variables {unknown} (known: {sorted(set(known))})")

    def for_model(self, model: str | None) -> Prompts:
        """The texts ``model`` (an endpoint id) reads: the base with the layer naming it over it."""
        layer = next((lay for lay in self.models if model is not None and model in lay.endpoints), None)
        if layer is None:
            return Prompts(template=self.system, blocks={}, texts=dict(self.texts), tools=dict(self.tools))
        tools = dict(self.tools)
        for name, over in layer.tools.items():
            base = tools.get(name, ToolTexts())
            tools[name] = ToolTexts(
                description=over.description if over.description is not None else base.description,
                arguments={**base.arguments, **over.arguments},
            )
        return Prompts(template=self.system, blocks=dict(layer.blocks), texts={**self.texts, **layer.texts}, tools=tools)


@dataclass(frozen=True)
class Prompts:
    """The texts of one prompt file for one model (see :meth:`PromptFile.for_model`)."""

    template: str | None
    blocks: Mapping[str, str]
    texts: Mapping[str, str]
    tools: Mapping[str, ToolTexts] = field(default_factory=dict)

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
            PromptFileError: the file has no system template.
            jinja2.UndefinedError: the template reads a variable that is not given.
        """
        env = jinja2.Environment(
            loader=jinja2.DictLoader({"base": self.template or "", "model": self.source}),
            undefined=jinja2.StrictUndefined,
            autoescape=False,
        )
        return env.get_template("model").render(**variables).strip()

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


def load_prompt_file(name: str, *, variables: Iterable[str] = ()) -> PromptFile:
    """Find and load a prompt file, and check that its templates read only ``variables``.

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
