"""Apps for the agent-behaviour tests (issue 13): ``tests.support.agent_apps:app``."""

from __future__ import annotations

from agentstream import Agent, App, tool


@tool(timeout_s=5)
def lookup(q: str) -> str:
    """Look a word up."""
    return f"found {q}"


app = App(
    agents=[
        Agent(name="looper", system_prompt="You look things up.", tools=[lookup], max_passes=2),
        Agent(name="chooser", system_prompt="You look things up.", tools=[lookup], models=["big"]),
        # no default model: each turn must name one of its models
        Agent(name="picky", system_prompt="You look things up.", tools=[lookup], model=None, models=["big", "small"]),
    ]
)


# --- typed inputs, tool declarations and per-turn settings (issue 13, sections 1-3) ---------------

from agentstream import AgentSettings, ChatTurnInput, ToolDeclaration, TurnDenied  # noqa: E402


@tool(timeout_s=5)
def note(text: str) -> str:
    """Write a note down."""
    return f"noted {text}"


@tool(timeout_s=5)
def clock() -> str:
    """The time now."""
    return "noon"


@tool(timeout_s=5, repeats=True)
def fresh(q: str) -> str:
    """Look a word up afresh each time."""
    return f"fresh {q}"


def per_turn(resources, turn, model):
    """Refuse a turn that asks for what the resources forbid; each model its own prompt."""
    if "forbidden" in turn.text:
        raise TurnDenied(f"{resources['refusal']} (asked: {turn.text!r})", code="forbidden")
    if model == "big":
        return AgentSettings(system_prompt="You are the big model's agent.", max_passes=1)
    return AgentSettings()


class Ticket(ChatTurnInput):
    """A chat turn with a ticket number, rendered by the app's own hook."""

    ticket: int


def render_ticket(parsed, show, turn_input):
    if parsed.text == "hidden":
        return None
    return f"Ticket #{parsed.ticket}: {parsed.text}"


typed_app = App(
    agents=[
        Agent(
            name="chat",
            system_prompt="You help.",
            input=ChatTurnInput,
            tools=[lookup, note, clock, fresh],  # repeats: the default, off
            declared=[
                ToolDeclaration(name="note", default="off"),
                ToolDeclaration(name="lookup"),
                ToolDeclaration(name="clock", locked=True),
                ToolDeclaration(name="fresh"),
                ToolDeclaration(name="absent", required_tool_instruction="Please call {tool} now."),
            ],
        ),
        Agent(
            name="gated",
            system_prompt="You are the small model's agent.",
            tools=[lookup],
            models=["big"],
            settings=per_turn,
        ),
        Agent(
            name="tickets",
            system_prompt="You answer tickets.",
            input=Ticket,
            render_input=render_ticket,
            tools=[lookup],
        ),
        Agent(name="plain", system_prompt="You answer.", tools=[lookup]),
    ],
    resources={"refusal": "that topic is not served here"},
)

# the same app after its chat agent changed its input type (for the "shown as recorded" test)
changed_app = App(
    agents=[Agent(name="chat", system_prompt="You help.", input=Ticket, render_input=render_ticket, tools=[lookup])]
)
