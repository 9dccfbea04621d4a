"""The shared context library: trace events → the exact request of any model call.

Pure: no Redis, no asyncio, no clock, no I/O. The services call it; any worker rebuilds the
byte-identical request of any step from the stored trace, and :func:`explain` says afterwards
what a call saw and why each old result was shortened.

Modules, by role:

- :mod:`.builder`: events → :class:`ChatRequest` (``build_request``, ``build_context``);
- :mod:`.state`: the incremental fold of a trace; :mod:`.cache`: one fold per trace per worker;
- :mod:`.policy`: the context policy (thresholds, shrinks, floors, per-tool forms, reasoning,
  reopen, compaction setting); :mod:`.shrink`: applying it at each model call;
- :mod:`.forms`: result forms and shorten functions; :mod:`.limits`: model limits and estimates;
- :mod:`.trimming`: trimming messages to a token budget; :mod:`.compaction`: what a summary
  replaces and the summary calls; :mod:`.reopen`: the reopen tool;
- :mod:`.elements`, :mod:`.citations`, :mod:`.layout`: element numbering, citation styles and
  the XML layout; :mod:`.render`: messages from events; :mod:`.explain`: explaining a call.
"""

from agentstream.context._context_fold_cache import ContextCache
from agentstream.context.builder import (
    DEFAULT_CONFIG,
    BuiltContext,
    Shrunk,
    build_context,
    build_messages,
    build_request,
    reopen_result,
    require_fit,
    settings_of,
    tool_definitions,
    trimmed_request,
)
from agentstream.context.citations import BRACKETS, FULLWIDTH, CitationStyle
from agentstream.context.compaction import (
    CompactionPlan,
    compaction_event,
    summary_request,
)
from agentstream.context.elements import Numbering
from agentstream.context.explain import Explanation, describe_shrunk, explain
from agentstream.context.forms import (
    COMPRESSED,
    FULL,
    STUBBED,
    Form,
    Shorten,
    ShortenText,
    as_recorded,
    cap,
    drop_text,
    first_words,
    json_cap,
    sources,
)
from agentstream.context.layout import Layout, xml
from agentstream.context.limits import (
    DEFAULT_LIMITS,
    ModelLimits,
    Share,
    Threshold,
    Tokens,
    estimate_tokens,
)
from agentstream.context.policy import (
    ALWAYS,
    CURRENT_TURN,
    DEFAULT_SHRINKS,
    NEVER,
    Compact,
    Compress,
    ContextPolicy,
    ContextView,
    Floor,
    Forms,
    Reasoning,
    Reopen,
    Selection,
    Shrink,
    Stub,
    cited,
    results,
    rounds,
    turns,
)
from agentstream.context.render import ContextConfig, RenderEvent, ShowElements, only
from agentstream.context.reopen import resolve_reopen
from agentstream.context.request import (
    AssistantMessage,
    ChatRequest,
    Message,
    ToolDefinition,
    ToolResultMessage,
    UserMessage,
)
from agentstream.context.trimming import SystemMessage, atrim_messages, trim_messages, trim_request

__all__ = [
    "ALWAYS",
    "BRACKETS",
    "COMPRESSED",
    "CURRENT_TURN",
    "DEFAULT_CONFIG",
    "DEFAULT_LIMITS",
    "DEFAULT_SHRINKS",
    "FULL",
    "FULLWIDTH",
    "NEVER",
    "STUBBED",
    "AssistantMessage",
    "BuiltContext",
    "ChatRequest",
    "CitationStyle",
    "Compact",
    "CompactionPlan",
    "Compress",
    "ContextCache",
    "ContextConfig",
    "ContextPolicy",
    "ContextView",
    "Explanation",
    "Floor",
    "Form",
    "Forms",
    "Layout",
    "Message",
    "ModelLimits",
    "Numbering",
    "Reasoning",
    "RenderEvent",
    "Reopen",
    "Selection",
    "Share",
    "Shorten",
    "ShortenText",
    "ShowElements",
    "Shrink",
    "Shrunk",
    "Stub",
    "SystemMessage",
    "Threshold",
    "ToolDefinition",
    "ToolResultMessage",
    "Tokens",
    "UserMessage",
    "as_recorded",
    "build_context",
    "build_messages",
    "build_request",
    "cap",
    "cited",
    "compaction_event",
    "describe_shrunk",
    "drop_text",
    "estimate_tokens",
    "explain",
    "first_words",
    "json_cap",
    "only",
    "reopen_result",
    "require_fit",
    "resolve_reopen",
    "results",
    "rounds",
    "settings_of",
    "sources",
    "summary_request",
    "tool_definitions",
    "atrim_messages",
    "trim_messages",
    "trim_request",
    "trimmed_request",
    "turns",
    "xml",
]
