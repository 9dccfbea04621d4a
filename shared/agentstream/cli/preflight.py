"""The model endpoints checked before ``run`` or ``dev`` starts anything, as Redis is.

Before, a missing key or a dead endpoint showed only once the whole stack had started (15-18 s),
then twice (a service's warning and the failure line). Now each configured endpoint is checked
first, and the first problem is one line (exit code 2):

- a key: an endpoint on another machine with no key (``OPENAI_BASE_URL`` without
  ``OPENAI_API_KEY``) is refused. A server on this machine (``localhost``, ``127.0.0.0/8``,
  ``::1``: Ollama, vLLM, llama.cpp on a laptop) usually needs none, so it may go without;
- an answer: ``GET <base>/models`` (the OpenAI and the Anthropic API both have it) must get an
  HTTP answer within :data:`REACH_TIMEOUT_S`; a 401 or 403 means the key was refused. Any other
  status counts as alive (a server without ``/models`` answers 404; the chat call may still work).

:func:`key_problem`, :func:`answer_problem` and :func:`models_url` decide (pure);
:func:`check_endpoints` makes the requests.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

import httpx

from agentstream.errors import AgentStreamError
from agentstream.models.endpoints import ModelEndpoint
from agentstream.ops.redact import redact_url

REACH_TIMEOUT_S = 5.0
"""How long the check waits for a model endpoint's answer, in seconds."""


def is_local(base_url: str) -> bool:
    """Whether ``base_url``'s host is this machine (``localhost``, a loopback address)."""
    host = (urlsplit(base_url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _where(endpoint: ModelEndpoint) -> str:
    """How a message names an endpoint and the settings behind it."""
    source = "OPENAI_BASE_URL" if endpoint.id == "default" else "AGENTSTREAM_MODELS_FILE"
    return f"the model endpoint {endpoint.id!r} at {redact_url(endpoint.base_url)} ({source})"


def _key_name(endpoint: ModelEndpoint) -> str:
    return endpoint.api_key_env or ("OPENAI_API_KEY" if endpoint.id == "default" else "its api_key_env")


def key_problem(endpoint: ModelEndpoint) -> str | None:
    """What is wrong with ``endpoint``'s key before anything is sent, or None: a remote endpoint
    without a key (a local one may go without)."""
    has_key = endpoint.api_key is not None and bool(endpoint.api_key.get_secret_value())
    if has_key or is_local(endpoint.base_url):
        return None
    return (
        f"{_where(endpoint)} has no API key: set {_key_name(endpoint)} (only a server on this machine, "
        "localhost or 127.x, may go without one)"
    )


def answer_problem(endpoint: ModelEndpoint, status: int | None, error: str | None = None) -> str | None:
    """What the answer to ``GET <base>/models`` says is wrong, or None: no answer (``status``
    None, ``error`` the reason) or a refused key (401, 403); any other status is an answer."""
    if status is None:
        return f"cannot reach {_where(endpoint)}: {error or 'no answer'}"
    if status in (401, 403):
        return f"{_where(endpoint)} refused the API key (HTTP {status}): check {_key_name(endpoint)}"
    return None


def models_url(endpoint: ModelEndpoint) -> str:
    """The endpoint's ``GET /models`` URL (Anthropic's base may leave out its ``/v1``)."""
    base = endpoint.base_url.rstrip("/")
    if endpoint.provider == "anthropic" and not base.endswith("/v1"):
        return f"{base}/v1/models"
    return f"{base}/models"


def _headers(endpoint: ModelEndpoint) -> dict[str, str]:
    headers = dict(endpoint.headers)
    key = endpoint.api_key.get_secret_value() if endpoint.api_key is not None else ""
    if endpoint.provider == "anthropic":
        headers["anthropic-version"] = endpoint.anthropic_version
        if key:
            headers["x-api-key"] = key
    elif key:
        headers["authorization"] = f"Bearer {key}"
    return headers


def check_endpoints(endpoints: Iterable[ModelEndpoint], *, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Check each endpoint's key, then that it answers (one request each).

    Raises:
        AgentStreamError: the first problem, as one line naming the endpoint and the setting.
    """
    endpoints = list(endpoints)
    for endpoint in endpoints:
        problem = key_problem(endpoint)
        if problem:
            raise AgentStreamError(problem)
    with httpx.Client(timeout=timeout_s, follow_redirects=True) as client:
        for endpoint in endpoints:
            try:
                status: int | None = client.get(models_url(endpoint), headers=_headers(endpoint)).status_code
                error = None
            except httpx.TimeoutException:
                status, error = None, f"no answer within {timeout_s:g} s"
            except httpx.HTTPError as exc:
                status, error = None, (str(exc).splitlines() or [type(exc).__name__])[0] or type(exc).__name__
            problem = answer_problem(endpoint, status, error)
            if problem:
                raise AgentStreamError(problem)
