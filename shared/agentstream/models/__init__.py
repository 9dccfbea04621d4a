"""Model adapters: provider-neutral requests in, ModelOutputs out.

- :mod:`~agentstream.models.endpoints`: endpoints as configuration (ids, providers, keys, quirks).
- :mod:`~agentstream.models.formats`: the request body of any endpoint (pure; replay uses it).
- :mod:`~agentstream.models.openai_format` / :mod:`~agentstream.models.anthropic_format`: the
  wire formats (pure).
- :mod:`~agentstream.models.openai` / :mod:`~agentstream.models.anthropic`: the HTTP adapters,
  on the shared machinery of :mod:`~agentstream.models.base` and :mod:`~agentstream.models.http`.
- :mod:`~agentstream.models.generate`: structured generation (a reply validated against a schema).

:func:`build_models` makes one adapter per configured endpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agentstream.errors import ConfigError
from agentstream.models.endpoints import ModelEndpoint

if TYPE_CHECKING:
    import httpx

    from agentstream.models.base import ChatModel


def __getattr__(name: str) -> Any:
    # ChatModel is imported on first use: the pure formats (``models.formats``, the replay of a
    # request) import this package and must not load httpx and asyncio with the adapters.
    if name == "ChatModel":
        from agentstream.models.base import ChatModel

        return ChatModel
    raise AttributeError(f"module 'agentstream.models' has no attribute {name!r}")


def build_model(endpoint: ModelEndpoint, *, client: httpx.AsyncClient | None = None, **settings: Any) -> ChatModel:
    """The adapter for one endpoint, by its provider kind.

    Args:
        endpoint: the endpoint.
        client: a shared ``httpx.AsyncClient``.
        settings: ``timeout_s``, ``retries``, ``backoff_s``, ``sleep``, ``deadline_s`` (see ``HttpChatModel``).

    Raises:
        ConfigError: the provider kind has no adapter.
    """
    if endpoint.provider == "openai":
        from agentstream.models.openai import OpenAIChatModel

        return OpenAIChatModel(endpoint, client=client, **settings)
    if endpoint.provider == "anthropic":
        from agentstream.models.anthropic import AnthropicMessagesModel

        return AnthropicMessagesModel(endpoint, client=client, **settings)
    raise ConfigError(f"model endpoint {endpoint.id!r}: no adapter for provider {endpoint.provider!r}")


def build_models(
    endpoints: Mapping[str, ModelEndpoint], *, client: httpx.AsyncClient | None = None, **settings: Any
) -> dict[str, ChatModel]:
    """One adapter per endpoint id (see :func:`build_model`)."""
    return {
        endpoint_id: build_model(endpoint, client=client, **settings) for endpoint_id, endpoint in endpoints.items()
    }


def endpoints_of(models: Mapping[str, Any]) -> dict[str, ModelEndpoint]:
    """The endpoints behind model clients by id (clients without one, such as test doubles, are left out)."""
    return {
        model_id: m.endpoint
        for model_id, m in models.items()
        if isinstance(getattr(m, "endpoint", None), ModelEndpoint)
    }


__all__ = ["ChatModel", "ModelEndpoint", "build_model", "build_models", "endpoints_of"]
