"""Inlining a tool's argument schema for endpoints that refuse ``$ref``/``$defs`` (pure)."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from agentstream import Agent, tool
from agentstream.context.request import ChatRequest, ToolDefinition, UserMessage
from agentstream.declarations.tool_schemas import RecursiveSchemaError, inline_refs
from agentstream.errors import ConfigError
from agentstream.models import formats
from agentstream.models.endpoints import ModelEndpoint, check_agents


class Inner(BaseModel):
    """An inner model."""

    value: int


class Outer(BaseModel):
    first: Inner
    others: list[Inner] = []
    maybe: Inner | None = None


class A(BaseModel):
    b: B | None = None


class B(BaseModel):
    a: A | None = None


@tool
def nested(outer: Outer) -> str:
    """Nested models."""
    return "ok"


@tool
def mutual(a: A) -> str:
    """Mutually recursive models."""
    return "ok"


def refs_in(node) -> bool:
    if isinstance(node, dict):
        return any(k in ("$ref", "$defs", "definitions") for k in node) or any(refs_in(v) for v in node.values())
    if isinstance(node, list):
        return any(refs_in(v) for v in node)
    return False


def test_nested_models_are_inlined_everywhere_they_are_referred_to():
    inlined = inline_refs(nested.parameters, tool="nested")
    assert not refs_in(inlined)
    outer = inlined["properties"]["outer"]
    assert outer["properties"]["first"]["properties"]["value"]["type"] == "integer"
    assert outer["properties"]["others"]["items"]["properties"]["value"]["type"] == "integer"
    assert {"type": "null"} in outer["properties"]["maybe"]["anyOf"]
    assert refs_in(nested.parameters)  # the tool's own schema is left as it was


def test_keywords_beside_a_ref_are_kept_and_win():
    schema = {
        "$defs": {"X": {"type": "string", "description": "an x"}},
        "properties": {"x": {"$ref": "#/$defs/X", "description": "the x to use"}},
        "type": "object",
    }
    assert inline_refs(schema, tool="t")["properties"]["x"] == {"type": "string", "description": "the x to use"}


def test_draft_7_definitions_are_inlined_too():
    schema = {"definitions": {"X": {"type": "integer"}}, "properties": {"x": {"$ref": "#/definitions/X"}}}
    assert inline_refs(schema, tool="t") == {"properties": {"x": {"type": "integer"}}}


def test_a_schema_without_refs_comes_back_equal():
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    assert inline_refs(schema, tool="t") == schema


def test_mutual_recursion_is_refused_naming_the_tool_and_the_chain():
    with pytest.raises(
        RecursiveSchemaError, match=r"tool 'mutual'.*recursive \(#/\$defs/A -> #/\$defs/B -> #/\$defs/A\)"
    ):
        inline_refs(mutual.parameters, tool="mutual")


def test_a_ref_to_nothing_or_elsewhere_is_a_config_error():
    with pytest.raises(ConfigError, match="'#/\\$defs/Missing'"):
        inline_refs({"properties": {"x": {"$ref": "#/$defs/Missing"}}}, tool="t")
    with pytest.raises(ConfigError, match="https://example.org/s.json"):
        inline_refs({"properties": {"x": {"$ref": "https://example.org/s.json"}}}, tool="t")


def endpoint(**kwargs) -> ModelEndpoint:
    return ModelEndpoint(id="gemini", provider="openai", base_url="http://x/v1", model="m", **kwargs)


def test_the_body_carries_inlined_schemas_only_for_an_endpoint_that_asks():
    request = ChatRequest(
        system="S",
        messages=(UserMessage(text="hi"),),
        tools=(ToolDefinition(name="nested", description="", parameters=nested.parameters),),
    )
    plain = json.loads(formats.request_body(request, endpoint()))
    strict = json.loads(formats.request_body(request, endpoint(inline_tool_schemas=True)))
    assert refs_in(plain["tools"]) and not refs_in(strict["tools"])
    assert formats.request_body(request, endpoint(inline_tool_schemas=True)) == formats.request_body(
        request, endpoint(inline_tool_schemas=True)
    )  # the same bytes every time: replay's fingerprints hold


def test_startup_check_names_the_agent_the_endpoint_and_the_tool():
    agents = [Agent(name="trees", system_prompt="S", model="gemini", tools=[mutual])]
    check_agents({"gemini": endpoint()}, agents)  # without the setting: sent as written, fine
    with pytest.raises(RecursiveSchemaError, match=r"agent 'trees', model endpoint 'gemini': tool 'mutual'"):
        check_agents({"gemini": endpoint(inline_tool_schemas=True)}, agents)
