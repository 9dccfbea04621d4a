"""MCP tools without servers: schema normalisation, the offer, the declaration, the recorded tools
in the context (the pure parts; the services with real servers are in tests/e2e/test_mcp.py)."""

from __future__ import annotations

import functools
import json

import pytest

from agentstream import Agent, App, McpServer, tool
from agentstream.context import ContextCache, build_context
from agentstream.declarations.mcp_servers import env_prefix
from agentstream.declarations.prompts import PromptFile
from agentstream.errors import ConfigError
from agentstream.mcp_tools import SchemaRefused, normalise_input_schema
from agentstream.steps.decision import RecordResults, RunTools, decide
from agentstream.steps.offers import Catalog, desired_offer, latest_offer, offer_digest
from agentstream.steps.replay import rebuild_calls
from agentstream.wire.events import ModelOutput, OfferedTool, ToolCall, ToolsOffered, TurnInput
from tests.support import docs

# --- schemas -----------------------------------------------------------------------------------


def test_local_refs_are_inlined_and_defs_dropped():
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "point": {"$ref": "#/$defs/Point", "description": "where"},
            "many": {"type": "array", "items": {"$ref": "#/$defs/Point"}},
        },
        "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}},
    }
    out = normalise_input_schema("t", schema)
    assert out == {
        "type": "object",
        "properties": {
            "point": {
                "type": "object",
                "properties": {"x": {"type": "number"}},
                "required": ["x"],
                "description": "where",
            },
            "many": {
                "type": "array",
                "items": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]},
            },
        },
    }
    assert "$defs" in schema  # the input is not changed


def test_a_schema_that_is_only_a_ref_is_inlined():
    schema = {
        "$ref": "#/definitions/Args",
        "definitions": {"Args": {"type": "object", "properties": {"q": {"type": "string"}}}},
    }
    assert normalise_input_schema("t", schema) == {"type": "object", "properties": {"q": {"type": "string"}}}


@pytest.mark.parametrize(
    ("schema", "keyword", "words"),
    [
        (
            {
                "type": "object",
                "properties": {"n": {"$ref": "#/$defs/Node"}},
                "$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}},
            },
            "$ref",
            "recursive",
        ),
        (
            {"type": "object", "properties": {"n": {"$ref": "https://example.com/node.json"}}},
            "$ref",
            "outside the schema",
        ),
        ({"type": "object", "properties": {"n": {"$ref": "#/$defs/Missing"}}}, "$ref", "does not define"),
        ({"type": "object", "anyOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]}, "anyOf", "at the top"),
        ({"oneOf": [{"type": "object"}, {"type": "null"}]}, "oneOf", "at the top"),
        ({"type": "string"}, "type", "'string'"),
        ({"type": ["string", "null"]}, "type", "['string', 'null']"),
        ({"items": {"type": "string"}}, "type", "does not describe an object"),
        ([1, 2], "inputSchema", "list"),
    ],
)
def test_schemas_the_endpoints_reject_are_refused_naming_tool_and_keyword(schema, keyword, words):
    with pytest.raises(SchemaRefused) as info:
        normalise_input_schema("lookup", schema)
    assert info.value.tool == "lookup" and info.value.keyword == keyword
    assert "'lookup'" in str(info.value) and repr(keyword) in str(info.value) and words in str(info.value)
    assert isinstance(info.value, ConfigError)


def test_a_missing_type_or_a_nullable_object_becomes_an_object():
    assert normalise_input_schema("t", {"properties": {"a": {"type": "string"}}}) == {
        "type": "object",
        "properties": {"a": {"type": "string"}},
    }
    assert normalise_input_schema("t", {}) == {"type": "object", "properties": {}}
    assert normalise_input_schema("t", {"type": ["object", "null"], "properties": {}}) == {
        "type": "object",
        "properties": {},
    }


# --- the declaration ---------------------------------------------------------------------------


def test_a_server_needs_one_transport_and_takes_it_from_the_environment():
    with pytest.raises(ConfigError, match="not both"):
        McpServer(name="x", command=["srv"], url="http://h/mcp")
    with pytest.raises(ConfigError, match="1-64 letters"):
        McpServer(name="bad name")
    bare = McpServer(name="my-search")
    assert bare.queue == "mcp-my-search" and env_prefix("my-search") == "AGENTSTREAM_MCP_MY_SEARCH_"
    with pytest.raises(ConfigError, match="AGENTSTREAM_MCP_MY_SEARCH_COMMAND or AGENTSTREAM_MCP_MY_SEARCH_URL"):
        bare.transport({})
    assert bare.transport({"AGENTSTREAM_MCP_MY_SEARCH_COMMAND": '["python", "-m", "srv", "--x y"]'}).command == (
        "python",
        "-m",
        "srv",
        "--x y",
    )
    assert bare.transport({"AGENTSTREAM_MCP_MY_SEARCH_COMMAND": "npx -y @org/srv"}).command == ("npx", "-y", "@org/srv")
    assert bare.transport({"AGENTSTREAM_MCP_MY_SEARCH_URL": "http://h:1/mcp"}).url == "http://h:1/mcp"
    with pytest.raises(ConfigError, match="JSON array"):
        bare.transport({"AGENTSTREAM_MCP_MY_SEARCH_COMMAND": "[1, 2"})


def test_secrets_come_from_the_environment_and_never_show():
    http = McpServer(name="s", url="https://h/mcp", headers_env={"Authorization": "S_TOKEN"})
    with pytest.raises(ConfigError) as info:
        http.transport({})
    assert "'S_TOKEN'" in str(info.value) and "Authorization" in str(info.value)
    transport = http.transport({"S_TOKEN": "Bearer hunter2"})
    assert transport.headers == {"Authorization": "Bearer hunter2"}
    assert "hunter2" not in repr(transport) and "hunter2" not in transport.describe()
    from_chart = McpServer(name="s").transport(
        {"AGENTSTREAM_MCP_S_URL": "https://h/mcp", "AGENTSTREAM_MCP_S_HEADER_X_API_KEY": "k1"}
    )
    assert from_chart.headers == {"x-api-key": "k1"} and from_chart.url == "https://h/mcp"
    stdio = McpServer(name="f", command="files-server --root /data", env={"MODE": "ro"}, inherit_env=["F_KEY"])
    assert stdio.command == ("files-server", "--root", "/data")
    with pytest.raises(ConfigError, match="'F_KEY'"):
        stdio.transport({})
    env = stdio.transport({"F_KEY": "k-123", "AGENTSTREAM_MCP_F_INHERIT_ENV": "OTHER", "OTHER": "o"}).env
    assert env == {"MODE": "ro", "F_KEY": "k-123", "OTHER": "o"}
    assert "k-123" not in repr(stdio.transport({"F_KEY": "k-123"}))


def test_per_tool_settings():
    server = McpServer(
        name="s",
        command=["x"],
        side_effects=["write"],
        retry_safe=True,
        timeout_s=5,
        tool_timeouts_s={"slow": 50},
        tools=["read", "write", "slow"],
    )
    assert server.has_side_effects("write") and not server.has_side_effects("read")
    assert server.is_retry_safe("read") and server.timeout_for("slow") == 50 and server.timeout_for("read") == 5
    assert server.allows("read") and not server.allows("delete")
    with pytest.raises(ConfigError, match="positive"):
        McpServer(name="s", command=["x"], tool_timeouts_s={"slow": 0})


def test_an_agent_takes_servers_among_its_tools_and_the_app_serves_their_queues():
    @tool
    def ping() -> str:
        "Ping."
        return "pong"

    server = McpServer(name="files", command=["x"])
    agent = Agent(name="a", system_prompt="s", tools=[ping, server])
    assert [t.name for t in agent.tools] == ["ping"] and list(agent.mcp_servers) == [server]
    only = Agent(name="b", system_prompt="s", mcp_servers=[server])
    assert only.tool_choice_for(0) == "auto"  # MCP tools alone are tools
    app = App(agents=[agent, only])
    assert app.tool_queues == ["default", "mcp-files"] and app.mcp_servers == {"files": server}
    with pytest.raises(ConfigError, match="two different MCP servers"):
        App(agents=[agent, Agent(name="c", system_prompt="s", tools=[McpServer(name="files", command=["y"])])])


# --- the offer ---------------------------------------------------------------------------------


def _catalog(server: str, *names: str) -> Catalog:
    tools = tuple(
        OfferedTool(
            name=n,
            description=f"{n} it",
            parameters={"type": "object", "properties": {"q": {"type": "string"}}},
            server=server,
        )
        for n in names
    )
    return Catalog(server=server, tools=tools, digest=offer_digest(tools))


def test_the_offer_applies_allow_lists_prompt_texts_and_keeps_own_tools_first():
    @tool
    def read() -> str:
        "The agent's own read."
        return ""

    prompts = PromptFile.model_validate(
        {"tools": {"find": {"description": "Find it (prompt file).", "arguments": {"q": "What to find.", "nope": "x"}}}}
    ).for_model("default")
    a = McpServer(name="a", command=["x"], tools=["find", "read"], prompts=prompts)
    b = McpServer(name="b", command=["y"])
    agent = Agent(name="ag", system_prompt="s", tools=[read, a, b])
    offer, problems = desired_offer(
        agent, {"a": _catalog("a", "find", "read", "drop"), "b": _catalog("b", "find", "more")}
    )
    assert [(t.server, t.name) for t in offer] == [("a", "find"), ("b", "more")]
    assert offer[0].description == "Find it (prompt file)."
    assert offer[0].parameters["properties"]["q"] == {"type": "string", "description": "What to find."}
    assert "nope" not in offer[0].parameters["properties"]
    assert any("'read'" in p and "already has a tool" in p for p in problems)
    assert any("'find'" in p and "'b'" in p for p in problems)
    missing, _ = desired_offer(agent, {"a": None, "b": _catalog("b", "more")})
    assert [t.name for t in missing] == ["more"]


# --- the recorded tools in the context, the decision and replay -------------------------------


def _offer(agent: str, turn_id: str, step: int, *names: str) -> ToolsOffered:
    tools = tuple(
        OfferedTool(name=n, description=f"The {n} tool.", parameters={"type": "object", "properties": {}}, server="srv")
        for n in names
    )
    return ToolsOffered(turn_id=turn_id, step=step, agent=agent, tools=tools, digest=offer_digest(tools))


def test_the_context_offers_the_tools_the_trace_recorded_last_for_the_agent():
    @tool
    def own() -> str:
        "Own tool."
        return ""

    agent = Agent(name="a", system_prompt="s", tools=[own], mcp_servers=[McpServer(name="srv", command=["x"])])
    events = [
        TurnInput(turn_id="t1", agent="a", text="hi"),
        _offer("a", "t1", 0, "one", "two"),
        _offer("other", "t1", 0, "zzz"),
    ]
    request = build_context(events, agent, turn_id="t1", step=0).request
    assert [t.name for t in request.tools] == ["own", "one", "two"]
    assert request.tools[1].description == "The one tool."
    events += [ModelOutput(turn_id="t1", step=0, content="ok"), _offer("a", "t1", 1, "three")]
    assert [t.name for t in build_context(events, agent, turn_id="t1", step=1).request.tools] == ["own", "three"]
    # the per-worker cache, fed in steps, gives the same request as a fold from the start
    cache = ContextCache()
    entries = [(f"{i + 1}-0", e) for i, e in enumerate(events)]
    cache.build("tr", entries[:3], agent, turn_id="t1", step=0)
    assert (
        cache.build("tr", entries, agent, turn_id="t1", step=1).request
        == build_context(events, agent, turn_id="t1", step=1).request
    )


def test_a_call_of_a_recorded_mcp_tool_runs_and_an_unrecorded_one_is_unknown():
    agent = Agent(name="a", system_prompt="s", mcp_servers=[McpServer(name="srv", command=["x"], queue="q")])
    call = ToolCall(id="c1", name="one", arguments="{}")
    stray = ToolCall(id="c2", name="gone", arguments="{}")
    events = [
        TurnInput(turn_id="t1", agent="a", text="hi"),
        _offer("a", "t1", 0, "one"),
        ModelOutput(turn_id="t1", step=0, tool_calls=(call, stray), stop_reason="tool_calls"),
    ]
    decision = decide(events, {"a": agent}.get)
    assert isinstance(decision, RecordResults)
    (result,) = decision.results
    assert result.call_id == "c2" and result.error == "unknown_tool" and "Available tools: one." in result.text
    events[-1] = ModelOutput(turn_id="t1", step=0, tool_calls=(call,), stop_reason="tool_calls")
    assert isinstance(decide(events, {"a": agent}.get), RunTools)
    assert latest_offer(events, "a").tools[0].name == "one"


def test_replay_rebuilds_each_call_with_the_tools_it_was_offered():
    from agentstream.models import formats
    from agentstream.models.endpoints import ModelEndpoint

    agent = Agent(name="a", system_prompt="s", mcp_servers=[McpServer(name="srv", command=["x"])])
    endpoint = ModelEndpoint(id="default", provider="openai", base_url="http://x", model="m", stream=False)
    events: list = [TurnInput(turn_id="t1", agent="a", text="hi"), _offer("a", "t1", 0, "one")]
    for step, offer in ((0, None), (1, _offer("a", "t1", 1, "two"))):
        if offer is not None:
            events.append(offer)
        body = formats.request_body(build_context(events, agent, turn_id="t1", step=step).request, endpoint)
        events.append(
            ModelOutput(
                turn_id="t1",
                step=step,
                content="" if step == 0 else "done",
                tool_calls=(ToolCall(id="c", name="one", arguments="{}"),) if step == 0 else (),
                stop_reason="tool_calls" if step == 0 else "stop",
                request_sha256=formats.fingerprint(body),
                provider="openai",
                model="m",
                endpoint="default",
            )
        )
        if step == 0:
            from agentstream.wire.events import ToolOutput

            events.append(ToolOutput(turn_id="t1", call_id="c", name="one", text="1"))
    calls = rebuild_calls(events, {"a": agent}.get, endpoints={"default": endpoint})
    assert [c.matches for c in calls] == [True, True]
    assert b'"one"' in calls[0].body and b'"two"' not in calls[0].body and b'"two"' in calls[1].body


def test_the_readme_example_declares_a_working_app():

    readme = docs.page("tutorials/tools-and-mcp.md")
    section = readme.split("## Tools from MCP servers", 1)[1]
    code = section.split("```python", 1)[1].split("```", 1)[0]
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    app = scope["app"]
    assert app.tool_queues == ["mcp-files", "mcp-search"]
    assert app.mcp_servers["search"].transport({"SEARCH_MCP_AUTH": "Bearer x"}).headers == {"Authorization": "Bearer x"}
    assert app.mcp_servers["files"].has_side_effects("write_file")


def schema_bomb(depth: int) -> dict:
    """About 2 KB at depth 17: each definition names the next one twice, so inlining it whole
    would make 2^depth values (issue 33: 987 MB and a stalled worker)."""
    defs = {
        f"d{i}": {
            "type": "object",
            "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}, "b": {"$ref": f"#/$defs/d{i + 1}"}},
        }
        for i in range(depth)
    }
    defs[f"d{depth}"] = {"type": "string"}
    return {"type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}, "$defs": defs}


def test_a_schema_bomb_is_refused_with_a_reason_after_bounded_work():
    from agentstream.declarations.tool_schemas import MAX_INLINED_NODES, SchemaTooLarge, inline_refs

    bomb = schema_bomb(40)  # 2^40 values inlined: no machine finishes that, so this returns only if bounded
    assert len(json.dumps(bomb)) < 5_000
    with pytest.raises(SchemaRefused) as info:
        normalise_input_schema("bomb", bomb)
    assert info.value.keyword == "inputSchema" and "levels deep" in info.value.reason  # depth stops it first
    with pytest.raises(SchemaRefused) as info:
        normalise_input_schema("bomb", schema_bomb(14))  # 2^15 values, 30 levels
    assert info.value.keyword == "inputSchema" and f"more than {MAX_INLINED_NODES:,} values" in info.value.reason
    with pytest.raises(SchemaTooLarge):
        inline_refs(bomb, tool="bomb", max_nodes=1_000)
    small = inline_refs(schema_bomb(3), tool="ok")  # a shallow one still inlines
    assert small["properties"]["x"]["properties"]["a"]["properties"]["b"]["properties"]["a"] == {"type": "string"}


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "object", "properties": {"p": {"type": "string", "enum": ["v"] * 30_000}}}, "30,006 values"),
        ({"type": "object", "properties": {"p": {"description": "x" * 300_000}}}, "bytes of JSON, over the limit"),
        (
            {
                "type": "object",
                "properties": {"p": functools.reduce(lambda inner, _: {"items": inner}, range(5000), {})},
            },
            "levels deep",
        ),
    ],
)
def test_schemas_too_large_as_given_are_refused(schema, words):
    with pytest.raises(SchemaRefused) as info:
        normalise_input_schema("big", schema)
    assert info.value.keyword == "inputSchema" and words in info.value.reason, info.value.reason
