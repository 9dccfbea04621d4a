"""Settings from the environment (pydantic-settings), read once at startup.

Variables (all optional):

- ``REDIS_URL``: the Redis to use, e.g. ``redis://localhost:6379/0``. Unset: the commands that
  run everything (``agentstream run``, ``agentstream dev``) start an embedded Redis.
- ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``OPENAI_MODEL``: the ``default`` model endpoint,
  any OpenAI-compatible chat-completions server (OpenAI, vLLM, Ollama, llama.cpp). Unset base
  URL: the commands that run everything start the local SmolLM2 model.
- ``AGENTSTREAM_MODELS_FILE``: a YAML file of model endpoints by id (provider, base URL, model,
  the variable holding the key, window, quirks); see :mod:`agentstream.models.endpoints`.
- ``AGENTSTREAM_DEFAULT_MODEL_OPTIONS``: JSON object of extra settings of the ``default``
  endpoint (``{"stream": false, "window_tokens": 8192, "quirks": {...}}``).
- ``AGENTSTREAM_DELTA_MAXLEN``: entries kept on a trace's token-delta stream (``MAXLEN ~``).
- ``AGENTSTREAM_DELTA_TTL_S``: seconds a trace's token-delta stream lives after its last write.
- ``REDIS_URL`` naming a Redis Cluster: scheme ``redis+cluster://`` (``rediss+cluster://`` with
  TLS) and any node's address, or a plain ``redis://`` URL with ``AGENTSTREAM_REDIS_CLUSTER=true``
  (see :func:`agentstream.runtime.connection.connect`). A service refuses to start (one line,
  exit code 2) when the server's mode is not the URL's, or when a ``max_connections`` in the URL
  is below the connections it holds at once (:func:`agentstream.runtime.runner.startup_checks`).
- ``AGENTSTREAM_PARTITIONS``: how many partitions each work stream has (default 1: one stream
  each, today's names); a trace's work always goes to one partition (see :mod:`agentstream.wire.keys`).
  Every process of a deployment must have the same value.
- ``AGENTSTREAM_NAMESPACE``: prefix of every Redis key (default ``agentstream``); no ``{`` or ``}``
  (see :func:`agentstream.wire.keys.check_namespace`).
- ``AGENTSTREAM_CONSUMER``: this process's consumer name in its groups (default host-pid).
- ``AGENTSTREAM_BLOCK_MS``: how long one blocking read waits, in milliseconds (default 1000).
- ``AGENTSTREAM_MIN_IDLE_MS``: a pending entry idle this long is claimed from its (dead) consumer.
- ``AGENTSTREAM_MAX_DELIVERIES``: real deliveries (handler starts; re-reads and claim renewals
  do not count) after which an entry goes to the dead-letter stream and its turn ends with a
  reason. Keep it at 2 or more: a job running beside one that kills its worker loses a start too.
- ``AGENTSTREAM_CONSUMER_DELETE_IDLE_MS``: a consumer idle this long that owns no pending
  entries (a dead or rescaled pod's name) is deleted from its group; 0 never deletes. At least
  ``AGENTSTREAM_MIN_IDLE_MS``, ``AGENTSTREAM_LEASE_TTL_MS`` and two ``AGENTSTREAM_BLOCK_MS``,
  or the settings are refused (see :func:`agentstream.ops.startup.contradictions`).
- ``AGENTSTREAM_WATCHDOG_INTERVAL_MS``: how often the agent loop looks for turns waiting on tool
  jobs that vanished without a result (and ends them, code ``lost_work``); 0 never looks.
- ``AGENTSTREAM_CONCURRENCY``: entries one consumer handles at the same time (default 64: a
  handler mostly waits on a model or a tool; issue 35 measured +37 % steps/s over 16 together
  with 1 s blocking reads and warning logs).
- ``AGENTSTREAM_LEASE_TTL_MS``: the agent loop's lease on a trace, renewed while held.
- ``AGENTSTREAM_FOLD_CACHE_BYTES``: the most bytes of memory the folded traces of one process
  (agent loop, gateway, delegation, compaction) may take, as measured
  (:class:`agentstream.steps.trace_fold.FoldCache`; least recently used dropped first; a dropped trace
  is folded again from its first entry on its next step). Default (unset or empty): a quarter of
  the process's memory limit (cgroup ``memory.max``), or 256 MiB without a limit
  (:mod:`agentstream.ops.memory`).
- ``AGENTSTREAM_MODEL_TIMEOUT_S``: one model HTTP request's timeout, in seconds.
- ``AGENTSTREAM_MODEL_RETRIES``: retries of a failed model request (network, 408/409/429/5xx).
- ``AGENTSTREAM_METRICS_PORT``: the port of /metrics, /healthz and /readyz (0 = off).
- ``AGENTSTREAM_METRICS_HOST``: the address that port binds (default ``0.0.0.0``, every
  interface, as a scraper in another pod needs; ``127.0.0.1`` keeps it to the machine).
- ``AGENTSTREAM_METRICS_INTERVAL_S``: how often stream length, pending entries and lag are read.
- ``AGENTSTREAM_SHUTDOWN_GRACE_S``: how long a service drains on SIGTERM, in seconds.
- ``AGENTSTREAM_BUSY_POLICY``: what a turn published on a busy conversation does: ``queue``
  (default: it waits behind the running turn), ``reject`` (it fails at once with code ``busy``)
  ``interrupt`` (the running turn is cancelled, then the new one runs) or ``rollback`` (as
  interrupt, and the cancelled turn's events are left out of every later context). The default of
  a turn whose message names no ``busy_policy`` of its own.
- ``AGENTSTREAM_MAX_QUEUED_TURNS``: the most turns of one conversation admitted and not ended (its
  running turn and those queued behind it; default 64); a turn published past it fails at once
  with code ``busy``, so one conversation's backlog cannot grow without bound.
- ``AGENTSTREAM_TRIM_INTERVAL_MS``: how often work streams are trimmed below what every consumer
  group acknowledged, in milliseconds (0 = never). Traces are never trimmed.
- ``AGENTSTREAM_TRACE_RETENTION_S``: delete a whole conversation (its trace and keys) this long
  after its last turn ended, in seconds; unset keeps traces forever. Set it well above the
  longest turn.
- ``AGENTSTREAM_MAX_DESCENDANTS``: the most child traces (subagent runs) one root conversation
  may open, all levels together; a delegation past it gets an error result.
- ``AGENTSTREAM_SUPERVISE_INTERVAL_MS``: how often the delegation service's supervisor looks for
  child traces past their deadline, in milliseconds.
- ``AGENTSTREAM_COMPACTION_MODEL``: the model endpoint id that writes compaction summaries (a
  cheaper model will do); unset, each agent's own model writes its summaries.
- ``AGENTSTREAM_MCP_WAIT_S``: how long a turn waits for the first tool list of its agent's MCP
  servers (published by their tool workers), in seconds, before it fails with code
  ``tools_unavailable``. The transports of MCP servers have variables of their own (see
  :mod:`agentstream.declarations.mcp_servers`).

The wire's limits (see :mod:`agentstream.wire.checks`; a turn over one is refused with code
``bad_turn`` before anything of it is stored, the reason naming the limit and the size):

- ``AGENTSTREAM_MAX_TURN_BYTES``: the largest published turn, its whole JSON (default 524288).
- ``AGENTSTREAM_MAX_METADATA_BYTES``: the largest turn metadata, keys and values (default 16384).
- ``AGENTSTREAM_MAX_JSON_DEPTH``: the deepest nesting of a turn's JSON (default 16).
- ``AGENTSTREAM_MAX_ID_BYTES``: the longest trace id, turn id, agent name or reply stream (256).
- ``AGENTSTREAM_MAX_TOOL_ARGUMENTS_BYTES``: the largest tool-call arguments run (default 262144;
  larger ones get an error result).
- ``AGENTSTREAM_MAX_TOOL_RESULT_BYTES``: the largest tool result recorded (default 1048576;
  a larger one is replaced by an error result).
- ``AGENTSTREAM_EXCERPT_BYTES``: how much of a bad payload the errors and dead-letter streams
  keep (default 2048).
- ``AGENTSTREAM_ERRORS_MAXLEN``: the approximate cap (``MAXLEN ~``) of the errors stream and of
  each dead-letter stream (default 10000).
- ``AGENTSTREAM_REPLY_STREAMS``: glob patterns (commas or spaces between them) of more streams a
  turn's ``reply_to`` may name, beside ``<ns>:replies`` and ``<ns>:replies:*``; a stream of the
  namespace's own that is not a replies stream is refused whatever the patterns.
- ``AGENTSTREAM_BACKENDS``: the backends confined to their own conversations (names, commas or
  spaces between them; default none). Each gets its own turns and cancel streams
  (``<ns>:backends:<name>:turns``, ``...:cancel``), read by the agent loop, whose turns and
  cancels may only name trace ids that begin with ``<name>:`` and replies streams
  ``<ns>:replies:<name>``... (see :mod:`agentstream.wire.backends`). Set it on every service.

Deadlines:

- ``AGENTSTREAM_MODEL_DEADLINE_S``: the most one model call may take as a whole, connect to last
  byte, retries included (default 300); past it the turn fails with code ``deadline``.
- ``AGENTSTREAM_TURN_DEADLINE_S``: the most one turn may take from its start (unset: no limit);
  checked at every step and bounding each model call; past it the turn fails with code
  ``deadline``.

The API key is a ``SecretStr``: it never appears in a repr, a log or a trace.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from agentstream.errors import ConfigError
from agentstream.ops.memory import default_cache_bytes
from agentstream.ops.startup import contradictions
from agentstream.wire.backends import check_backends
from agentstream.wire.checks import DEFAULT_LIMITS, WireLimits, parse_patterns
from agentstream.wire.keys import DEFAULT_NAMESPACE, Keys, check_namespace


@dataclass(frozen=True)
class ConsumerConfig:
    """How a consumer reads.

    Attributes:
        block_ms: longest wait of one blocking read, in milliseconds.
        batch_size: entries read (or claimed) per call.
        concurrency: entries handled at the same time.
        min_idle_ms: a pending entry idle this long is claimed from its consumer.
        reclaim_interval_ms: how often to look for idle pending entries.
        max_deliveries: handler starts after which an entry is dead-lettered.
        backoff_max_s: the longest wait between retries after a Redis error or a failed
            handler, in seconds.
        retry_delay_s: the wait before a failed handler is retried, in seconds; it doubles with
            each attempt, up to ``backoff_max_s``.
        renew_interval_ms: how often the claims on entries in hand are renewed; None means a
            third of ``min_idle_ms``.
        trim_interval_ms: how often the stream is trimmed below what every group acknowledged;
            0 never trims.
        use_claim_option: use XREADGROUP's ``CLAIM`` option where the server has it (≥ 8.4)
            instead of separate XAUTOCLAIM calls.
        dead_maxlen: the approximate cap (``MAXLEN ~``) of the dead-letter stream, in entries.
        excerpt_bytes: the most of each field of a dead-lettered entry that its dead-letter
            record keeps, in bytes (the rest is cut, with a note of the whole size).
        delete_idle_consumers_ms: a consumer of the group idle this long (no read, no claim)
            that owns no pending entries is deleted (XGROUP DELCONSUMER): the names of dead or
            rescaled pods do not pile up. 0 never deletes. A consumer that owns entries is
            never deleted (its entries are claimed after ``min_idle_ms`` instead).
    """

    block_ms: int = 1000
    batch_size: int = 32
    concurrency: int = 64
    min_idle_ms: int = 60_000
    reclaim_interval_ms: int = 5_000
    max_deliveries: int = 5
    backoff_max_s: float = 5.0
    retry_delay_s: float = 1.0
    renew_interval_ms: int | None = None
    trim_interval_ms: int = 60_000
    use_claim_option: bool = True
    dead_maxlen: int = 10_000
    excerpt_bytes: int = 2048
    delete_idle_consumers_ms: int = 3_600_000

    @property
    def prune_interval_s(self) -> float:
        """How often idle consumers are looked for, in seconds (a tenth of the idle threshold,
        between the reclaim interval and a minute)."""
        tenth_ms = self.delete_idle_consumers_ms // 10
        return max(self.reclaim_interval_ms, min(60_000, tenth_ms)) / 1000.0

    @property
    def renew_ms(self) -> int:
        """The claim renewal interval in milliseconds."""
        return self.renew_interval_ms if self.renew_interval_ms is not None else max(10, self.min_idle_ms // 3)


class Settings(BaseSettings):
    """agentstream's settings; see the module docstring for the variables."""

    model_config = SettingsConfigDict(env_prefix="AGENTSTREAM_", extra="ignore", frozen=True)

    redis_url: str | None = Field(default=None, validation_alias=AliasChoices("REDIS_URL", "AGENTSTREAM_REDIS_URL"))
    openai_base_url: str | None = Field(default=None, validation_alias=AliasChoices("OPENAI_BASE_URL"))
    openai_api_key: SecretStr | None = Field(default=None, validation_alias=AliasChoices("OPENAI_API_KEY"))
    openai_model: str | None = Field(default=None, validation_alias=AliasChoices("OPENAI_MODEL"))
    models_file: str | None = None
    default_model_options: str | None = None
    delta_maxlen: int = Field(default=2000, ge=10)
    delta_ttl_s: int = Field(default=600, ge=1)
    redis_cluster: bool = False
    partitions: int = Field(default=1, ge=1, le=1024)
    namespace: str = DEFAULT_NAMESPACE
    consumer: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    block_ms: int = Field(default=1000, ge=10)
    min_idle_ms: int = Field(default=60_000, ge=10)
    max_deliveries: int = Field(default=5, ge=1)
    concurrency: int = Field(default=64, ge=1)
    lease_ttl_ms: int = Field(default=30_000, ge=1000)
    fold_cache_bytes: int | None = Field(default=None, ge=0)
    model_timeout_s: float = Field(default=120.0, gt=0)
    model_retries: int = Field(default=2, ge=0)
    metrics_port: int = Field(default=0, ge=0, le=65535)
    metrics_host: str = "0.0.0.0"
    metrics_interval_s: float = Field(default=15.0, gt=0)
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    busy_policy: Literal["queue", "reject", "interrupt", "rollback"] = "queue"
    max_queued_turns: int = Field(default=64, ge=1)
    trim_interval_ms: int = Field(default=60_000, ge=0)
    trace_retention_s: float | None = Field(default=None, gt=0)
    max_descendants: int = Field(default=100, ge=1)
    supervise_interval_ms: int = Field(default=1000, ge=10)
    compaction_model: str | None = None
    max_turn_bytes: int = Field(default=DEFAULT_LIMITS.max_turn_bytes, ge=256)
    max_metadata_bytes: int = Field(default=DEFAULT_LIMITS.max_metadata_bytes, ge=0)
    max_json_depth: int = Field(default=DEFAULT_LIMITS.max_json_depth, ge=2)
    max_id_bytes: int = Field(default=DEFAULT_LIMITS.max_id_bytes, ge=16)
    max_tool_arguments_bytes: int = Field(default=DEFAULT_LIMITS.max_tool_arguments_bytes, ge=2)
    max_tool_result_bytes: int = Field(default=DEFAULT_LIMITS.max_tool_result_bytes, ge=256)
    excerpt_bytes: int = Field(default=DEFAULT_LIMITS.excerpt_bytes, ge=64)
    errors_maxlen: int = Field(default=DEFAULT_LIMITS.errors_maxlen, ge=10)
    reply_streams: str = ""
    backends: str = ""
    model_deadline_s: float = Field(default=300.0, gt=0)
    turn_deadline_s: float | None = Field(default=None, gt=0)
    consumer_delete_idle_ms: int = Field(default=3_600_000, ge=0)
    watchdog_interval_ms: int = Field(default=10_000, ge=0)
    mcp_wait_s: float = Field(default=30.0, ge=0)

    @cached_property
    def keys(self) -> Keys:
        return Keys(self.namespace, self.partitions, parse_patterns(self.backends))

    @field_validator("backends")
    @classmethod
    def _usable_backends(cls, value: str) -> str:
        """Names a backend may have, each once (:func:`agentstream.wire.backends.check_backends`)."""
        try:
            check_backends(parse_patterns(value))
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("namespace")
    @classmethod
    def _usable_namespace(cls, value: str) -> str:
        """No ``{`` or ``}``: a hash tag of its own would break the slots of a Redis Cluster
        (:func:`agentstream.wire.keys.check_namespace`)."""
        try:
            return check_namespace(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None

    def fold_cache_budget_bytes(self) -> int:
        """The bound of the process's fold cache in bytes: ``fold_cache_bytes`` when set, otherwise
        the default for the process's memory limit (:func:`agentstream.ops.memory.default_cache_bytes`).

        Raises:
            ValueError: the cgroup's limit file cannot be understood.
        """
        if self.fold_cache_bytes is not None:
            return self.fold_cache_bytes
        return default_cache_bytes()

    @field_validator("turn_deadline_s", "trace_retention_s", "fold_cache_bytes", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        """An empty variable (compose's ``${VAR:-}``) means unset."""
        return None if isinstance(value, str) and not value.strip() else value

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        """Settings that contradict each other are refused, with the reason
        (:func:`agentstream.ops.startup.contradictions`)."""
        found = contradictions(
            min_idle_ms=self.min_idle_ms,
            lease_ttl_ms=self.lease_ttl_ms,
            block_ms=self.block_ms,
            consumer_delete_idle_ms=self.consumer_delete_idle_ms,
        )
        if found:
            raise ValueError("; ".join(found))
        return self

    @cached_property
    def wire_limits(self) -> WireLimits:
        """The wire's limits and reply-stream patterns (see :mod:`agentstream.wire.checks`)."""
        return WireLimits(
            max_turn_bytes=self.max_turn_bytes,
            max_metadata_bytes=self.max_metadata_bytes,
            max_json_depth=self.max_json_depth,
            max_id_bytes=self.max_id_bytes,
            max_tool_arguments_bytes=self.max_tool_arguments_bytes,
            max_tool_result_bytes=self.max_tool_result_bytes,
            excerpt_bytes=self.excerpt_bytes,
            errors_maxlen=self.errors_maxlen,
            reply_streams=parse_patterns(self.reply_streams),
        )

    def consumer_config(self) -> ConsumerConfig:
        """The consumer settings of every work stream."""

        return ConsumerConfig(
            block_ms=self.block_ms,
            min_idle_ms=self.min_idle_ms,
            reclaim_interval_ms=max(50, min(5_000, self.min_idle_ms // 4)),
            max_deliveries=self.max_deliveries,
            concurrency=self.concurrency,
            trim_interval_ms=self.trim_interval_ms,
            retry_delay_s=min(1.0, self.min_idle_ms / 4000.0),
            dead_maxlen=self.errors_maxlen,
            excerpt_bytes=self.excerpt_bytes,
            delete_idle_consumers_ms=self.consumer_delete_idle_ms,
        )
