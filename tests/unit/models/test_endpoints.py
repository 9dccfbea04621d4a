"""Model endpoints as configuration: the models file, the default from OPENAI_*, startup checks."""

from __future__ import annotations

import pytest

from agentstream.declarations.agents import Agent
from agentstream.errors import ConfigError
from agentstream.models import build_models
from agentstream.models.anthropic import AnthropicMessagesModel
from agentstream.models.endpoints import ModelEndpoint, check_agents, load_endpoints
from agentstream.models.openai import OpenAIChatModel
from agentstream.ops.settings import Settings

MODELS = """
models:
  deepseek:
    provider: openai
    base_url: https://api.deepseek.com/v1/
    model: deepseek-chat
    api_key_env: TEST_DEEPSEEK_KEY
    window_tokens: 128000
    chars_per_token: 3.5
    quirks:
      reasoning_field: reasoning
      tool_call_content: "null"
  claude:
    provider: anthropic
    base_url: https://api.anthropic.com
    model: claude-sonnet-4-5
    api_key_env: TEST_ANTHROPIC_KEY
    thinking_budget_tokens: 2048
    stream: false
"""


def settings(monkeypatch, tmp_path, text=MODELS, **env):
    path = tmp_path / "models.yaml"
    path.write_text(text)
    for name in ("OPENAI_BASE_URL", "OPENAI_MODEL", "OPENAI_API_KEY", "AGENTSTREAM_DEFAULT_MODEL_OPTIONS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AGENTSTREAM_MODELS_FILE", str(path))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return Settings()


def test_models_file_and_default(monkeypatch, tmp_path):
    s = settings(
        monkeypatch,
        tmp_path,
        OPENAI_BASE_URL="http://127.0.0.1:9/v1",
        OPENAI_MODEL="local",
        AGENTSTREAM_DEFAULT_MODEL_OPTIONS='{"stream": false, "quirks": {"stream_tools": "forced"}}',
    )
    endpoints = load_endpoints(s, {"TEST_DEEPSEEK_KEY": "sk-deep", "TEST_ANTHROPIC_KEY": "sk-ant"})
    assert sorted(endpoints) == ["claude", "deepseek", "default"]
    deep = endpoints["deepseek"]
    assert (
        deep.base_url == "https://api.deepseek.com/v1" and deep.window_tokens == 128000 and deep.chars_per_token == 3.5
    )
    assert deep.quirks.reasoning_field == "reasoning" and deep.quirks.tool_call_content == "null"
    assert deep.api_key.get_secret_value() == "sk-deep" and "sk-deep" not in repr(deep)
    assert endpoints["claude"].provider == "anthropic" and endpoints["claude"].thinking_budget_tokens == 2048
    assert endpoints["default"].stream is False and endpoints["default"].quirks.stream_tools == "forced"
    models = build_models(endpoints)
    assert isinstance(models["claude"], AnthropicMessagesModel) and isinstance(models["deepseek"], OpenAIChatModel)


def test_a_missing_key_variable_is_a_configuration_error_naming_it(monkeypatch, tmp_path):
    s = settings(monkeypatch, tmp_path)
    with pytest.raises(ConfigError, match="TEST_DEEPSEEK_KEY"):
        load_endpoints(s, {})
    assert sorted(load_endpoints(s, {}, require_keys=False)) == ["claude", "deepseek"]  # replay needs no keys


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("models:\n  x:\n    provider: cohere\n    base_url: u\n    model: m\n", "provider"),
        ("models:\n  x:\n    provider: openai\n    base_url: u\n    model: m\n    quirks: {nope: 1}\n", "nope"),
        (
            "models:\n  x:\n    provider: openai\n    base_url: u\n    model: m\n    extra_body: {model: other}\n",
            "extra_body",
        ),
        (
            "models:\n  x:\n    provider: anthropic\n    base_url: u\n    model: m\n    thinking_budget_tokens: 100\n",
            "1024",
        ),
        ("models: [", "YAML"),
    ],
)
def test_bad_models_files_are_refused_with_the_reason(monkeypatch, tmp_path, text, match):
    with pytest.raises(ConfigError, match=match):
        load_endpoints(settings(monkeypatch, tmp_path, text=text), {})


def test_extra_fields_that_override_the_adapter_are_refused():
    with pytest.raises(ConfigError, match="temperature"):
        ModelEndpoint(id="x", provider="openai", base_url="u", model="m", extra_body={"temperature": 2})
    with pytest.raises(ConfigError, match="Authorization"):
        ModelEndpoint(id="x", provider="openai", base_url="u", model="m", headers={"Authorization": "Bearer x"})
    ModelEndpoint(id="x", provider="openai", base_url="u", model="m", extra_body={"top_p": 0.9})  # fine


def test_agents_must_name_configured_endpoints(monkeypatch, tmp_path):
    endpoints = load_endpoints(settings(monkeypatch, tmp_path), {}, require_keys=False)
    check_agents(endpoints, [Agent(name="a", system_prompt="S", model="claude")])
    with pytest.raises(ConfigError, match="'default'.*configured: claude, deepseek"):
        check_agents(endpoints, [Agent(name="a", system_prompt="S")])


def test_nothing_configured_says_what_to_set(monkeypatch):
    for name in ("OPENAI_BASE_URL", "AGENTSTREAM_MODELS_FILE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="OPENAI_BASE_URL"):
        load_endpoints(Settings())


def test_inline_tool_schemas_is_an_endpoint_setting(monkeypatch, tmp_path):
    text = """
models:
  gemini:
    provider: openai
    base_url: https://generativelanguage.googleapis.com/v1beta/openai
    model: gemini-2.5-flash
    inline_tool_schemas: true
"""
    s = settings(
        monkeypatch,
        tmp_path,
        text,
        OPENAI_BASE_URL="http://127.0.0.1:9/v1",
        AGENTSTREAM_DEFAULT_MODEL_OPTIONS='{"window_tokens": 4096}',
    )
    endpoints = load_endpoints(s, {})
    assert endpoints["gemini"].inline_tool_schemas and not endpoints["default"].inline_tool_schemas
    assert endpoints["gemini"].quirks.tool_call_content == "null"  # the OpenAI API's form by default


def test_the_former_reasoning_replay_quirk_is_refused_naming_the_one_switch(monkeypatch, tmp_path):
    text = MODELS.replace("reasoning_field: reasoning", "reasoning_replay: current_turn")
    s = settings(monkeypatch, tmp_path, text=text)
    with pytest.raises(ConfigError) as info:
        load_endpoints(s, {"TEST_DEEPSEEK_KEY": "sk-deep", "TEST_ANTHROPIC_KEY": "sk-ant"})
    assert "reasoning_replay" in str(info.value) and "ContextPolicy(reasoning=CURRENT_TURN)" in str(info.value)
