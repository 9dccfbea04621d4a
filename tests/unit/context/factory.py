"""Small builders of traces and agents for the context library's tests."""

from __future__ import annotations

from typing import Any

from agentstream import Agent, tool
from agentstream.context import ContextConfig, ContextPolicy, ModelLimits, Tokens
from agentstream.wire.events import (
    ModelOutput,
    ToolCall,
    ToolOutput,
    TurnEnded,
    TurnFailed,
    TurnInput,
    Usage,
)


@tool
def search(query: str) -> str:
    """Search the documents."""
    return query


@tool
def calc(expression: str) -> str:
    """Evaluate arithmetic."""
    return expression


def make_agent(
    *,
    window: int | None = None,
    policy: ContextPolicy | None = None,
    config: ContextConfig | None = None,
    tools: tuple = (search, calc),
    **kwargs: Any,
) -> Agent:
    """An agent named ``a`` with the given window (tokens) and policy."""
    if config is None and policy is not None:
        config = ContextConfig(policy=policy)
    limits = ModelLimits(window=Tokens(window)) if window is not None else None
    return Agent(
        name="a",
        system_prompt="You are a test agent.",
        tools=list(tools),
        context=config,
        model_limits=limits,
        **kwargs,
    )


class Trace:
    """A trace under construction: ``events`` in append order."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self._turns = 0
        self._calls = 0
        self._steps: dict[str, int] = {}

    def user(self, text: str, *, turn_id: str | None = None, **kwargs: Any) -> str:
        self._turns += 1
        turn_id = turn_id or f"t{self._turns}"
        self.events.append(TurnInput(turn_id=turn_id, agent="a", text=text, **kwargs))
        self._steps[turn_id] = 0
        return turn_id

    def calls(
        self, turn_id: str, *calls: tuple[str, str], prompt_tokens: int | None = None, **kwargs: Any
    ) -> list[str]:
        ids = []
        for _ in calls:
            self._calls += 1
            ids.append(f"call_{self._calls}")
        tool_calls = tuple(ToolCall(id=i, name=n, arguments=a) for i, (n, a) in zip(ids, calls, strict=True))
        self.events.append(
            ModelOutput(
                turn_id=turn_id,
                step=self._next_step(turn_id),
                tool_calls=tool_calls,
                stop_reason="tool_calls",
                usage=Usage(prompt_tokens=prompt_tokens),
                **kwargs,
            )
        )
        return ids

    def result(self, turn_id: str, call_id: str, text: str, *, name: str = "search", **kwargs: Any) -> None:
        self.events.append(ToolOutput(turn_id=turn_id, call_id=call_id, name=name, text=text, **kwargs))

    def answer(self, turn_id: str, content: str, *, prompt_tokens: int | None = None, **kwargs: Any) -> None:
        self.events.append(
            ModelOutput(
                turn_id=turn_id,
                step=self._next_step(turn_id),
                content=content,
                usage=Usage(prompt_tokens=prompt_tokens),
                **kwargs,
            )
        )

    def end(self, turn_id: str, answer: str = "done") -> None:
        self.events.append(TurnEnded(turn_id=turn_id, answer=answer))

    def fail(self, turn_id: str) -> None:
        self.events.append(TurnFailed(turn_id=turn_id, code="cancelled", reason="cancelled by user"))

    def tool_turn(
        self, text: str, results: list[str], answer: str = "ok", *, name: str = "search", **result_kwargs: Any
    ) -> str:
        """A whole turn: input, one output calling ``len(results)`` tools, the results, an answer, the end."""
        turn_id = self.user(text)
        ids = self.calls(turn_id, *[(name, '{"query": "q"}') for _ in results])
        for call_id, text_ in zip(ids, results, strict=True):
            self.result(turn_id, call_id, text_, name=name, **result_kwargs)
        self.answer(turn_id, answer)
        self.end(turn_id)
        return turn_id

    def next_step(self, turn_id: str) -> int:
        return self._steps.get(turn_id, 0)

    def _next_step(self, turn_id: str) -> int:
        step = self._steps.get(turn_id, 0)
        self._steps[turn_id] = step + 1
        return step
