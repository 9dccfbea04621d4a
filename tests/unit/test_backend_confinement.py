"""Backends confined to their own conversations (agentstream.wire.backends, issue 33 item 2): the
pure rule the agent loop and the cancel listeners apply to what a backend's streams carry, as
tables, and the key names it rests on."""

from __future__ import annotations

import pydantic
import pytest

from agentstream.errors import ConfigError
from agentstream.ops.settings import Settings
from agentstream.wire.backends import (
    backend_name_problem,
    confined_approval,
    confined_cancel,
    owns_trace,
    reply_refusal,
    trace_refusal,
    turn_scope,
)
from agentstream.wire.events import APPROVAL_BY_MAX_CHARS, ApprovalMessage, CancelMessage
from agentstream.wire.keys import Keys, trace_id_problem

KEYS = Keys("ns", 4, ("b7", "b8"))
REPLIES = KEYS.replies


@pytest.mark.parametrize(
    ("stream", "backend"),
    [
        ("ns:backends:b7:turns", "b7"),
        ("ns:backends:b7:turns:p1", "b7"),
        ("ns:backends:b7:turns:p3", "b7"),
        ("ns:backends:b8:cancel", "b8"),
        ("ns:backends:b8:approvals", "b8"),
        ("ns:backends:b8:approvals:p1", None),  # not partitioned
        ("ns:approvals", None),
        ("ns:backends:b7:turns:p4", None),  # no such partition (4 partitions: p1..p3)
        ("ns:backends:b7:turns:p01", None),
        ("ns:backends:b7:other", None),
        ("ns:backends:b9:turns", None),  # not a configured backend
        ("ns:backends:b7", None),
        ("ns:turns", None),  # the shared streams: trusted senders
        ("ns:turns:p1", None),
        ("ns:cancel", None),
        ("other:backends:b7:turns", None),
        ("", None),
        (None, None),
    ],
)
def test_the_backend_of_a_stream_is_read_from_its_name(stream, backend) -> None:
    assert KEYS.backend_of_stream(stream) == backend


@pytest.mark.parametrize(
    ("trace_id", "backend"),
    [("b7:c", "b7"), ("b7:c/child", "b7"), ("b8:x:y", "b8"), ("b7:", None), ("b9:c", None), ("c", None), ("", None)],
)
def test_the_backend_of_a_trace_is_its_prefix(trace_id, backend) -> None:
    assert KEYS.backend_of_trace(trace_id) == backend


def test_a_backends_streams_and_replies_are_named_under_its_own_prefix() -> None:
    assert KEYS.backend_turns("b7") == "ns:backends:b7:turns"
    assert KEYS.backend_cancel("b7") == "ns:backends:b7:cancel"
    assert KEYS.backend_replies("b7") == "ns:replies:b7"
    assert KEYS.cancel_streams == ["ns:cancel", "ns:backends:b7:cancel", "ns:backends:b8:cancel"]
    trace = "b7:conv-1"
    assert KEYS.backend_turns_for("b7", trace) == KEYS.for_trace("ns:backends:b7:turns", trace)
    assert KEYS.backend_of_stream(KEYS.backend_turns_for("b7", trace)) == "b7"
    streams = KEYS.work_streams()
    assert "ns:backends:b7:cancel" in streams and "ns:backends:b7:cancel:p1" not in streams
    assert {"ns:backends:b8:turns", "ns:backends:b8:turns:p3"} <= set(streams)
    # without backends, the layout of before, name for name (with the approvals stream)
    assert Keys("ns").work_streams() == [
        "ns:turns",
        "ns:wake",
        "ns:cancel",
        "ns:approvals",
        "ns:delegations",
        "ns:child-endings",
        "ns:compactions",
    ]


@pytest.mark.parametrize(
    "name", ["", "a:b", "a{b", "a}b", "a*", "a b", "-a", "a/b", "ü", "a" * 65, "a?", "a[1]", "a.b"]
)
def test_a_backend_name_that_could_reach_into_another_is_refused(name) -> None:
    assert backend_name_problem(name) is not None
    with pytest.raises(ConfigError, match="AGENTSTREAM_BACKENDS"):
        Keys("ns", 1, (name,))
    if name and " " not in name:  # the setting splits at commas and spaces
        with pytest.raises(pydantic.ValidationError, match="AGENTSTREAM_BACKENDS"):
            Settings(backends=f"ok,{name}")


def test_backends_come_from_the_setting_each_once() -> None:
    assert Settings(backends="b7, b8").keys.backends == ("b7", "b8")
    assert Settings().keys.backends == ()
    with pytest.raises(pydantic.ValidationError, match="twice"):
        Settings(backends="b7,b7")


@pytest.mark.parametrize(
    ("backend", "trace_id", "allowed"),
    [
        ("b7", "b7:conv", True),
        ("b7", "b7:conv/child-1", True),  # its conversation's subagent
        ("b7", "b7:", False),  # nothing after the prefix
        ("b7", "b8:conv", False),  # another backend's
        ("b7", "b7", False),
        ("b7", "b70:conv", False),  # a longer name that begins with its own
        ("b7", "b7-x:conv", False),
        ("b7", "conv", False),  # an unconfined conversation
        ("b7", "B7:conv", False),  # case counts
        (None, "b8:conv", True),  # a shared (trusted) stream
        (None, "conv", True),
    ],
)
def test_a_backend_touches_only_traces_under_its_prefix(backend, trace_id, allowed) -> None:
    assert (trace_refusal(backend, trace_id) is None) is allowed
    if backend is not None:
        assert owns_trace(backend, trace_id) is allowed


def test_every_trace_id_of_a_backend_is_a_usable_trace_id() -> None:
    # the prefix keeps the hash tag {<trace id>} whole and is checked by the wire's own rule
    for backend in ("b7", "backend-7", "A_1"):
        assert trace_id_problem(f"{backend}:conv-1") is None
        assert KEYS.trace(f"{backend}:c") == f"ns:trace:{{{backend}:c}}"


@pytest.mark.parametrize(
    ("backend", "reply_to", "allowed"),
    [
        ("b7", None, True),  # its own stream, by default
        ("b7", "ns:replies:b7", True),
        ("b7", "ns:replies:b7:ui", True),
        ("b7", "ns:replies:b8", False),
        ("b7", "ns:replies:b70", False),
        ("b7", "ns:replies:b7x", False),
        ("b7", "ns:replies", False),  # the shared default: not its own
        ("b7", "elsewhere:b7", False),
        (None, "ns:replies:b8", True),
    ],
)
def test_a_backend_is_answered_only_on_its_own_replies_streams(backend, reply_to, allowed) -> None:
    assert (reply_refusal(backend, REPLIES, reply_to) is None) is allowed


@pytest.mark.parametrize(
    ("backend", "trace_id", "reply_to", "refused", "answered_on"),
    [
        ("b7", "b7:c", None, False, "ns:replies:b7"),
        ("b7", "b7:c", "ns:replies:b7:x", False, "ns:replies:b7:x"),
        ("b7", "b8:c", "ns:replies:b7", True, "ns:replies:b7"),  # into another's conversation
        ("b7", "b7:c", "ns:replies:b8", True, "ns:replies:b7"),  # into another's replies: told on its own
        ("b7", "b8:c", "ns:replies:b8", True, "ns:replies:b7"),
        ("b7", None, "ns:replies:b8", True, "ns:replies:b7"),
        ("b7", None, None, False, "ns:replies:b7"),  # names no trace: the wire's checks report it
        (None, "b8:c", None, False, None),  # trusted: as before
        (None, "b8:c", "ns:replies:b8", False, "ns:replies:b8"),
    ],
)
def test_the_scope_of_a_turn_and_where_it_is_answered(backend, trace_id, reply_to, refused, answered_on) -> None:
    scope = turn_scope(backend, REPLIES, trace_id, reply_to)
    assert (scope.refusal is not None) is refused, scope
    assert scope.reply_to == answered_on
    if refused:
        assert repr(backend) in scope.refusal


@pytest.mark.parametrize(
    ("backend", "message", "by"),
    [
        ("b7", CancelMessage(trace_id="b7:c", by="b8"), "b7"),  # a forged `by` is replaced
        ("b7", CancelMessage(trace_id="b7:c", turn_id="t1"), "b7"),
        ("b7", CancelMessage(trace_id="b8:c", by="b8"), None),  # another's conversation: refused
        ("b7", CancelMessage(trace_id="c"), None),
        (None, CancelMessage(trace_id="b8:c", by="operator"), "operator"),  # the shared stream: as said
    ],
)
def test_a_cancel_is_confined_and_its_by_is_its_stream(backend, message, by) -> None:
    confined, refusal = confined_cancel(backend, message)
    if by is None:
        assert confined is None and refusal and message.trace_id in refusal
    else:
        assert refusal is None and confined is not None
        assert (confined.by, confined.trace_id, confined.turn_id) == (by, message.trace_id, message.turn_id)


@pytest.mark.parametrize(
    ("backend", "trace_id", "by", "recorded_by"),
    [
        (None, "b8:c", "anyone", "anyone"),  # the shared stream: trusted, taken as it is
        ("b7", "b7:c", "ana", "b7/ana"),  # its own conversation: who decided, under its name
        ("b7", "b7:c", "", "b7"),
        ("b7", "b7:c", "b8", "b7/b8"),  # naming another backend forges nothing
        ("b7", "b7:c", "x" * APPROVAL_BY_MAX_CHARS, ("b7/" + "x" * APPROVAL_BY_MAX_CHARS)[:APPROVAL_BY_MAX_CHARS]),
        ("b7", "b8:c", "ana", None),  # another backend's conversation: refused
        ("b7", "b7", "ana", None),  # the prefix alone is no conversation
        ("b7", "b77:c", "ana", None),
    ],
)
def test_an_approval_is_confined_and_recorded_under_its_streams_backend(backend, trace_id, by, recorded_by) -> None:
    message = ApprovalMessage(trace_id=trace_id, call_id="c1", approved=True, by=by)
    confined, refusal = confined_approval(backend, message)
    if recorded_by is None:
        assert confined is None and refusal and trace_id in refusal and "approval" in refusal
    else:
        assert refusal is None and confined is not None
        assert (confined.by, confined.trace_id, confined.call_id) == (recorded_by, trace_id, "c1")


def test_every_approvals_stream_is_consumed_the_shared_one_first() -> None:
    assert KEYS.approval_streams == ["ns:approvals", "ns:backends:b7:approvals", "ns:backends:b8:approvals"]
