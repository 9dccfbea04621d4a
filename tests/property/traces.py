"""Generated traces for the context library's property tests.

A trace is drawn as a list of turns. Each turn has an input, then rounds: a model output that
calls 0–3 tools (or answers, or replies empty), then the results of those calls in any order,
sometimes twice. A turn ends with an answer, or fails part-way (a crash or a cancel) leaving
calls without results; results that arrive after the end are appended anyway (and must be
ignored). The last turn may still be running; another may be queued behind it. Compactions
appear between turns. The histories are ones the agent loop can produce: the model is called
again only when every call of the round before has a result.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from agentstream import Agent, tool
from agentstream.context import (
    BRACKETS,
    ContextConfig,
    ContextPolicy,
    ModelLimits,
    Share,
    Tokens,
)
from agentstream.wire.events import (
    Compaction,
    Document,
    ModelOutput,
    Passage,
    ToolCall,
    ToolOutput,
    TurnEnded,
    TurnFailed,
    TurnInput,
    Usage,
)


@tool
def search(query: str) -> str:
    """Search."""
    return query


@tool
def fetch(url: str) -> str:
    """Fetch a page."""
    return url


def _agent(name: str, window: int | None, **policy: Any) -> Agent:
    limits = ModelLimits(window=Tokens(window)) if window is not None else None
    config = ContextConfig(policy=ContextPolicy(**policy), citations=BRACKETS)
    return Agent(
        name=name,
        system_prompt=f"You are agent {name}.",
        tools=[search, fetch],
        max_passes=6,
        context=config,
        model_limits=limits,
    )


AGENTS: dict[str, Agent] = {
    "roomy": _agent("roomy", 10_000_000, output_reserve=Tokens(1_000), result_cap=None),
    "tight": _agent("tight", 6_000, output_reserve=Tokens(300), min_gain=None),
    "mid": _agent("mid", 20_000, output_reserve=Tokens(1_000), start_at=Share(0.5), target=Share(0.3)),
}
"""Agents by name: a window nothing reaches, a tight one, and one in between."""

TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
SIZES = st.sampled_from([0, 10, 200, 2_000, 6_000])


@st.composite
def result_payload(draw: st.DrawFn, call_id: str, index: int) -> dict[str, Any]:
    size = draw(SIZES)
    payload: dict[str, Any] = {"text": draw(TEXT) + "x" * size}
    if draw(st.booleans()):
        doc = f"doc-{draw(st.integers(0, 6))}"
        payload["elements"] = (
            Document(id=doc, title=draw(TEXT)),
            Passage(id=f"{doc}-p{index}", ref=doc, text="y" * draw(SIZES)),
        )
    if draw(st.integers(0, 9)) == 0:
        payload["error"] = "tool_error"
    return payload


TOOL_STATES = [
    (None, ()),
    ({"search": "auto", "fetch": "auto"}, ()),
    ({"search": "off", "fetch": "auto"}, ()),
    ({"search": "auto", "fetch": "required"}, ("Use the fetch tool for this message.",)),
]


@st.composite
def traces(draw: st.DrawFn, agent: str | None = None) -> list[Any]:
    """Events of a generated trace (oldest first); every turn is answered by ``agent`` (drawn if None)."""
    name = agent or draw(st.sampled_from(sorted(AGENTS)))
    events: list[Any] = []
    calls = 0
    turn_count = draw(st.integers(1, 7))
    finished: list[str] = []
    for number in range(turn_count):
        turn_id = f"t{number}"
        running = number == turn_count - 1 and draw(st.booleans())
        # the tool states a turn recorded when it entered (issue 13): none, all auto, one off, one required
        states, instructions = draw(st.sampled_from(TOOL_STATES))
        events.append(
            TurnInput(
                turn_id=turn_id,
                agent=name,
                text=draw(TEXT) + "q" * draw(st.sampled_from([0, 50, 3000])),
                tools=states,
                instructions=instructions,
            )
        )
        if running and draw(st.booleans()):
            events.append(TurnInput(turn_id=f"q{number}", agent=name, text="queued"))
        late: list[ToolOutput] = []
        for step in range(draw(st.integers(0, 4))):
            kind = draw(st.sampled_from(["tools", "tools", "answer", "empty"]))
            usage = Usage(prompt_tokens=draw(st.one_of(st.none(), st.integers(10, 5_000))))
            if kind != "tools":
                content = "" if kind == "empty" else draw(TEXT) + draw(st.sampled_from(["", " [1]", " [2, 3]"]))
                events.append(
                    ModelOutput(
                        turn_id=turn_id,
                        step=step,
                        content=content,
                        usage=usage,
                        reasoning=draw(st.one_of(st.none(), TEXT)),
                    )
                )
                if kind == "answer":
                    break
                continue
            count = draw(st.integers(1, 3))
            ids = [f"call_{calls + i}" for i in range(count)]
            calls += count
            names = [draw(st.sampled_from(["search", "fetch"])) for _ in ids]
            events.append(
                ModelOutput(
                    turn_id=turn_id,
                    step=step,
                    usage=usage,
                    stop_reason="tool_calls",
                    tool_calls=tuple(
                        ToolCall(id=i, name=n, arguments='{"query": "' + "a" * draw(SIZES) + '"}')
                        for i, n in zip(ids, names, strict=True)
                    ),
                )
            )
            order = draw(st.permutations(list(range(count))))
            crash = draw(st.integers(0, 5)) == 0
            answered = order[: draw(st.integers(0, count - 1))] if crash else order
            for position in answered:
                events.append(
                    ToolOutput(
                        turn_id=turn_id,
                        call_id=ids[position],
                        name=names[position],
                        **draw(result_payload(ids[position], position)),
                    )
                )
                if draw(st.integers(0, 6)) == 0:  # a duplicate result: the first one wins
                    events.append(
                        ToolOutput(turn_id=turn_id, call_id=ids[position], name=names[position], text="DUPLICATE")
                    )
            if crash:
                late = [
                    ToolOutput(turn_id=turn_id, call_id=ids[p], name=names[p], text="LATE")
                    for p in order
                    if p not in answered
                ]
                running = False
                break
        if running:
            break
        events.append(
            draw(
                st.sampled_from(
                    [
                        TurnEnded(turn_id=turn_id, answer="a"),
                        TurnFailed(turn_id=turn_id, code="cancelled", reason="r"),
                        TurnEnded(
                            turn_id=turn_id, answer="a tool's result", answer_call="call_0"
                        ),  # result_as_answer: shown as the assistant's
                    ]
                )
            )
        )
        events.extend(late)
        finished.append(turn_id)
        if finished and draw(st.integers(0, 4)) == 0:
            kept = draw(st.sampled_from(finished))
            events.append(Compaction(turn_id=turn_id, summary=draw(TEXT) or "summary", kept_from_turn=kept))
    return events
