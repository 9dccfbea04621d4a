"""The model endpoint checks that `run` and `dev` make before they start anything (issue 38):
which endpoint may go without a key, what an answer means, where the check asks."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from agentstream.cli.preflight import answer_problem, is_local, key_problem, models_url
from agentstream.models.endpoints import ModelEndpoint


def endpoint(base_url: str, key: str | None = None, *, provider: str = "openai", id: str = "default"):
    return ModelEndpoint(
        id=id, provider=provider, base_url=base_url, model="m", api_key=SecretStr(key) if key is not None else None
    )


@pytest.mark.parametrize(
    "url, local",
    [
        ("http://localhost:11434/v1", True),
        ("http://127.0.0.1:8000/v1", True),
        ("http://127.8.9.1/v1", True),
        ("http://[::1]:8000/v1", True),
        ("https://api.openai.com/v1", False),
        ("http://10.0.0.5:8000/v1", False),  # another machine on the network needs its key
        ("http://localhost.example.com/v1", False),
    ],
)
def test_only_this_machine_is_local(url, local):
    assert is_local(url) is local


def test_a_remote_endpoint_without_a_key_is_refused_and_a_local_one_is_not():
    problem = key_problem(endpoint("https://api.openai.com/v1"))
    assert problem == (
        "the model endpoint 'default' at https://api.openai.com/v1 (OPENAI_BASE_URL) has no API key: set "
        "OPENAI_API_KEY (only a server on this machine, localhost or 127.x, may go without one)"
    )
    assert key_problem(endpoint("https://api.openai.com/v1", "")) is not None  # an empty key is no key
    assert key_problem(endpoint("https://api.openai.com/v1", "sk-x")) is None
    assert key_problem(endpoint("http://127.0.0.1:8000/v1")) is None
    named = ModelEndpoint(
        id="big", provider="openai", base_url="https://x.example/v1", model="m", api_key_env="BIG_KEY"
    )
    assert "(AGENTSTREAM_MODELS_FILE) has no API key: set BIG_KEY" in key_problem(named)


def test_an_answer_is_alive_unless_it_refuses_the_key():
    e = endpoint("http://127.0.0.1:9/v1")
    assert answer_problem(e, 200) is None and answer_problem(e, 404) is None and answer_problem(e, 500) is None
    assert answer_problem(e, 401) == (
        "the model endpoint 'default' at http://127.0.0.1:9/v1 (OPENAI_BASE_URL) refused the API key (HTTP 401): "
        "check OPENAI_API_KEY"
    )
    assert answer_problem(e, None, "Connection refused") == (
        "cannot reach the model endpoint 'default' at http://127.0.0.1:9/v1 (OPENAI_BASE_URL): Connection refused"
    )


def test_the_check_asks_for_the_model_list():
    assert models_url(endpoint("https://api.openai.com/v1/")) == "https://api.openai.com/v1/models"
    assert models_url(endpoint("https://api.anthropic.com", provider="anthropic")) == (
        "https://api.anthropic.com/v1/models"
    )
    assert models_url(endpoint("https://api.anthropic.com/v1", provider="anthropic")) == (
        "https://api.anthropic.com/v1/models"
    )


def test_a_key_in_the_url_is_not_shown():
    problem = answer_problem(endpoint("https://user:hunter2@127.0.0.1:9/v1"), None, "refused")
    assert "hunter2" not in problem
