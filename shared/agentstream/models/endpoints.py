"""Model endpoints as configuration: which server, which model, which key, which quirks.

Agents name a model by endpoint id (``Agent.model``). The endpoints come from two places:

- ``default``, from OPENAI_BASE_URL / OPENAI_API_KEY / OPENAI_MODEL (see
  :mod:`agentstream.ops.settings`), with optional extra settings as a JSON object in
  ``AGENTSTREAM_DEFAULT_MODEL_OPTIONS`` (any key of a file entry below except ``provider``,
  ``base_url``, ``model`` and ``api_key_env``);
- a YAML file named by ``AGENTSTREAM_MODELS_FILE``; an entry named ``default`` there replaces the
  one from the environment::

      models:
        deepseek:
          provider: openai                  # any OpenAI-compatible chat-completions server
          base_url: https://api.deepseek.com/v1
          model: deepseek-chat
          api_key_env: DEEPSEEK_API_KEY     # the name of the variable, never the key itself
          window_tokens: 128000
          chars_per_token: 3.5
          quirks:
            reasoning_field: reasoning_content  # where the server takes reasoning back (C10)
        claude:
          provider: anthropic               # the Anthropic Messages API
          base_url: https://api.anthropic.com
          model: claude-sonnet-4-5
          api_key_env: ANTHROPIC_API_KEY
          window_tokens: 200000
          thinking_budget_tokens: 2048

Keys are read from the named variables when the endpoints are loaded and held as
``SecretStr``: never in a repr, a log, a trace or an error message.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from agentstream.context.limits import ModelLimits, Tokens
from agentstream.errors import ConfigError

if TYPE_CHECKING:
    from agentstream.ops.settings import Settings  # a parameter's type: pydantic-settings loads asyncio

ProviderKind = Literal["openai", "anthropic"]

PROVIDERS: tuple[str, ...] = ("openai", "anthropic")

# Fields each adapter sets itself; ``extra_body`` may not set them (it would silently change
# what the adapter sends, and what the recorded fingerprint means).
ADAPTER_FIELDS: dict[str, frozenset[str]] = {
    "openai": frozenset(
        {
            "model",
            "messages",
            "temperature",
            "max_tokens",
            "max_completion_tokens",
            "tools",
            "tool_choice",
            "stream",
            "stream_options",
            "seed",
            "response_format",
            "n",
        }
    ),
    "anthropic": frozenset(
        {"model", "messages", "system", "max_tokens", "temperature", "tools", "tool_choice", "stream", "thinking"}
    ),
}

# Headers the adapters set; ``headers`` may not set them.
ADAPTER_HEADERS = frozenset({"authorization", "x-api-key", "content-type", "anthropic-version", "accept"})


class Quirks(BaseModel):
    """What one server needs that the API's documentation does not say.

    Attributes:
        tool_call_content: the ``content`` of an assistant message beside tool calls: ``null``
            (default: the OpenAI API documents ``content`` as null or absent when the message
            has ``tool_calls``, and strict servers refuse ``""``), ``empty`` (``""``: llama.cpp's
            server answers 500 to a null content; :data:`agentstream.cli.localmodel.LLAMA_CPP_QUIRKS`
            sets it for the embedded local model) or ``omit`` (no field).
        reasoning_field: the assistant-message field in which this server takes earlier
            reasoning back (``reasoning_content``, DeepSeek's and vLLM's; ``reasoning`` for
            others). Which reasoning goes back is the agent's context policy alone
            (``ContextPolicy(reasoning=CURRENT_TURN)``: what DeepSeek's thinking mode needs on
            tool-call turns, C10), sent only to the provider and model that wrote it. The former
            quirk ``reasoning_replay`` is refused with a message saying so.
        max_tokens_field: ``max_tokens`` (default) or ``max_completion_tokens`` (newer OpenAI
            models refuse ``max_tokens``).
        required_tool_choice: how tool choice ``required`` is sent: ``required`` (default),
            ``named`` (the tool by name when exactly one is offered, else ``auto``: servers such
            as llama-cpp-python that cannot force "any tool") or ``auto``.
        stream_tools: whether a request that offers tools is streamed: ``always`` (default),
            ``never`` (the server cannot stream tool calls), or ``forced`` (only when one tool
            is forced by name: llama-cpp-python streams tool calls only then).
        stream_usage: ask for token usage in the stream (``stream_options.include_usage``).
        tool_results_as_user: the server leaves ``tool`` messages out of the prompt it gives the
            model (llama-cpp-python's ``chatml-function-calling`` format does), so after each run
            of tool results a user message restates them (``Result of <tool>: <text>``), with
            ``tool_results_note`` as its last line. The tool messages are still sent.
        tool_results_note: the last line of that user message.
        tool_calls_in_text: recover a reply whose whole text is one call of an offered tool,
            as JSON (no ``tool_calls``, finish ``stop``), as a server without a tool-call
            parser for the model sends it: vLLM without ``--enable-auto-tool-choice
            --tool-call-parser``, llama.cpp's server without ``--jinja``, Ollama or LM Studio
            with a model whose template has no tool section, a LiteLLM proxy in front of any of
            them. The call runs and the output's ``stop_detail`` says it was recovered from
            text (see :mod:`agentstream.models.text_calls`). Default False: such a reply stays
            the answer, with a warning in the log and in
            ``agentstream_model_text_tool_calls_total{recovered="false"}``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool_call_content: Literal["null", "empty", "omit"] = "null"
    reasoning_field: str = "reasoning_content"
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    required_tool_choice: Literal["required", "named", "auto"] = "required"
    stream_tools: Literal["always", "never", "forced"] = "always"
    stream_usage: bool = True
    tool_results_as_user: bool = False
    tool_results_note: str = "Answer the question in one short sentence."
    tool_calls_in_text: bool = False

    @pydantic.model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "reasoning_replay" in data:
            raise ValueError(
                "quirks.reasoning_replay is gone: the agent's context policy alone turns reasoning replay on "
                "(ContextPolicy(reasoning=CURRENT_TURN) or ALWAYS; see agentstream.context), and the endpoint says "
                "only where its server takes reasoning back (quirks.reasoning_field, default reasoning_content)"
            )
        return data


DEFAULT_QUIRKS = Quirks()


@dataclass(frozen=True)
class ModelEndpoint:
    """One model behind one HTTP endpoint.

    Attributes:
        id: the id agents use (``default``, ``cheap``, ...).
        provider: the provider kind: ``openai`` (any OpenAI-compatible chat-completions server)
            or ``anthropic`` (the Anthropic Messages API).
        base_url: the API root, e.g. ``https://api.openai.com/v1`` or ``https://api.anthropic.com``.
        model: the provider's model name sent in each request.
        api_key: the key; never recorded or logged.
        api_key_env: the name of the environment variable the key was read from, if any.
        window_tokens: the context window in tokens (the limits of an agent that names none,
            see :attr:`limits`).
        chars_per_token: characters of Latin text per token, for estimates (no tokenizer is
            loaded); other scripts count by Unicode class (see
            :func:`agentstream.context.limits.text_chars`).
        stream: stream replies (server-sent events), so tokens reach the delta stream as they
            are written. See ``Quirks.stream_tools`` for servers that cannot stream tool calls.
        thinking_budget_tokens: Anthropic extended thinking's budget in tokens (at least 1024),
            or None for no thinking. The output limit sent is the agent's plus this budget.
        anthropic_version: the ``anthropic-version`` header.
        extra_body: fields added to every request body (they may not set a field the adapter
            sets, see :data:`ADAPTER_FIELDS`).
        headers: extra HTTP headers (not the key's header).
        quirks: what the server needs beyond its documentation.
        timeout_s: one HTTP request's timeout in seconds (None: the service's setting).
        retries: retries of a failed request (None: the service's setting).
        inline_tool_schemas: send each tool's argument schema with its ``$ref``s inlined and
            no ``$defs`` (for endpoints that refuse them, such as Gemini's OpenAI-compatible
            API); a tool with a recursive model is then refused at startup
            (:func:`check_agents`). Default False: the schemas as pydantic writes them.
    """

    id: str
    provider: str
    base_url: str
    model: str
    api_key: SecretStr | None = field(default=None, repr=False)
    api_key_env: str | None = None
    window_tokens: int = 8192
    chars_per_token: float = 3.0
    stream: bool = True
    thinking_budget_tokens: int | None = None
    anthropic_version: str = "2023-06-01"
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    quirks: Quirks = DEFAULT_QUIRKS
    timeout_s: float | None = None
    retries: int | None = None
    inline_tool_schemas: bool = False

    def __post_init__(self) -> None:
        if self.provider not in PROVIDERS:
            raise ConfigError(
                f"model endpoint {self.id!r}: unknown provider {self.provider!r} (known: {', '.join(PROVIDERS)})"
            )
        clash = sorted(set(self.extra_body) & ADAPTER_FIELDS[self.provider])
        if clash:
            raise ConfigError(
                f"model endpoint {self.id!r}: extra_body sets {clash}, which the {self.provider} adapter sets "
                "itself; remove them (use the agent's settings or the endpoint's quirks instead)"
            )
        bad_headers = sorted(h for h in self.headers if h.lower() in ADAPTER_HEADERS)
        if bad_headers:
            raise ConfigError(f"model endpoint {self.id!r}: headers {bad_headers} are set by the adapter")
        if self.thinking_budget_tokens is not None:
            if self.provider != "anthropic":
                raise ConfigError(f"model endpoint {self.id!r}: thinking_budget_tokens is an Anthropic setting")
            if self.thinking_budget_tokens < 1024:
                raise ConfigError(
                    f"model endpoint {self.id!r}: thinking_budget_tokens must be at least 1024 "
                    f"(the Messages API minimum), got {self.thinking_budget_tokens}"
                )

    @property
    def limits(self) -> ModelLimits:
        """The model's limits as the context builder takes them: ``window_tokens`` and
        ``chars_per_token``. Every agent without ``model_limits`` gets these (see
        :func:`agentstream.delegation.offered_agent`), in the agent loop, the compaction
        service and replay alike, so their requests and fingerprints agree. Only this model's
        recorded token counts correct its estimates (``ModelLimits.model``): a count another model
        recorded in the same trace was made by another tokenizer."""
        return ModelLimits(
            window=Tokens(self.window_tokens), characters_per_token=self.chars_per_token, model=self.model
        )


class _EndpointOptions(BaseModel):
    """The settings of an endpoint besides where it is (for AGENTSTREAM_DEFAULT_MODEL_OPTIONS)."""

    model_config = ConfigDict(extra="forbid")

    window_tokens: int = Field(default=8192, gt=0)
    chars_per_token: float = Field(default=3.0, gt=0)
    stream: bool = True
    thinking_budget_tokens: int | None = None
    anthropic_version: str = "2023-06-01"
    extra_body: dict[str, Any] = {}
    headers: dict[str, str] = {}
    quirks: Quirks = DEFAULT_QUIRKS
    timeout_s: float | None = Field(default=None, gt=0)
    retries: int | None = Field(default=None, ge=0)
    inline_tool_schemas: bool = False


class _EndpointEntry(_EndpointOptions):
    provider: ProviderKind
    base_url: str
    model: str
    api_key_env: str | None = None


class _ModelsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    models: dict[str, _EndpointEntry]


def _endpoint(
    endpoint_id: str,
    entry: _EndpointEntry,
    environ: Mapping[str, str],
    *,
    require_keys: bool,
    api_key: SecretStr | None = None,
) -> ModelEndpoint:
    if entry.api_key_env:
        value = environ.get(entry.api_key_env)
        if value:
            api_key = SecretStr(value)
        elif require_keys:
            raise ConfigError(
                f"model endpoint {endpoint_id!r} reads its API key from ${entry.api_key_env}, which is not set"
            )
    return ModelEndpoint(
        id=endpoint_id,
        provider=entry.provider,
        base_url=entry.base_url.rstrip("/"),
        model=entry.model,
        api_key=api_key,
        api_key_env=entry.api_key_env,
        window_tokens=entry.window_tokens,
        chars_per_token=entry.chars_per_token,
        stream=entry.stream,
        thinking_budget_tokens=entry.thinking_budget_tokens,
        anthropic_version=entry.anthropic_version,
        extra_body=dict(entry.extra_body),
        headers=dict(entry.headers),
        quirks=entry.quirks,
        timeout_s=entry.timeout_s,
        retries=entry.retries,
        inline_tool_schemas=entry.inline_tool_schemas,
    )


def _validation_message(exc: pydantic.ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}" for err in exc.errors())


def default_endpoint(settings: Settings) -> ModelEndpoint:
    """The ``default`` endpoint from the OPENAI_* settings (and AGENTSTREAM_DEFAULT_MODEL_OPTIONS).

    Raises:
        ConfigError: OPENAI_BASE_URL is unset (the all-in-one commands start the local model
            and set it; a service on its own needs it), or the options are not valid.
    """
    if not settings.openai_base_url:
        raise ConfigError(
            "no model endpoint: set OPENAI_BASE_URL (and OPENAI_MODEL, OPENAI_API_KEY) to any "
            "OpenAI-compatible server, or name endpoints in AGENTSTREAM_MODELS_FILE, or use "
            "`agentstream run`/`agentstream dev`, which start the local model"
        )
    raw = settings.default_model_options
    try:
        options = _EndpointOptions.model_validate(json.loads(raw) if raw else {})
    except (ValueError, pydantic.ValidationError) as exc:
        detail = _validation_message(exc) if isinstance(exc, pydantic.ValidationError) else str(exc)
        raise ConfigError(f"AGENTSTREAM_DEFAULT_MODEL_OPTIONS is not a valid options object: {detail}") from None
    entry = _EndpointEntry(
        provider="openai",
        base_url=settings.openai_base_url,
        model=settings.openai_model or "gpt-4o-mini",
        **options.model_dump(exclude={"quirks"}),
        quirks=options.quirks,
    )
    return _endpoint("default", entry, {}, require_keys=False, api_key=settings.openai_api_key)


def load_models_file(
    path: str | os.PathLike[str], environ: Mapping[str, str] | None = None, *, require_keys: bool = True
) -> dict[str, ModelEndpoint]:
    """The endpoints of a YAML models file (see the module docstring).

    Args:
        path: the file.
        environ: where keys are read from (default ``os.environ``).
        require_keys: raise when a named key variable is unset (False for tools that only
            rebuild requests, such as ``agentstream trace verify``).

    Raises:
        ConfigError: the file is missing, not YAML, or an entry is not valid (the message names it).
    """
    environ = os.environ if environ is None else environ
    file = Path(path)
    try:
        data = yaml.safe_load(file.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read the models file {file} (AGENTSTREAM_MODELS_FILE): {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"the models file {file} is not valid YAML: {exc}") from None
    try:
        parsed = _ModelsFile.model_validate(data)
    except pydantic.ValidationError as exc:
        raise ConfigError(f"the models file {file} is not valid: {_validation_message(exc)}") from None
    return {
        endpoint_id: _endpoint(endpoint_id, entry, environ, require_keys=require_keys)
        for endpoint_id, entry in parsed.models.items()
    }


def load_endpoints(
    settings: Settings, environ: Mapping[str, str] | None = None, *, require_keys: bool = True
) -> dict[str, ModelEndpoint]:
    """Every configured endpoint by id: ``default`` from OPENAI_* (when OPENAI_BASE_URL is set),
    then the models file (AGENTSTREAM_MODELS_FILE), whose entries win.

    Raises:
        ConfigError: nothing is configured, or the configuration is not valid.
    """
    endpoints: dict[str, ModelEndpoint] = {}
    if settings.openai_base_url:
        endpoints["default"] = default_endpoint(settings)
    if settings.models_file:
        endpoints.update(load_models_file(settings.models_file, environ, require_keys=require_keys))
    if not endpoints:
        default_endpoint(settings)  # raises the message that says what to set
    return endpoints


def check_agents(endpoints: Mapping[str, ModelEndpoint], agents: Any) -> None:
    """Raise when an agent cannot run on the model endpoints configured (a startup check).

    Raises:
        ConfigError: an agent names a model endpoint that is not configured (the message names
            the agent, the missing id and the configured ids), or a tool's argument schema
            cannot be inlined for an endpoint with ``inline_tool_schemas`` (names the agent,
            the endpoint and the tool).
    """
    from agentstream.declarations.tool_schemas import UninlinableSchema, check_inlinable

    for agent in agents:
        for model in getattr(agent, "allowed_models", (agent.model,)):
            if model not in endpoints:
                known = ", ".join(sorted(endpoints)) or "none"
                raise ConfigError(
                    f"agent {agent.name!r} names model endpoint {model!r}, which is not configured "
                    f"(configured: {known}); add it to AGENTSTREAM_MODELS_FILE or set OPENAI_BASE_URL for 'default'"
                )
            endpoint = endpoints[model]
            if endpoint.inline_tool_schemas:
                for tool in agent.tools:
                    try:
                        check_inlinable(tool.name, tool.parameters)
                    except UninlinableSchema as exc:
                        raise type(exc)(
                            exc.tool, exc.reason, f"agent {agent.name!r}, model endpoint {endpoint.id!r}: {exc}"
                        ) from None
