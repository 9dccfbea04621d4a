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
- ``AGENTSTREAM_NAMESPACE``: prefix of every Redis key (default ``agentstream``).
- ``AGENTSTREAM_CONSUMER``: this process's consumer name in its groups (default host-pid).
- ``AGENTSTREAM_BLOCK_MS``: how long one blocking read waits, in milliseconds.
- ``AGENTSTREAM_MIN_IDLE_MS``: a pending entry idle this long is claimed from its (dead) consumer.
- ``AGENTSTREAM_MAX_DELIVERIES``: real deliveries (handler starts; re-reads and claim renewals
  do not count) after which an entry goes to the dead-letter stream and its turn ends with a
  reason. Keep it at 2 or more: a job running beside one that kills its worker loses a start too.
- ``AGENTSTREAM_CONCURRENCY``: entries one consumer handles at the same time.
- ``AGENTSTREAM_LEASE_TTL_MS``: the agent loop's lease on a trace, renewed while held.
- ``AGENTSTREAM_MODEL_TIMEOUT_S``: one model HTTP request's timeout, in seconds.
- ``AGENTSTREAM_MODEL_RETRIES``: retries of a failed model request (network, 408/409/429/5xx).
- ``AGENTSTREAM_METRICS_PORT``: the port of /metrics, /healthz and /readyz (0 = off).
- ``AGENTSTREAM_METRICS_INTERVAL_S``: how often stream length, pending entries and lag are read.
- ``AGENTSTREAM_SHUTDOWN_GRACE_S``: how long a service drains on SIGTERM, in seconds.
- ``AGENTSTREAM_BUSY_POLICY``: what a turn published on a busy conversation does: ``queue``
  (default: it waits behind the running turn), ``reject`` (it fails at once with code ``busy``)
  or ``interrupt`` (the running turn is cancelled, then the new one runs).
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

The API key is a ``SecretStr``: it never appears in a repr, a log or a trace.
"""

from __future__ import annotations

import os
import socket
from functools import cached_property
from typing import TYPE_CHECKING, Literal

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from agentstream.keys import DEFAULT_NAMESPACE, Keys

if TYPE_CHECKING:
    from agentstream.consumer import ConsumerConfig


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
    namespace: str = DEFAULT_NAMESPACE
    consumer: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    block_ms: int = Field(default=2000, ge=10)
    min_idle_ms: int = Field(default=60_000, ge=10)
    max_deliveries: int = Field(default=5, ge=1)
    concurrency: int = Field(default=16, ge=1)
    lease_ttl_ms: int = Field(default=30_000, ge=1000)
    model_timeout_s: float = Field(default=120.0, gt=0)
    model_retries: int = Field(default=2, ge=0)
    metrics_port: int = Field(default=0, ge=0, le=65535)
    metrics_interval_s: float = Field(default=15.0, gt=0)
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    busy_policy: Literal["queue", "reject", "interrupt"] = "queue"
    trim_interval_ms: int = Field(default=60_000, ge=0)
    trace_retention_s: float | None = Field(default=None, gt=0)
    max_descendants: int = Field(default=100, ge=1)
    supervise_interval_ms: int = Field(default=1000, ge=10)
    compaction_model: str | None = None

    @cached_property
    def keys(self) -> Keys:
        return Keys(self.namespace)

    def consumer_config(self) -> "ConsumerConfig":
        """The consumer settings of every work stream."""
        from agentstream.consumer import ConsumerConfig

        return ConsumerConfig(
            block_ms=self.block_ms,
            min_idle_ms=self.min_idle_ms,
            reclaim_interval_ms=max(50, min(5_000, self.min_idle_ms // 4)),
            max_deliveries=self.max_deliveries,
            concurrency=self.concurrency,
            trim_interval_ms=self.trim_interval_ms,
            retry_delay_s=min(1.0, self.min_idle_ms / 4000.0),
        )
