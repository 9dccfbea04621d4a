"""Structured generation: a model's reply as text, or as JSON validated against a schema.

For code that asks a model to write something — a query, a plan, an extraction — and needs a
value it can trust::

    gen = Generator(build_model(endpoint))
    g = await gen.generate("Write one SQLite query that ...")           # g.value: the text
    g = await gen.generate(messages, schema=Plan)                       # g.value: a Plan (pydantic)
    g = await gen.generate(messages, schema={"type": "object", ...})    # g.value: JSON checked by the schema
    g = await gen.sample(messages, k=3, temperature=0.8)                # g.value: 3 values, None where one failed

What is accepted. Only a complete, well-formed reply: a refusal, a content-filter stop, a reply
cut off by the output limit (``length``), one that stopped for a reason agentstream does not
know, an empty one, a ``parse`` function that raises or returns None, text that is not JSON,
and JSON that does not match the schema all raise :class:`InvalidModelOutput` with the reason.
Nothing is repaired or guessed; the one allowance is that a reply wrapped whole in a Markdown
code fence (```json … ```) is read inside the fence, which changes no character of the value.

What escalates. The adapters retry network errors, timeouts and HTTP 408/409/429 (honouring
Retry-After) and 5xx, then raise :class:`ModelUnanswered`; HTTP 400/413/422 raise
:class:`ModelInputRejected` at once; a wrong key, model or URL raises :class:`ModelConfigError`
(see :mod:`agentstream.models.http`). Extra body fields that would override a field the adapter
sets are refused when the endpoint is made (:class:`ModelEndpoint`).

The record. Every reply is a :class:`ModelOutput`: the endpoint, the model, the sha256 of the
exact request body, the stop reason, the usage and the text; given a trace (``trace=`` a
:class:`~agentstream.runtime.store.TraceStore` or anything with its ``append``, and ``trace_id=``),
:meth:`Generator.generate` and :meth:`Generator.sample` append each reply's output to it, a
rejected one too, in the order of the replies (not one whose ``persist`` is False). :class:`Generated` adds, per reply, the
temperature, the seed and the error. The API key
is never recorded. A recorded reply can be read again through the same schema without calling
the model (:meth:`Generator.recheck`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import jsonschema
import pydantic

from agentstream.context.request import AssistantMessage, ChatRequest, Message, ToolResultMessage, UserMessage
from agentstream.errors import ConfigError, InvalidModelOutput, ModelError
from agentstream.models.base import ChatModel
from agentstream.models.endpoints import ModelEndpoint
from agentstream.models.formats import CallOptions
from agentstream.wire.events import ModelOutput
from agentstream.wire.jsontext import unicode_problem

ResponseFormat = Literal["prompt", "json_object", "json_schema"]
Schema = Any
"""A pydantic model or any type pydantic validates (``list[Row]``, ``dict[str, int]``, ...), or a
JSON schema (a dict; draft 2020-12, checked with the ``jsonschema`` library)."""

_REFUSED = {
    "refusal": "the model refused",
    "content_filter": "the provider's content filter stopped the reply",
    "length": "the reply was cut off by the output token limit",
    "pause": "the provider paused the reply",
    "interrupted": "the reply was interrupted",
    "unknown": "the reply ended for a reason agentstream does not know",
}


class TraceRecorder(Protocol):
    """Where a generation records its model outputs (a :class:`~agentstream.runtime.store.TraceStore`)."""

    async def append(self, trace_id: str, event: Any) -> Any:
        """Append one event to the trace ``trace_id``."""


def _check_trace(trace: TraceRecorder | None, trace_id: str | None) -> None:
    if trace is not None and not trace_id:
        raise ValueError("a generation given a trace needs the trace_id to record its outputs under")


@dataclass(frozen=True)
class Attempt:
    """One reply of a generation: how it was asked, what came back, and why it failed if it did.

    Attributes:
        output: the model output (None when the call itself failed).
        temperature: the sampling temperature sent.
        seed: the seed sent, or None.
        error: why the reply was not accepted (or why the call failed), or None.
    """

    output: ModelOutput | None
    temperature: float
    seed: int | None
    error: str | None = None


@dataclass(frozen=True)
class Generated:
    """What a generation returns.

    Attributes:
        value: the text, the parsed value, the validated value; for :meth:`Generator.sample`
            the list of values, None where a reply failed.
        attempts: one :class:`Attempt` per reply, in order.
    """

    value: Any
    attempts: tuple[Attempt, ...] = field(default=())

    @property
    def outputs(self) -> tuple[ModelOutput, ...]:
        """The model outputs of the replies that came back (to append to a trace)."""
        return tuple(a.output for a in self.attempts if a.output is not None)


class _Checker:
    """Validates parsed JSON against a pydantic type or a JSON schema."""

    def __init__(self, schema: Schema):
        self.schema = schema
        if isinstance(schema, Mapping):
            try:
                jsonschema.Draft202012Validator.check_schema(schema)
            except jsonschema.SchemaError as exc:
                raise ConfigError(f"the JSON schema is not valid: {exc.message}") from None
            self._validator: jsonschema.Draft202012Validator | None = jsonschema.Draft202012Validator(schema)
            self._adapter: pydantic.TypeAdapter[Any] | None = None
        else:
            try:
                self._adapter = pydantic.TypeAdapter(schema)
            except pydantic.PydanticSchemaGenerationError as exc:
                raise ConfigError(f"{schema!r} is not a type pydantic can validate: {exc}") from None
            self._validator = None

    def json_schema(self) -> dict[str, Any]:
        return dict(self.schema) if self._adapter is None else self._adapter.json_schema()

    def check(self, value: Any) -> Any:
        if self._adapter is not None:
            try:
                return self._adapter.validate_python(value)
            except pydantic.ValidationError as exc:
                err = exc.errors()[0]
                where = ".".join(str(p) for p in err["loc"]) or "(the value)"
                raise InvalidModelOutput(f"the reply does not match the schema: {where}: {err['msg']}") from None
        assert self._validator is not None  # a JSON schema's checker: no adapter
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(value))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(the value)"
            raise InvalidModelOutput(f"the reply does not match the schema: {where}: {error.message}")
        return value


def _json_text(text: str) -> str:
    """The JSON text of a reply: the reply stripped, or the inside of one code fence around it all."""
    stripped = text.strip()
    if stripped.startswith("```") and stripped.endswith("```") and stripped.count("```") == 2:
        inner = stripped[3:-3]
        head, newline, rest = inner.partition("\n")
        if newline and (not head.strip() or head.strip().isalnum()):  # ```json
            inner = rest
        return inner.strip()
    return stripped


def _messages(messages: str | Sequence[Mapping[str, Any] | Message]) -> tuple[str, tuple[Message, ...]]:
    if isinstance(messages, str):
        return "", (UserMessage(text=messages),)
    system_parts: list[str] = []
    out: list[Message] = []
    for message in messages:
        if isinstance(message, (UserMessage, AssistantMessage, ToolResultMessage)):
            out.append(message)
            continue
        role, content = message.get("role"), message.get("content")
        if not isinstance(content, str):
            raise ConfigError(f"a message's content must be text, got {type(content).__name__}")
        if role == "system":
            system_parts.append(content)
        elif role == "user":
            out.append(UserMessage(text=content))
        elif role == "assistant":
            out.append(AssistantMessage(content=content))
        else:
            raise ConfigError(f"unknown message role {role!r} (use system, user or assistant)")
    if not out:
        raise ConfigError("a generation needs at least one user message")
    return "\n\n".join(system_parts), tuple(out)


class Generator:
    """A generating model over one adapter (see the module docstring).

    Args:
        model: the adapter (``build_model(endpoint)``).
        max_tokens: the output limit per reply, in tokens (reasoning counts against it on
            reasoning models).
        temperature: the sampling temperature (0 by default).
        seed: the seed, sent only when set (OpenAI-compatible servers).
        response_format: ``prompt`` (default: the contract is in your prompt, the request
            carries none), ``json_object`` or ``json_schema`` (the schema is sent) — for a
            structured reply only, OpenAI-compatible servers only. Whatever the server
            enforces, the reply is validated here.
        workers: how many replies :meth:`sample` asks for at the same time.

    Raises:
        ConfigError: a response format the endpoint's provider cannot send.
    """

    def __init__(
        self,
        model: ChatModel,
        *,
        max_tokens: int = 1024,
        temperature: float = 0.0,
        seed: int | None = None,
        response_format: ResponseFormat = "prompt",
        workers: int = 4,
    ):
        if response_format not in ("prompt", "json_object", "json_schema"):
            raise ConfigError(f"response_format must be prompt, json_object or json_schema, got {response_format!r}")
        if model.endpoint.provider != "openai" and response_format != "prompt":
            raise ConfigError(
                f"model endpoint {model.endpoint.id!r} ({model.endpoint.provider}) takes response_format='prompt' only"
            )
        self.model = model
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.seed = seed
        self.response_format = response_format
        self.workers = max(1, workers)

    @property
    def endpoint(self) -> ModelEndpoint:
        return self.model.endpoint

    def read(self, text: str, *, schema: Schema | None = None, parse: Callable[[str], Any] | None = None) -> Any:
        """A reply's text → its value: ``parse`` (raising or returning None rejects the reply),
        then the schema (JSON read from the text, or from what ``parse`` returned if it is a string).

        Raises:
            InvalidModelOutput: with the reason the reply is not accepted.
        """
        value: Any = text
        if parse is not None:
            try:
                value = parse(text)
            except Exception as exc:
                raise InvalidModelOutput(f"the parse function refused the reply: {type(exc).__name__}: {exc}") from None
            if value is None:
                raise InvalidModelOutput("the parse function found no value in the reply")
        if schema is None:
            return value
        checker = _Checker(schema)
        if isinstance(value, str):
            problem = unicode_problem(_json_text(value))  # json.loads would make a lone surrogate no writer can encode
            if problem is not None:
                raise InvalidModelOutput(f"the reply is not Unicode JSON: {problem}")
            try:
                value = json.loads(_json_text(value))
            except ValueError as exc:
                raise InvalidModelOutput(f"the reply is not JSON: {exc}") from None
        return checker.check(value)

    def accept(
        self, output: ModelOutput, *, schema: Schema | None = None, parse: Callable[[str], Any] | None = None
    ) -> Any:
        """A model output → its value, or :class:`InvalidModelOutput` when it is not complete and well-formed."""
        if output.stop_reason not in ("stop", "tool_calls"):
            detail = f" ({output.stop_detail})" if output.stop_detail else ""
            raise InvalidModelOutput(f"{_REFUSED.get(output.stop_reason, output.stop_reason)}{detail}")
        if not output.content.strip():
            raise InvalidModelOutput("the reply is empty")
        return self.read(output.content, schema=schema, parse=parse)

    def recheck(
        self,
        output: ModelOutput,
        value: Any,
        *,
        schema: Schema | None = None,
        parse: Callable[[str], Any] | None = None,
    ) -> list[str]:
        """Replay without the model: the reasons a recorded reply does not give the recorded value."""
        try:
            again = self.accept(output, schema=schema, parse=parse)
        except InvalidModelOutput as exc:
            return [f"the recorded reply is not accepted any more: {exc.reason}"]
        dumped_again = pydantic.TypeAdapter(Any).dump_python(again, mode="json")
        dumped = pydantic.TypeAdapter(Any).dump_python(value, mode="json")
        return (
            []
            if dumped_again == dumped
            else [f"the recorded reply reads as {dumped_again!r}, not the recorded {dumped!r}"]
        )

    def _request(self, messages: Any, *, temperature: float, max_tokens: int) -> ChatRequest:
        system, history = (
            _messages(messages) if not isinstance(messages, ChatRequest) else (messages.system, messages.messages)
        )
        return ChatRequest(system=system, messages=history, max_output_tokens=max_tokens, temperature=temperature)

    def _options(self, schema: Schema | None, seed: int | None) -> CallOptions:
        response_format: dict[str, Any] | None = None
        if schema is not None and self.response_format == "json_object":
            response_format = {"type": "json_object"}
        elif schema is not None and self.response_format == "json_schema":
            response_format = {
                "type": "json_schema",
                "json_schema": {"name": "reply", "schema": _Checker(schema).json_schema()},
            }
        return CallOptions(seed=seed if self.endpoint.provider == "openai" else None, response_format=response_format)

    async def _one(
        self, messages: Any, *, schema, parse, temperature, seed, max_tokens, turn_id, step
    ) -> tuple[Any, Attempt]:
        request = self._request(messages, temperature=temperature, max_tokens=max_tokens)
        output = await self.model.complete(request, turn_id=turn_id, step=step, options=self._options(schema, seed))
        try:
            value = self.accept(output, schema=schema, parse=parse)
        except InvalidModelOutput as exc:
            exc.output = output  # type: ignore[attr-defined]
            exc.attempt = Attempt(output, temperature, seed, exc.reason)  # type: ignore[attr-defined]
            raise
        return value, Attempt(output, temperature, seed)

    async def generate(
        self,
        messages: str | Sequence[Mapping[str, Any] | Message] | ChatRequest,
        *,
        schema: Schema | None = None,
        parse: Callable[[str], Any] | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        max_tokens: int | None = None,
        turn_id: str = "",
        step: int = 0,
        trace: TraceRecorder | None = None,
        trace_id: str | None = None,
    ) -> Generated:
        """One reply → a :class:`Generated` whose value is the text, ``parse(text)``, or the JSON
        validated by ``schema``.

        Args:
            messages: a user message, ``{"role", "content"}`` dicts (system, user, assistant),
                request messages, or a whole ChatRequest.
            turn_id, step: tag the recorded model output.
            trace, trace_id: where the reply's model output is recorded (accepted or not).

        Raises:
            ValueError: ``trace`` without ``trace_id``.
            InvalidModelOutput: the reply is not accepted (the reason says why; the model output
                is on the error's ``output`` attribute). Never repaired.
            ModelUnanswered, ModelInputRejected, ModelConfigError: from the adapter.
        """
        _check_trace(trace, trace_id)
        try:
            value, attempt = await self._one(
                messages,
                schema=schema,
                parse=parse,
                temperature=self.temperature if temperature is None else temperature,
                seed=self.seed if seed is None else seed,
                max_tokens=max_tokens or self.max_tokens,
                turn_id=turn_id,
                step=step,
            )
        except InvalidModelOutput as exc:
            rejected = getattr(exc, "output", None)
            if trace is not None and rejected is not None and rejected.persist:
                await trace.append(trace_id or "", rejected)
            raise
        if trace is not None and attempt.output is not None and attempt.output.persist:
            await trace.append(trace_id or "", attempt.output)
        return Generated(value=value, attempts=(attempt,))

    async def sample(
        self,
        messages: str | Sequence[Mapping[str, Any] | Message] | ChatRequest,
        k: int = 3,
        *,
        temperature: float = 0.8,
        schema: Schema | None = None,
        parse: Callable[[str], Any] | None = None,
        max_tokens: int | None = None,
        first_greedy: bool = True,
        turn_id: str = "",
        trace: TraceRecorder | None = None,
        trace_id: str | None = None,
    ) -> Generated:
        """``k`` replies to the same messages → a Generated whose value is the list of ``k``
        values, None where a reply failed (its attempt says why).

        The first reply is asked at the generator's own temperature and seed when
        ``first_greedy`` (the reply :meth:`generate` gives); the others at ``temperature`` with
        seeds 1 … k-1, so a rerun asks the same requests. Replies are asked ``workers`` at a time.
        Given ``trace`` and ``trace_id``, every reply's model output is recorded there, in reply order.

        Raises:
            ValueError: ``k`` is below 1, or ``trace`` without ``trace_id``.
            ModelError: every reply failed (the first failure, noting how many failed).
        """
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        _check_trace(trace, trace_id)
        plans = []
        for i in range(k):
            if i == 0 and first_greedy:
                plans.append((self.temperature, self.seed))
            else:
                plans.append((temperature, i if i else None))
        limit = asyncio.Semaphore(self.workers)

        async def run(i: int, temp: float, seed: int | None) -> tuple[Any, Attempt, BaseException | None]:
            async with limit:
                try:
                    value, attempt = await self._one(
                        messages,
                        schema=schema,
                        parse=parse,
                        temperature=temp,
                        seed=seed,
                        max_tokens=max_tokens or self.max_tokens,
                        turn_id=turn_id,
                        step=i,
                    )
                    return value, attempt, None
                except InvalidModelOutput as exc:
                    return None, exc.attempt, exc  # type: ignore[attr-defined]
                except ModelError as exc:
                    return None, Attempt(None, temp, seed, f"{type(exc).__name__}: {exc}"), exc

        results = await asyncio.gather(*(run(i, t, s) for i, (t, s) in enumerate(plans)))
        if trace is not None:
            for _, attempt, _ in results:
                if attempt.output is not None and attempt.output.persist:
                    await trace.append(trace_id or "", attempt.output)
        failures = [exc for _, _, exc in results if exc is not None]
        if len(failures) == k:
            first = failures[0]
            first.add_note(f"all {k} replies failed")
            raise first
        return Generated(value=[v for v, _, _ in results], attempts=tuple(a for _, a, _ in results))


def generator(
    base_url: str,
    model: str,
    api_key: str | None = None,
    *,
    provider: str = "openai",
    extra_body: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 120.0,
    retries: int = 2,
    backoff_s: float = 1.0,
    client: Any = None,
    **settings: Any,
) -> Generator:
    """A :class:`Generator` on a new endpoint (``provider`` ``openai`` or ``anthropic``).

    ``extra_body`` is refused when it sets a field the adapter sets (model, messages,
    temperature, max_tokens, seed, response_format, stream, tools, ...); ``api_key`` is sent as
    the provider's key header and never recorded. ``settings`` go to :class:`Generator`.

    Raises:
        ConfigError: a refused extra field, an unknown provider, or a bad setting.
    """
    from pydantic import SecretStr

    from agentstream.models import build_model

    endpoint = ModelEndpoint(
        id=f"generate:{model}",
        provider=provider,
        base_url=base_url.rstrip("/"),
        model=model,
        api_key=SecretStr(api_key) if api_key else None,
        stream=False,
        extra_body=dict(extra_body or {}),
        headers=dict(headers or {}),
    )
    return Generator(
        build_model(endpoint, client=client, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s), **settings
    )
