"""Typed turn inputs, tool declarations, repeats and per-turn settings: the pure parts (issue 13,
sections 1-3): parsing, the startup checks, the resolution of a turn's tool states, what the
context library builds from the recorded turn, and that the fold builds the same request as a
whole-trace build."""

from __future__ import annotations

import json

import pytest

from agentstream import AgentSettings, ChatTurnInput, Text, ToolDeclaration, TurnDenied
from agentstream.context import build_context
from agentstream.declarations.agents import Agent
from agentstream.declarations.apps import App
from agentstream.declarations.inputs import as_recorded, parse_payload, tool_states
from agentstream.declarations.tools import tool
from agentstream.errors import ConfigError, TurnRejected
from agentstream.steps.decision import CallModel, FailTurn, RecordResults, RunTools, decide
from agentstream.steps.trace_fold import fold_events
from agentstream.wire.events import ModelOutput, ToolCall, ToolOutput, TurnInput, TurnMessage


@tool
def search(q: str) -> str:
    """Search."""
    return q


@tool
def calc(expression: str) -> str:
    """Calculate."""
    return expression


@tool
def mail(to: str) -> str:
    """Send mail."""
    return to


DECLARED = [
    ToolDeclaration(name="mail", default="off"),
    ToolDeclaration(name="calc", locked=True),
    ToolDeclaration(name="search", required_tool_instruction="Search first, with {tool}; cite {{n}}."),
    ToolDeclaration(name="later"),  # declared, not supplied
]
CHAT = Agent(
    name="chat", system_prompt="S", input=ChatTurnInput, tools=[search, calc, mail], declared=DECLARED
)  # repeats off: the default
APP = App(agents=[CHAT])


def no_show(elements):
    return ""


# --- parsing --------------------------------------------------------------------------------------


def test_a_payload_parses_strictly_and_a_string_is_the_text():
    assert parse_payload(Text, "Hi") == Text(text="Hi")
    chat = parse_payload(ChatTurnInput, {"text": "Hi", "tools": {"search": "required"}, "context": "c"})
    assert chat.tools == {"search": "required"} and chat.context == "c"
    assert parse_payload(ChatTurnInput, "Hi") == ChatTurnInput(text="Hi")
    with pytest.raises(
        ValueError, match=r"unknown field `\$\.input\.tols`; the fields of ChatTurnInput are: text, tools, context"
    ):
        parse_payload(ChatTurnInput, {"text": "Hi", "tols": {}})
    with pytest.raises(ValueError, match=r"`\$\.input\.tools\.search`"):
        parse_payload(ChatTurnInput, {"text": "Hi", "tools": {"search": "sometimes"}})
    with pytest.raises(ValueError, match=r"`\$\.input\.text`"):
        parse_payload(ChatTurnInput, {"tools": {}})
    assert Text(text="x").tools == {} and Text(text="x").context is None


def test_the_turn_message_takes_text_or_input_not_both_nor_neither():
    from agentstream.wire import codec

    assert codec.decode_turn(b'{"trace_id":"c","turn_id":"t","agent":"a","input":{"text":"Hi"}}').payload == {
        "text": "Hi"
    }
    assert codec.decode_turn(b'{"trace_id":"c","turn_id":"t","agent":"a","text":"Hi"}').payload == "Hi"
    for body, says in (
        (b'{"trace_id":"c","turn_id":"t","agent":"a"}', r"has neither `\$\.text` nor `\$\.input`: "),
        (
            b'{"trace_id":"c","turn_id":"t","agent":"a","text":"x","input":"y"}',
            r"has both `\$\.text` and `\$\.input`: ",
        ),
    ):
        with pytest.raises(TurnRejected, match=says):
            codec.decode_turn(body)


def test_an_input_that_no_longer_parses_is_shown_as_recorded():
    text_turn = TurnInput(turn_id="t", agent="a", text="Hello")
    object_turn = TurnInput(turn_id="t", agent="a", text="", input={"b": 1, "a": [2]})
    assert as_recorded(text_turn, no_show) == "Hello"
    assert as_recorded(object_turn, no_show) == '{"a": [2], "b": 1}'


# --- startup checks -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ToolDeclaration(name="x", required_tool_instruction="Use {tool} for {topic}."), r"uses \{topic\}"),
        (lambda: ToolDeclaration(name="x", required_tool_instruction="Use {tool"), "not a valid format string"),
        (lambda: ToolDeclaration(name="x", default="maybe"), "not one of off, auto, required"),
        (
            lambda: Agent(name="a", system_prompt="S", tools=[search], declared=[ToolDeclaration(name="search")] * 2),
            "declared twice",
        ),
        (
            lambda: Agent(
                name="a",
                system_prompt="S",
                tools=[search],
                declared=[ToolDeclaration(name="search"), ToolDeclaration(name="reopen")],
            ),
            "the reopen tool",
        ),
        (
            lambda: Agent(name="a", system_prompt="S", tools=[search, calc], declared=[ToolDeclaration(name="search")]),
            r"does not declare: \['calc'\]",
        ),
        (lambda: Agent(name="a", system_prompt="S", input=dict), "pydantic model class"),
        (lambda: AgentSettings(name="b"), "not per-turn settings"),
    ],
)
def test_declarations_and_settings_that_cannot_work_fail_at_startup(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_an_input_type_without_text_needs_a_render_hook():
    import pydantic

    class Order(pydantic.BaseModel):
        sku: str

    with pytest.raises(ConfigError, match="no `text` field"):
        Agent(name="a", system_prompt="S", input=Order)
    Agent(name="a", system_prompt="S", input=Order, render_input=lambda parsed, show, turn: f"order {parsed.sku}")


# --- tool states ------------------------------------------------------------------------------------


def test_tool_states_of_a_turn():
    supplied = ["search", "calc", "mail"]
    assert tool_states(DECLARED, supplied, {}) == {"mail": "off", "calc": "auto", "search": "auto", "later": "auto"}
    assert tool_states(DECLARED, supplied, {"mail": "auto", "calc": "auto"})["mail"] == "auto"  # locked, asked as it is
    for asked, why in [
        ({"calc": "off"}, "locks it at 'auto'"),
        ({"nope": "off"}, "does not declare"),
        ({"later": "required"}, "does not supply"),
    ]:
        with pytest.raises(TurnDenied, match=why) as info:
            tool_states(DECLARED, supplied, asked)
        assert info.value.code == "bad_turn"


def test_the_recorded_turn_keeps_the_payload_states_and_instructions():
    payload = {"text": "Find it", "tools": {"search": "required", "mail": "auto"}}
    message = TurnMessage(trace_id="c", turn_id="t1", agent="chat", input=payload)
    turn = APP.turn_input(message)
    assert turn.input == payload and turn.text == "Find it"
    assert turn.tools == {"mail": "auto", "calc": "auto", "search": "required", "later": "auto"}
    assert turn.instructions == ("Search first, with search; cite {n}.",)
    assert [t.name for t in CHAT.offered_tools(turn)] == ["mail", "calc", "search"]  # declaration order
    with pytest.raises(TurnRejected, match="locks it") as info:
        APP.turn_input(
            TurnMessage(trace_id="c", turn_id="t2", agent="chat", input={"text": "x", "tools": {"calc": "off"}})
        )
    assert (info.value.code, info.value.trace_id, info.value.turn_id) == ("bad_turn", "c", "t2")


# --- what the context library builds from the recorded turn ----------------------------------------------


def test_the_context_offers_the_turns_tools_with_the_required_instruction():
    turn = APP.turn_input(
        TurnMessage(
            trace_id="c", turn_id="t1", agent="chat", input={"text": "Find it", "tools": {"search": "required"}}
        )
    )
    request = build_context([turn], CHAT, turn_id="t1", step=0).request
    assert [t.name for t in request.tools] == ["calc", "search"]  # mail is off; declaration order
    assert request.messages[0].text == "Find it\n\nSearch first, with search; cite {n}."
    later = APP.turn_input(
        TurnMessage(
            trace_id="c",
            turn_id="t2",
            agent="chat",
            input={"text": "Mail it", "tools": {"search": "off", "calc": "auto"}},
        )
    )
    events = [turn, ModelOutput(turn_id="t1", step=0, content="Found."), later]
    request = build_context(events, CHAT, turn_id="t2", step=0).request
    assert [t.name for t in request.tools] == ["calc"]
    assert [m.text for m in request.messages if hasattr(m, "images")][:1] == [
        "Find it\n\nSearch first, with search; cite {n}."
    ]


def test_an_input_the_agents_type_changed_under_is_shown_as_recorded_and_a_hook_may_hide_one():
    old = TurnInput(turn_id="t1", agent="a", text="", input={"question": "Where?", "lang": "en"})
    new = TurnInput(turn_id="t2", agent="a", text="", input={"text": "Now?", "tools": {}})
    agent = Agent(name="a", system_prompt="S", input=ChatTurnInput)
    messages = build_context(
        [old, ModelOutput(turn_id="t1", step=0, content="Here."), new], agent, turn_id="t2", step=0
    ).request.messages
    assert messages[0].text == json.dumps({"question": "Where?", "lang": "en"}, sort_keys=True)
    assert messages[-1].text == "Now?"
    hiding = Agent(
        name="a",
        system_prompt="S",
        input=ChatTurnInput,
        render_input=lambda p, show, t: None if p.text == "Now?" else p.text.upper(),
    )
    ok = TurnInput(turn_id="t0", agent="a", text="hi")
    messages = build_context(
        [ok, ModelOutput(turn_id="t0", step=0, content="Hello."), new], hiding, turn_id="t2", step=0
    ).request.messages
    assert [getattr(m, "text", None) or m.content for m in messages] == ["HI", "Hello."]


def test_the_fold_builds_what_a_whole_trace_build_builds():
    t1 = APP.turn_input(
        TurnMessage(trace_id="c", turn_id="t1", agent="chat", input={"text": "Find", "tools": {"search": "required"}})
    )
    t2 = APP.turn_input(
        TurnMessage(trace_id="c", turn_id="t2", agent="chat", input={"text": "Again", "tools": {"mail": "auto"}})
    )
    events = [
        t1,
        ModelOutput(turn_id="t1", step=0, tool_calls=(ToolCall(id="c1", name="search", arguments='{"q":"x"}'),)),
        ToolOutput(turn_id="t1", call_id="c1", name="search", text="x"),
        ModelOutput(turn_id="t1", step=1, content="Found x."),
        t2,
    ]
    fold = fold_events("c", [(f"{i + 1}-0", e) for i, e in enumerate(events[:3])])
    fold.build(CHAT, turn_id="t1", step=1)  # folded part of the way, then fed the rest
    fold.feed([(f"{i + 1}-0", e) for i, e in enumerate(events)])
    assert fold.build(CHAT, turn_id="t2", step=0).request == build_context(events, CHAT, turn_id="t2", step=0).request


# --- decisions: offered tools, repeats, per-turn settings ------------------------------------------------


def test_a_call_of_a_tool_the_turn_turned_off_does_not_run():
    turn = APP.turn_input(TurnMessage(trace_id="c", turn_id="t1", agent="chat", text="Hi"))
    out = ModelOutput(turn_id="t1", step=0, tool_calls=(ToolCall(id="c1", name="mail", arguments='{"to":"x"}'),))
    decision = decide([turn, out], APP.agent)
    assert isinstance(decision, RecordResults) and decision.results[0].error == "unknown_tool"
    assert "Available tools: calc, search." in decision.results[0].text


def test_an_identical_call_gets_the_earlier_result_when_repeats_are_off():
    turn = APP.turn_input(TurnMessage(trace_id="c", turn_id="t1", agent="chat", text="Hi"))
    first = ModelOutput(turn_id="t1", step=0, tool_calls=(ToolCall(id="c1", name="search", arguments='{"q": "x"}'),))
    result = ToolOutput(turn_id="t1", call_id="c1", name="search", text="found x", data={"n": 1})
    again = ModelOutput(
        turn_id="t1",
        step=1,
        tool_calls=(
            ToolCall(id="c2", name="search", arguments='{"q":"x"}'),
            ToolCall(id="c3", name="search", arguments='{"q":"y"}'),
        ),
    )
    decision = decide([turn, first, result, again], APP.agent)
    assert isinstance(decision, RecordResults)
    (repeat,) = decision.results
    assert (repeat.call_id, repeat.text, repeat.data, repeat.repeat_of) == ("c2", "found x", {"n": 1}, "c1")
    nxt = decide([turn, first, result, again, repeat], APP.agent)
    assert isinstance(nxt, RunTools) and [c.id for c in nxt.calls] == ["c3"]  # other arguments run
    failed = ToolOutput(turn_id="t1", call_id="c1", name="search", text="Error", error="tool_error")
    assert isinstance(decide([turn, first, failed, again], APP.agent), RunTools)  # only a successful call is repeated


def test_repeats_are_off_by_default_and_an_agent_or_a_tool_turns_them_on():
    assert Agent(name="a", system_prompt="S").repeats is False  # the seed's default
    turn = TurnInput(turn_id="t1", agent="a", text="Hi")
    first = ModelOutput(turn_id="t1", step=0, tool_calls=(ToolCall(id="c1", name="search", arguments='{"q": "x"}'),))
    result = ToolOutput(turn_id="t1", call_id="c1", name="search", text="found x")
    again = ModelOutput(turn_id="t1", step=1, tool_calls=(ToolCall(id="c2", name="search", arguments='{"q": "x"}'),))
    events = [turn, first, result, again]
    default = App(agents=[Agent(name="a", system_prompt="S", tools=[search])]).agent
    assert isinstance(decision := decide(events, default), RecordResults) and decision.results[0].repeat_of == "c1"
    agent_on = App(agents=[Agent(name="a", system_prompt="S", tools=[search], repeats=True)]).agent
    assert isinstance(decision := decide(events, agent_on), RunTools) and [c.id for c in decision.calls] == ["c2"]
    fresh = tool(search.fn, name="search", repeats=True)  # the tool's own setting wins over the agent's
    tool_on = App(agents=[Agent(name="a", system_prompt="S", tools=[fresh])]).agent
    assert isinstance(decide(events, tool_on), RunTools)
    tool_off = App(
        agents=[Agent(name="a", system_prompt="S", tools=[tool(search.fn, name="search", repeats=False)], repeats=True)]
    ).agent
    assert isinstance(decide(events, tool_off), RecordResults)


def test_per_turn_settings_and_their_refusal():
    def settings(resources, parsed, model):
        if parsed.text == "no":
            raise TurnDenied(f"refused by {resources}", code="forbidden")
        return AgentSettings(system_prompt=f"S for {model}", max_passes=2)

    agent = Agent(name="a", system_prompt="S", settings=settings)
    app = App(agents=[agent], resources="the rules")
    yes = TurnInput(turn_id="t1", agent="a", text="yes")
    decision = decide([yes], app.agent)
    assert (
        isinstance(decision, CallModel)
        and decision.agent.system_prompt == "S for default"
        and decision.agent.max_passes == 2
    )
    assert decide([yes], app.agent).agent is decision.agent  # the same agent for the same turn: caches keep working
    no = TurnInput(turn_id="t2", agent="a", text="no")
    assert decide([no], app.agent) == FailTurn(no, "forbidden", "refused by the rules")
    with pytest.raises(TurnRejected) as info:
        app.turn_input(TurnMessage(trace_id="c", turn_id="t2", agent="a", text="no"))
    assert info.value.code == "forbidden"
    bad = Agent(name="b", system_prompt="S", settings=lambda r, p, m: AgentSettings(max_passes=0))
    assert decide([TurnInput(turn_id="t", agent="b", text="x")], App(agents=[bad]).agent).code == "config"


def test_a_render_hook_may_give_its_own_user_message():
    from agentstream.context import UserMessage

    agent = Agent(name="a", system_prompt="S", render_input=lambda p, show, t: UserMessage(text=f"<<{p.text}>>"))
    request = build_context([TurnInput(turn_id="t", agent="a", text="hi")], agent, turn_id="t", step=0).request
    assert request.messages[0] == UserMessage(text="<<hi>>")


def test_per_turn_settings_may_only_give_the_apps_tools():
    stray = tool(lambda q: q, name="stray")
    agent = Agent(name="a", system_prompt="S", tools=[search], settings=lambda r, p, m: AgentSettings(tools=[stray]))
    app = App(agents=[agent])
    with pytest.raises(TurnRejected, match=r"tools \['stray'\] are not the app's") as info:
        app.turn_input(TurnMessage(trace_id="c", turn_id="t", agent="a", text="x"))
    assert info.value.code == "config"
    fine = Agent(name="b", system_prompt="S", tools=[search], settings=lambda r, p, m: AgentSettings(tools=[calc]))
    assert App(agents=[fine], extra_tools=[calc]).turn_input(
        TurnMessage(trace_id="c", turn_id="t", agent="b", text="x")
    ).tools == {"calc": "auto"}


def test_identical_calls_of_one_model_call_all_run():
    turn = APP.turn_input(TurnMessage(trace_id="c", turn_id="t1", agent="chat", text="Hi"))
    both = ModelOutput(
        turn_id="t1",
        step=0,
        tool_calls=(
            ToolCall(id="c1", name="search", arguments='{"q":"x"}'),
            ToolCall(id="c2", name="search", arguments='{"q":"x"}'),
        ),
    )
    first = ToolOutput(turn_id="t1", call_id="c1", name="search", text="found x")
    decision = decide([turn, both, first], APP.agent)  # c1's result is in, c2's job is out: c2 still runs
    assert isinstance(decision, RunTools) and [c.id for c in decision.calls] == ["c2"]


# --- tools of MCP servers, declared like the agent's own ----------------------------------------------


def _mcp_app():
    from agentstream import McpServer

    server = McpServer(name="srv", command=["srv"])
    agent = Agent(
        name="m",
        system_prompt="S",
        input=ChatTurnInput,
        tools=[search, server],
        declared=[
            ToolDeclaration(name="search"),
            ToolDeclaration(name="add", default="off"),  # a tool of the server
            ToolDeclaration(name="fail", locked=True),
        ],
    )
    return App(agents=[agent])


def _offer(*names):
    from agentstream.wire.events import OfferedTool, ToolsOffered

    tools = tuple(
        OfferedTool(name=n, description=n, parameters={"type": "object", "properties": {}}, server="srv") for n in names
    )
    return ToolsOffered(turn_id="t1", step=0, agent="m", tools=tools, digest="d")


def test_an_mcp_servers_tools_follow_their_declarations_and_the_turns_states():
    app = _mcp_app()
    default = app.turn_input(TurnMessage(trace_id="c", turn_id="t1", agent="m", input={"text": "Hi"}))
    offer = _offer("add", "fail", "undeclared")
    request = build_context([default, offer], app.agent("m"), turn_id="t1", step=0).request
    assert [t.name for t in request.tools] == ["search", "fail", "undeclared"]  # add: declared off; undeclared: auto
    asked = app.turn_input(
        TurnMessage(trace_id="c", turn_id="t1", agent="m", input={"text": "Hi", "tools": {"add": "required"}})
    )
    assert asked.tools["add"] == "required" and asked.instructions == ("Use the add tool for this message.",)
    request = build_context([asked, offer], app.agent("m"), turn_id="t1", step=0).request
    assert [t.name for t in request.tools] == ["search", "add", "fail", "undeclared"]
    with pytest.raises(TurnRejected, match="locks it at 'auto'"):  # a locked MCP tool stays as declared
        app.turn_input(
            TurnMessage(trace_id="c", turn_id="t1", agent="m", input={"text": "Hi", "tools": {"fail": "off"}})
        )
    # a call of the MCP tool the turn turned off is not run
    call = ModelOutput(turn_id="t1", step=0, tool_calls=(ToolCall(id="c1", name="add", arguments="{}"),))
    decision = decide([default, offer, call], app.agent)
    assert isinstance(decision, RecordResults) and decision.results[0].error == "unknown_tool"
    assert "Available tools: search, fail, undeclared." in decision.results[0].text
    assert isinstance(decide([asked, offer, call], app.agent), RunTools)
    # required, but the server does not list it: refused before the model is called
    failed = decide([asked, _offer("fail")], app.agent)
    assert (
        isinstance(failed, FailTurn)
        and failed.code == "bad_turn"
        and "requires tool 'add', which no MCP server" in failed.reason
    )
