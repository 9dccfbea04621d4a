"""API keys of the HTTP gateway (pure): the keys file, hashing and checking a bearer key.

Keys are never stored: the keys file (mounted from a Secret) holds each key's SHA-256 and the
agents it may use. A key is a random token of at least 128 bits (``agentstream gateway-key``
makes one), so one unsalted SHA-256 is enough to keep it secret; the check compares digests in
constant time (:func:`hmac.compare_digest`).

The file is YAML or JSON::

    keys:
      - name: billing-backend          # shown in logs and in the cancels it makes
        sha256: 3a7bd3e2360a3d...      # sha256 of the key, hex
        agents: [demo, weather]        # the agents it may publish to and read; ["*"] = all
        backend: billing               # optional: only this backend's conversations

A key whose agents include ``*`` sees every conversation and the dead-letter streams, unless it
names a ``backend`` (one of ``AGENTSTREAM_BACKENDS``): such a key publishes to, reads and cancels
only that backend's conversations (trace ids that begin with ``<backend>:``) and names only its
replies streams, by the rule the agent loop applies to the backend's own streams
(:mod:`agentstream.wire.backends`), and never reads the dead letters.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from agentstream.errors import ConfigError
from agentstream.wire.backends import backend_name_problem, trace_refusal

ALL_AGENTS = "*"
KEY_PREFIX = "ask_"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class ApiKey:
    """One key's entry: its name, the SHA-256 of the key (hex), the agents it may use and the
    backend whose conversations it is confined to (None: any conversation of its agents)."""

    name: str
    sha256: str
    agents: frozenset[str]
    backend: str | None = None

    @property
    def all_agents(self) -> bool:
        """Whether the key may use every agent."""
        return ALL_AGENTS in self.agents

    @property
    def sees_everything(self) -> bool:
        """Whether the key may see every conversation and read the dead letters: every agent,
        no backend."""
        return self.all_agents and self.backend is None

    def trace_refusal(self, trace_id: str) -> str | None:
        """Why the key may not touch conversation ``trace_id`` by its backend, or None when it may
        (:func:`agentstream.wire.backends.trace_refusal`, the agent loop's rule)."""
        return trace_refusal(self.backend, trace_id, f"API key {self.name!r}")

    def may_use(self, agent: str) -> bool:
        """Whether the key may publish to and read conversations of ``agent``."""
        return self.all_agents or agent in self.agents

    def may_see(self, agents: Iterable[str]) -> bool:
        """Whether the key may see a conversation whose turns name ``agents`` (every one of them)."""
        return all(self.may_use(a) for a in agents)


def hash_key(key: str) -> str:
    """The SHA-256 of a key, hex (what the keys file stores)."""
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    """A fresh random key: ``ask_`` and 43 URL-safe characters (256 bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


class KeyRing:
    """The configured keys, looked up by the bearer token a request carries."""

    def __init__(self, keys: Sequence[ApiKey]):
        self.keys = list(keys)

    def find(self, token: str) -> ApiKey | None:
        """The key whose hash is the token's, or None (every entry is compared, in constant time)."""
        digest = hash_key(token)
        found = None
        for key in self.keys:
            if hmac.compare_digest(key.sha256, digest):
                found = key
        return found


def parse_keys(data: Any, *, source: str) -> KeyRing:
    """A parsed keys document (``{"keys": [...]}``, see the module docstring) → a :class:`KeyRing`.

    Raises:
        ConfigError: the document is not of that shape; the message names ``source`` and the
            entry that is wrong.
    """
    if not isinstance(data, Mapping) or not isinstance(data.get("keys"), list):
        raise ConfigError(f"{source}: expected an object with a list `keys` (see agentstream.ops.apikeys)")
    out: list[ApiKey] = []
    names: set[str] = set()
    for i, entry in enumerate(data["keys"]):
        where = f"{source}: keys[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where} is not an object")
        name, digest, agents = entry.get("name"), entry.get("sha256"), entry.get("agents")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError(f"{where}.name must be 1-64 letters, digits, '.', '_' or '-' (got {name!r})")
        if name in names:
            raise ConfigError(f"{where}.name {name!r} is used twice")
        if not isinstance(digest, str) or not _HEX64.match(digest.lower()):
            raise ConfigError(f"{where}.sha256 must be 64 hex digits, the SHA-256 of the key (never the key itself)")
        if not isinstance(agents, list) or not agents or not all(isinstance(a, str) and a for a in agents):
            raise ConfigError(f'{where}.agents must be a non-empty list of agent names (or ["*"])')
        backend = entry.get("backend")
        if backend is not None and backend_name_problem(backend) is not None:
            raise ConfigError(f"{where}.backend {backend!r} cannot name a backend: {backend_name_problem(backend)}")
        names.add(name)
        out.append(ApiKey(name=name, sha256=digest.lower(), agents=frozenset(agents), backend=backend))
    return KeyRing(out)


def load_keys(*, text: str | None = None, path: str | None = None) -> KeyRing:
    """The keys from a YAML/JSON document ``text`` and/or the file at ``path`` (both add up).

    Raises:
        ConfigError: neither is given, the file cannot be read, or a document is not valid.
    """
    if not text and not path:
        raise ConfigError(
            "the gateway has no API keys: set AGENTSTREAM_GATEWAY_KEYS_FILE (a keys file mounted from a "
            "Secret) or AGENTSTREAM_GATEWAY_KEYS (the same document inline); `agentstream gateway-key` makes one"
        )
    keys: list[ApiKey] = []
    for source, document in _documents(text, path):
        try:
            data = yaml.safe_load(document)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{source} is not valid YAML/JSON: {exc}") from exc
        keys.extend(parse_keys(data, source=source).keys)
    names = [k.name for k in keys]
    if len(names) != len(set(names)):
        raise ConfigError("a key name is used both in AGENTSTREAM_GATEWAY_KEYS and in AGENTSTREAM_GATEWAY_KEYS_FILE")
    return KeyRing(keys)


def _documents(text: str | None, path: str | None) -> list[tuple[str, str]]:
    out = []
    if text:
        out.append(("AGENTSTREAM_GATEWAY_KEYS", text))
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                out.append((f"keys file {path}", f.read()))
        except OSError as exc:
            raise ConfigError(
                f"cannot read the gateway keys file {path} (AGENTSTREAM_GATEWAY_KEYS_FILE): {exc}"
            ) from exc
    return out
