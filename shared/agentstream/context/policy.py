"""The context policy: how a model call's context is kept within what the model accepts.

At every model call the builder estimates the size of the context (prompt plus output reserve).
Over ``start_at``, it applies the policy's shrinks in order until the size is under ``target``;
a shrink with its own ``when`` runs above that size instead, and stops once the context is no
longer over it. A pass that frees less than ``min_gain`` is not made (so the prompt cache is not
broken for a few tokens) unless the context would not fit without it. The shrinks are replayed
from the first model call of the trace at every call: nothing is stored, and a call's decisions
read only the events before it, so a result keeps the form it was given.

Shrinks select results by age, in three units (see :data:`turns`, :data:`rounds`,
:data:`results`): a turn starts at an input, a round at a model output that calls tools, and a
result is one tool result. Results are named by handles ``r1``, ``r2``, … in recorded order.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from agentstream.context.forms.shorten import (
    COMPRESSED,
    FULL,
    STUBBED,
    Form,
    Shorten,
    as_recorded,
    drop_text,
)
from agentstream.context.limits import ModelLimits, Share, Threshold, Tokens
from agentstream.context.request import ToolDefinition
from agentstream.declarations.inputs import DEFAULT_REOPEN_NAME
from agentstream.wire.events import Element

Unit = Literal["turns", "rounds", "results"]


@dataclass(frozen=True)
class ContextView:
    """What shrinks and floors read: the trace before the model call being judged.

    It holds the turns the call shows (after a compaction, the kept turns only), so the
    selections count those; a shrink's offers must follow from these fields alone (the builder
    does not ask again while they stay the same and the last offers freed nothing).

    Attributes:
        turns: the handles of each shown turn's results, oldest turn first, the current turn last.
        rounds: the handles of each shown round's results, oldest first.
        results: the handle of each shown result, in recorded order.
        tools: the tool name of each result, by handle (read-only).
        cited: the ids of the elements that model outputs before the call cited (read-only).
    """

    turns: Sequence[Sequence[str]]
    rounds: Sequence[Sequence[str]]
    results: Sequence[str]
    tools: Mapping[str, str]
    cited: Set[str]


@dataclass(frozen=True)
class Selection:
    """Some results of a trace, selected by an index or a slice of its turns, rounds or results.

    Make one by indexing :data:`turns`, :data:`rounds` or :data:`results`: ``turns[:-2]``
    selects the results of every turn but the last two. An index out of range selects nothing.
    """

    unit: Unit
    key: int | slice

    def picked(self, count: int) -> list[int]:
        """The indexes (from 0) of the units selected among ``count``, in slice order."""
        if isinstance(self.key, slice):
            return list(range(count)[self.key])
        index = self.key + count if self.key < 0 else self.key
        return [index] if 0 <= index < count else []

    def handles(self, view: ContextView) -> list[str]:
        """The handles of the selected results in ``view``, oldest first."""
        if self.unit == "results":
            picked = sorted(self.picked(len(view.results)))
            return [view.results[i] for i in picked]
        groups = view.turns if self.unit == "turns" else view.rounds
        out: list[str] = []
        for index in sorted(self.picked(len(groups))):
            out.extend(groups[index])
        return out

    def __repr__(self) -> str:
        if isinstance(self.key, slice):
            start = "" if self.key.start is None else self.key.start
            stop = "" if self.key.stop is None else self.key.stop
            step = "" if self.key.step is None else f":{self.key.step}"
            return f"{self.unit}[{start}:{stop}{step}]"
        return f"{self.unit}[{self.key}]"


class _Units:
    def __init__(self, unit: Unit) -> None:
        self._unit = unit

    def __getitem__(self, key: int | slice) -> Selection:
        return Selection(self._unit, key)

    def __repr__(self) -> str:
        return self._unit


turns = _Units("turns")
"""The turns of a trace, the current one last: ``turns[:-2]`` is every turn but the last two."""
rounds = _Units("rounds")
"""The rounds of a trace (model outputs that call tools), the current one last."""
results = _Units("results")
"""The results of a trace in recorded order: ``results[:-3]`` is every result but the newest three."""


@runtime_checkable
class Shrink(Protocol):
    """Offers results to lower, each with the form it goes to, in the order to try them.

    The builder applies offers one at a time and stops when the context is small enough, so a
    shrink never decides when to stop. An offer that raises :class:`ShortenError`, frees nothing,
    or would not lower the form is skipped. An optional ``when`` attribute (a threshold or None)
    makes the shrink run while the context is over it, instead of from ``start_at`` to ``target``.
    """

    def __call__(self, view: ContextView, forms: Mapping[str, Form]) -> Iterable[tuple[str, Form]]: ...


@dataclass(frozen=True)
class Compress:
    """Compresses the full results that ``where`` selects, oldest first.

    Attributes:
        where: the results to compress.
        when: the size above which it runs, or None to follow the policy's start_at and target.
    """

    where: Selection
    when: Threshold | None = None

    def __call__(self, view: ContextView, forms: Mapping[str, Form]) -> list[tuple[str, Form]]:
        return [(h, COMPRESSED) for h in self.where.handles(view) if forms.get(h, FULL) == FULL]


@dataclass(frozen=True)
class Stub:
    """Replaces the results that ``where`` selects by one line (their calls stay), oldest first.

    Attributes:
        where: the results to stub.
        when: the size above which it runs, or None to follow the policy's start_at and target.
    """

    where: Selection
    when: Threshold | None = None

    def __call__(self, view: ContextView, forms: Mapping[str, Form]) -> list[tuple[str, Form]]:
        return [(h, STUBBED) for h in self.where.handles(view) if forms.get(h, FULL) > STUBBED]


class Protects(Protocol):
    """Says whether a floor applies to an element: ``(element, tool name or None, view) -> bool``.

    It reads only the view before the model call at which the element's result shrank, so what
    happens later never changes a message the model was already sent.
    """

    def __call__(self, element: Element, tool: str | None, before: ContextView) -> bool: ...


def cited(element: Element, tool: str | None, before: ContextView) -> bool:
    """True when a model output before the call cited the element (the default floor's predicate)."""
    return element.id in before.cited


@dataclass(frozen=True)
class Floor:
    """The lowest form that some elements reach, whatever the form of their result.

    An element's form is its result's form lifted to the highest floor that applies to it.
    A floor only shows more of a result; it never changes the result's form.
    """

    applies: Protects
    form: Form


@dataclass(frozen=True)
class Forms:
    """How the results of one tool look in each form (give it in :attr:`ContextPolicy.tools`).

    Attributes:
        full: the full form's function, or None for the policy's.
        compressed: the compressed form's function, or None for the policy's.
        cap: the most tokens of a result of this tool that the model reads; None never cuts;
            ``"policy"`` uses the policy's result_cap.
    """

    full: Shorten | None = None
    compressed: Shorten | None = None
    cap: Tokens | None | Literal["policy"] = "policy"


class Reasoning(enum.StrEnum):
    """Which reasoning of earlier model outputs is sent back to the model."""

    NEVER = "never"
    CURRENT_TURN = "current_turn"
    ALWAYS = "always"


NEVER = Reasoning.NEVER
CURRENT_TURN = Reasoning.CURRENT_TURN
ALWAYS = Reasoning.ALWAYS

REOPEN_DESCRIPTION = (
    "Show again what the context shortened or removed: sources by their number (the id in their "
    "tag, such as 7) and whole tool results by their handle (such as r12). Nothing else changes."
)


@dataclass(frozen=True)
class Reopen:
    """The tool that shows the model again what a shrink or a summary shortened or removed.

    Its result records only which elements (by id) and which results (by call id) to show;
    the builder draws them from where they were first recorded. It is offered from the first
    model call that shortens a result or follows a summary, until the turn's tools are withdrawn.

    Attributes:
        name: the tool name the model calls it by.
        description: what the model reads about it.
    """

    name: str = DEFAULT_REOPEN_NAME
    description: str = REOPEN_DESCRIPTION

    def definition(self) -> ToolDefinition:
        """The tool definition offered to the model."""
        return ToolDefinition(
            name=self.name,
            description=self.description,
            parameters={
                "type": "object",
                "properties": {
                    "elements": {
                        "type": "array",
                        "items": {"type": "integer"},
                        "description": "Source numbers to show again.",
                    },
                    "results": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "Result handles, such as r12.",
                    },
                },
                "additionalProperties": False,
            },
        )


DEFAULT_INSTRUCTIONS = (
    "Summarise the conversation so far for your own later use: the user's goals and requests, "
    "what was decided and done, the facts that tool results gave, and what is still open. "
    "Write only the summary."
)
DEFAULT_CITING = "Keep the citations of the sources you rely on, written like {citation}."


@dataclass(frozen=True)
class Compact:
    """How the model summarises earlier history when shrinks are not enough.

    Attributes:
        where: the turns to replace; only turns selected in one run from the oldest are
            replaced, and the running turn never is. Default: every turn but the last two.
        when: the size (prompt plus output reserve) above which a summary is due, after every
            shrink; a context that does not fit at all is always due. Default: 80 % of the window.
        instructions: the user message that asks for the summary.
        citing: added to the instructions when the agent cites; ``{citation}`` is an example.
        summary_output: the tokens kept free for the summary in the summary call.
    """

    where: Selection = field(default_factory=lambda: turns[:-2])
    when: Threshold = Share(0.8)
    instructions: str = DEFAULT_INSTRUCTIONS
    citing: str = DEFAULT_CITING
    summary_output: Tokens = Tokens(4096)

    def __post_init__(self) -> None:
        if self.where.unit != "turns":
            raise ValueError(f"a compaction replaces whole turns: where must select turns, got {self.where!r}")


DEFAULT_SHRINKS: tuple[Any, ...] = (
    Compress(turns[:-2]),
    Stub(turns[:-4]),
    Stub(turns[-3:], when=Share(0.85)),
)
"""Compress the results of every turn but the last two, stub those of every turn but the last
four, and over 85 % of the window also stub those of the last three turns."""


@dataclass(frozen=True)
class ContextPolicy:
    """How the builder keeps a model call's context within the model's limits.

    Each default is whole: a field you give replaces it, nothing is added to it.

    Attributes:
        start_at: the size above which the shrinks start (default 60 % of the window).
        target: the size the shrinks bring the context under (default 40 %); below start_at.
        min_gain: the least one pass of the shrinks must free, or None for any gain (default 10 %).
        shrink: the shrinks, in the order to apply them (see :data:`DEFAULT_SHRINKS`).
        compact: how earlier history is summarised, or None to never summarise.
        protect: the floors (default: a cited source stays full).
        full: the full form's function (default: as recorded).
        compressed: the compressed form's function (default: drop the text of each source).
        tools: per-tool forms and caps, by tool name.
        result_cap: the most tokens of one result the model reads, or None (default 8000).
        output_reserve: tokens kept free for the model's output (default 8192); not sent.
        reasoning: which earlier reasoning is sent back (default never): the one switch for
            reasoning replay (``CURRENT_TURN``: the running turn's, what DeepSeek's thinking mode
            needs on tool-call turns; ``ALWAYS``). It goes back only to the provider and model
            that wrote it; an OpenAI-compatible endpoint's ``quirks.reasoning_field`` says only
            which message field its server reads it from.
        max_images: the most images one request sends (the newest), or None for all.
        reopen: the reopen tool, or None for none.

    Raises:
        ValueError: target is not below start_at (when both are shares or both tokens), or
            max_images is negative.
    """

    start_at: Threshold = Share(0.6)
    target: Threshold = Share(0.4)
    min_gain: Threshold | None = Share(0.1)
    shrink: tuple[Any, ...] = DEFAULT_SHRINKS
    compact: Compact | None = None
    protect: tuple[Floor, ...] = (Floor(cited, FULL),)
    full: Shorten = as_recorded
    compressed: Shorten = drop_text
    tools: Mapping[str, Forms] = field(default_factory=dict)
    result_cap: Tokens | None = Tokens(8000)
    output_reserve: Tokens = Tokens(8192)
    reasoning: Reasoning = NEVER
    max_images: int | None = None
    reopen: Reopen | None = field(default_factory=Reopen)

    def __post_init__(self) -> None:
        if self.max_images is not None and self.max_images < 0:
            raise ValueError(f"max_images cannot be negative, got {self.max_images}")
        same_kind = type(self.start_at) is type(self.target)
        if same_kind and _raw(self.target) >= _raw(self.start_at):
            raise ValueError(f"the policy's target {self.target} must be below its start_at {self.start_at}")

    def check(self, limits: ModelLimits) -> None:
        """Check the thresholds against a model's window.

        Raises:
            ValueError: target is not below start_at in this window.
        """
        if limits.tokens(self.target) >= limits.tokens(self.start_at):
            raise ValueError(
                f"the policy's target ({limits.tokens(self.target)} tokens) must be below its start_at "
                f"({limits.tokens(self.start_at)} tokens) in a window of {limits.window.count} tokens"
            )

    def shorten_for(self, tool: str, form: Form) -> Shorten:
        """The function that makes a result of ``tool`` look as it does in ``form`` (FULL or COMPRESSED)."""
        own = self.tools.get(tool)
        if form == FULL:
            return (own.full if own is not None and own.full is not None else None) or self.full
        return (own.compressed if own is not None and own.compressed is not None else None) or self.compressed

    def cap_for(self, tool: str) -> Tokens | None:
        """The most tokens of a result of ``tool`` that the model reads (None: never cut)."""
        own = self.tools.get(tool)
        if own is None or own.cap == "policy":
            return self.result_cap
        return own.cap


def _raw(threshold: Threshold) -> float:
    return threshold.fraction if isinstance(threshold, Share) else float(threshold.count)
