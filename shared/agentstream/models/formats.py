"""Request bodies by provider: the one place that knows which wire format an endpoint speaks.

Pure: the adapters send exactly :func:`request_body`'s bytes, and replay
(:mod:`agentstream.steps.replay`) rebuilds them from the stored trace with the same function, so a
recorded fingerprint can be checked for any provider.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from agentstream.context.request import ChatRequest
from agentstream.declarations.tool_schemas import inline_refs
from agentstream.errors import ConfigError
from agentstream.models import anthropic_format, openai_format
from agentstream.models.endpoints import ModelEndpoint


@dataclass(frozen=True)
class CallOptions:
    """Per-call request settings beyond the ChatRequest (structured generation uses them).

    Attributes:
        seed: the sampling seed, sent only when set (OpenAI-compatible servers).
        response_format: the ``response_format`` object (OpenAI-compatible servers only).
    """

    seed: int | None = None
    response_format: dict[str, Any] | None = None


def streams(request: ChatRequest, endpoint: ModelEndpoint) -> bool:
    """Whether the call is sent streamed (the endpoint's ``stream`` setting and its quirks)."""
    if endpoint.provider == "anthropic":
        return endpoint.stream
    return openai_format.streams(request, stream=endpoint.stream, quirks=endpoint.quirks)


def request_body(
    request: ChatRequest, endpoint: ModelEndpoint, *, options: CallOptions | None = None, replay_thinking: bool = True
) -> bytes:
    """The exact body bytes an adapter sends for ``request`` to ``endpoint``.

    Args:
        replay_thinking: Anthropic only: False leaves every thinking block out (the fallback
            body after the API refused a thinking signature).

    Raises:
        ConfigError: the options ask for something the endpoint's provider cannot send.
    """
    options = options or CallOptions()
    if endpoint.inline_tool_schemas and request.tools:
        request = inlined_tools(request)
    stream = streams(request, endpoint)
    if endpoint.provider == "anthropic":
        if options.response_format is not None or options.seed is not None:
            raise ConfigError(
                f"model endpoint {endpoint.id!r} (anthropic) takes no response_format or seed; "
                "put the reply's contract in the prompt (response_format='prompt')"
            )
        return anthropic_format.request_body(
            request,
            model=endpoint.model,
            thinking_budget_tokens=endpoint.thinking_budget_tokens,
            stream=stream,
            extra_body=dict(endpoint.extra_body),
            replay_thinking=replay_thinking,
        )
    return openai_format.request_body(
        request,
        model=endpoint.model,
        quirks=endpoint.quirks,
        stream=stream,
        extra_body=dict(endpoint.extra_body),
        seed=options.seed,
        response_format=options.response_format,
    )


def inlined_tools(request: ChatRequest) -> ChatRequest:
    """``request`` with each tool's schema inlined (no ``$ref``, no ``$defs``; see
    :mod:`agentstream.declarations.tool_schemas`).

    Raises:
        ConfigError: a tool's schema is recursive (refused at startup by
            :func:`agentstream.models.endpoints.check_agents` for the app's own tools).
    """
    tools = tuple(
        msgspec.structs.replace(t, parameters=inline_refs(dict(t.parameters), tool=t.name)) for t in request.tools
    )
    return msgspec.structs.replace(request, tools=tools)


def candidate_bodies(
    request: ChatRequest, endpoint: ModelEndpoint, *, options: CallOptions | None = None
) -> list[bytes]:
    """Every body an adapter may send for ``request``, in the order it would try them.

    The first is the normal body; for Anthropic a second, without thinking blocks, is sent
    once when the API refuses a thinking signature (C06). Replay accepts a recorded fingerprint
    that matches any of them.
    """
    first = request_body(request, endpoint, options=options)
    if endpoint.provider != "anthropic":
        return [first]
    fallback = request_body(request, endpoint, options=options, replay_thinking=False)
    return [first] if fallback == first else [first, fallback]


def fingerprint(body: bytes) -> str:
    """Hex sha256 of a request body."""
    return openai_format.fingerprint(body)
