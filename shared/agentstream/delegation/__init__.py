"""Delegation: a tool whose call runs a subagent on a child trace.

An agent declares a delegation among its tools, with a typed input whose fields are the tool's
arguments, the agent that runs the child (and on which model), and what counts as its result::

    class Research(pydantic.BaseModel):
        question: str = pydantic.Field(description="The question to research.")

    research = Delegation(
        name="research",
        description="Hand a research question to the researcher subagent.",
        input=Research,
        agent="researcher",
    )
    app = App(agents=[Agent(name="lead", ..., tools=[research]), Agent(name="researcher", ...)])

The flow, with the service that does each step:

1. (agent loop) The parent's model calls the delegation: its call goes to the delegations
   stream instead of a tool queue.
2. (delegation) :func:`hand_off` turns the call into the child trace's first event, a
   :class:`~agentstream.wire.events.TaskInput` (call id, expected result schema, parent trace and
   call, depth, root trace), or into an error result for the parent when the arguments do not
   fit, the depth limit is reached, or an ancestor already delegated the identical task to the
   same agent (field case C30). The child trace's id follows from the parent's trace and call
   (:func:`child_trace_id`), so a hand-off that runs twice opens one child.
3. (agent loop) The child runs like any trace, on the child agent's own config. At the depth
   limit, delegations are withheld from its model (:func:`offered_agent`).
4. (agent loop) When the child's turn ends, a :class:`ChildEnded` hint goes to the delegation
   service instead of a reply.
5. (delegation) :func:`hand_back` turns the ended child into the ToolOutput of the parent's
   call, with the sources the child cited. A result that is empty, or does not fit the schema,
   is an error the parent's model sees, never a silent success. The parent is woken.
6. (delegation) A supervisor ends a child that passes its deadline with exactly one
   TurnFailed (code ``timed_out``, :func:`timed_out`), which is handed back like any ending
   (field case C28). A parent's turn that ends while children run cancels them, and so on down.

Parallel delegations in one model output open their children at once; their results come back
in call order, because the context always shows results in the order of the calls.

Everything here is pure (no Redis, no asyncio, no clock): the services do the I/O.
"""

from agentstream.delegation.handback import TIMED_OUT, ending_of, hand_back, task_of, timed_out
from agentstream.delegation.handoff import (
    ChildEnded,
    HandOff,
    child_trace_id,
    child_trace_refusal,
    children_of,
    decode_child_ended,
    depth_of,
    descendants_refused,
    hand_off,
    numbering_of,
    offered_agent,
    parent_ids,
    task_digest,
)
from agentstream.delegation.tool import (
    DEFAULT_DEADLINE_S,
    DEFAULT_MAX_DEPTH,
    Delegation,
    ResultFunction,
    default_result,
    delegations_of,
)

__all__ = [
    "DEFAULT_DEADLINE_S",
    "DEFAULT_MAX_DEPTH",
    "TIMED_OUT",
    "ChildEnded",
    "Delegation",
    "HandOff",
    "ResultFunction",
    "child_trace_id",
    "child_trace_refusal",
    "parent_ids",
    "children_of",
    "decode_child_ended",
    "default_result",
    "delegations_of",
    "depth_of",
    "descendants_refused",
    "ending_of",
    "hand_back",
    "hand_off",
    "numbering_of",
    "offered_agent",
    "task_digest",
    "task_of",
    "timed_out",
]
