"""What the shrinks, the reopen tool and compaction planning read of a trace's fold (pure).

:class:`agentstream.context._context_fold.ContextFold` folds a trace and calls
:mod:`agentstream.context.shrink` (the judge), :mod:`agentstream.context.reopen` and
:mod:`agentstream.context.compaction` as it goes; those take the state as an argument. They name
its type as :class:`FoldState`, this structural type (PEP 544), instead of importing the state
module that imports them: the context library has no import cycle.

Every attribute and method listed is the one of the same name on ``ContextFold`` (see there for
meanings and units: sizes are characters unless named ``*_tokens``); a ``ContextFold`` satisfies
this protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from agentstream.context._context_fold_parts import Change, Slot, Turn
    from agentstream.context.elements import Numbering
    from agentstream.context.forms.shorten import Form
    from agentstream.context.limits import ModelLimits
    from agentstream.context.policy import ContextPolicy
    from agentstream.context.render import ContextConfig, ResultRenderer
    from agentstream.context.request import Message, ToolDefinition
    from agentstream.declarations.agents import Agent
    from agentstream.wire.events import Compaction


class FoldState(Protocol):
    """The fold of one trace for one agent and one model, as its helpers read and change it."""

    agent: Agent
    config: ContextConfig
    policy: ContextPolicy
    limits: ModelLimits | None
    numbering: Numbering
    renderer: ResultRenderer
    turns: list[Turn]
    turn_index: dict[str, int]
    results: dict[str, Slot]
    slots: list[Slot]
    handle_index: dict[str, Slot]
    rounds: list[list[str]]
    cited: set[str]
    cited_floors_only: bool
    cited_lift: Form
    forms: dict[str, Form]
    compaction: Compaction | None
    kept_from: int
    last_chars: int
    recorded: tuple[int, int] | None
    exhausted: tuple[Any, ...] | None
    cursors: dict[int, Any]
    reverted: tuple[tuple[Any, ...], int, dict[Slot, int]] | None
    recalls: int
    placements: int
    rescans: int
    scanned_mark: tuple[int, int, int, int] | None
    thresholds: tuple[int, int, int] | None
    reserve: int
    min_gain_tokens: int | None
    steps: tuple[Any, ...]
    prefix_only: dict[tuple[int, ...], bool]
    prefix_units: frozenset[Any]
    reopen_def: ToolDefinition | None
    reopen_chars: int

    def base_system(self, current: int) -> str: ...

    def apply_plan(self, slots: Sequence[Slot], call: int, keep: bool) -> list[Change]: ...

    def chars(self, current: int, step: int) -> int: ...

    def estimate(self, slot: Slot, form: Form, element_forms: tuple[Form, ...] | None) -> int: ...

    def message_of(self, slot: Slot) -> Any: ...

    def offers_reopen(self, current: int) -> bool: ...

    def smallest_chars(self, slot: Slot) -> int: ...

    def tools_offered(self, current: int, step: int) -> bool: ...

    def turn_messages(self, turn: Turn, with_reasoning: bool) -> tuple[Message, ...]: ...

    def visible_from(self, current: int) -> int: ...
