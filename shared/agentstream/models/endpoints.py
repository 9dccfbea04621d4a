"""Model endpoints as configuration: which server, which model, which key, which quirks.

Agents name a model by endpoint id; ``default`` is built from OPENAI_BASE_URL / OPENAI_API_KEY /
OPENAI_MODEL (see :mod:`agentstream.settings`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import SecretStr

from agentstream.errors import ConfigError
from agentstream.settings import Settings


@dataclass(frozen=True)
class ModelEndpoint:
    """One model behind one HTTP endpoint.

    Attributes:
        id: the id agents use (``default``, ``cheap``, ...).
        provider: the provider kind: ``openai`` (any OpenAI-compatible chat-completions server).
        base_url: the API root, e.g. ``https://api.openai.com/v1``.
        model: the provider's model name sent in each request.
        api_key: the key, sent as a Bearer token; never recorded or logged.
        window_tokens: the context window in tokens.
        chars_per_token: characters per token for estimates (no tokenizer is loaded).
    """

    id: str
    provider: str
    base_url: str
    model: str
    api_key: SecretStr | None = field(default=None, repr=False)
    window_tokens: int = 8192
    chars_per_token: float = 3.0


def default_endpoint(settings: Settings) -> ModelEndpoint:
    """The ``default`` endpoint from the OPENAI_* settings.

    Raises:
        ConfigError: OPENAI_BASE_URL is unset (the all-in-one commands start the local model
            and set it; a service on its own needs it).
    """
    if not settings.openai_base_url:
        raise ConfigError(
            "no model endpoint: set OPENAI_BASE_URL (and OPENAI_MODEL, OPENAI_API_KEY) to any "
            "OpenAI-compatible server, or use `agentstream run`/`agentstream dev`, which start the local model"
        )
    return ModelEndpoint(
        id="default",
        provider="openai",
        base_url=settings.openai_base_url.rstrip("/"),
        model=settings.openai_model or "gpt-4o-mini",
        api_key=settings.openai_api_key,
    )
