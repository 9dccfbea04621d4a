"""The import rules of the layers (docs/contributing.md, "Layout"; the package docstring of :mod:`agentstream`).

Read from the source with :mod:`ast` (no module is imported), so a rule broken anywhere in a
module (a function's lazy import, a ``TYPE_CHECKING`` block) fails here:

- the library is a stack of folders, :data:`LAYERS`, bottom first; a module imports only from its
  own layer or the layers below it (a function's lazy import included), so no folder imports
  upward and no two folders import each other; a type-only import (``if TYPE_CHECKING:``) loads
  nothing, and an upward one is listed in :data:`TYPE_ONLY_UPWARD` with its reason;
- the pure layers (the wire, the declarations, the context library, the step decision and fold)
  import neither ``redis`` nor ``asyncio``, and nothing of the runtime, the CLI or the services,
  directly or through the modules they import; and, imported in a fresh interpreter, they and
  the model formats load no ``asyncio``, ``redis`` or ``httpx``;
- the wire imports only the wire and :mod:`agentstream.errors`;
- only the runtime imports ``redis`` (:data:`REDIS_OUTSIDE_RUNTIME` is empty and stays so);
- the services import the runtime and the pure layers, never ``redis``;
- only the runtime sends Redis commands: no module outside it calls a Redis client's command
  methods (:data:`REDIS_COMMANDS`; the generic ones of :data:`CLIENT_COMMANDS` on a receiver named
  like a client; :data:`COMMANDS_OUTSIDE_RUNTIME` is empty and stays so), the services none at all;
- no module imports, directly or through others, a module that imports it back.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {"agentstream": ROOT / "shared/agentstream", "agentstream_services": ROOT / "services"}

PURE = ("agentstream.wire", "agentstream.declarations", "agentstream.context", "agentstream.steps")
UPPER = ("agentstream.runtime", "agentstream.cli", "agentstream_services")
REDIS_OUTSIDE_RUNTIME: set[str] = set()
"""Modules outside the runtime that still import ``redis`` (none: keep it so; code outside the
runtime names its client :data:`agentstream.runtime.connection.RedisClient` and catches
:data:`agentstream.runtime.connection.REDIS_ERROR`)."""


def _modules() -> dict[str, Path]:
    found = {}
    for top, base in SOURCES.items():
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([top, *parts])] = path
    return found


MODULES = _modules()


def _type_only(tree: ast.Module) -> set[int]:
    """The ids of the import statements of ``tree`` inside an ``if TYPE_CHECKING:`` block."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            found.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return found


def _imports(name: str, *, loaded_only: bool = False) -> tuple[set[str], set[str]]:
    """(the agentstream modules ``name`` imports, the outside top-level packages it imports);
    with ``loaded_only``, without the imports of ``if TYPE_CHECKING:`` blocks (they load nothing)."""
    tree = ast.parse(MODULES[name].read_text())
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    skipped = _type_only(tree) if loaded_only else set()
    inside, outside = set(), set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            targets = [
                f"{module}.{alias.name}" if f"{module}.{alias.name}" in MODULES else module for alias in node.names
            ]
        else:
            continue
        for target in targets:
            if target.split(".")[0] in SOURCES:
                # importing a.b.c runs a and a.b first
                parts = target.split(".")
                # (the root package, the public API, is left out: it imports every layer)
                inside.update(".".join(parts[:i]) for i in range(2, len(parts) + 1) if ".".join(parts[:i]) in MODULES)
            else:
                outside.add(target.split(".")[0])
    inside.discard(name)
    return inside, outside


GRAPH = {name: _imports(name) for name in MODULES}
LOADED = {name: _imports(name, loaded_only=True)[0] for name in MODULES}
"""The agentstream modules each module loads when it runs (its imports outside ``TYPE_CHECKING``)."""


def _closure(name: str) -> set[str]:
    seen, todo = set(), [name]
    while todo:
        for dep in GRAPH[todo.pop()][0]:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def _in(name: str, layers: tuple[str, ...]) -> bool:
    return any(name == layer or name.startswith(layer + ".") for layer in layers)


PURE_MODULES = sorted(name for name in MODULES if _in(name, PURE))

LAYERS: tuple[tuple[str, ...], ...] = (
    ("agentstream.errors",),
    ("agentstream.wire",),
    ("agentstream.ops",),
    ("agentstream.declarations",),
    ("agentstream.context",),
    ("agentstream.models",),
    ("agentstream.delegation",),
    ("agentstream.steps",),
    ("agentstream.runtime",),
    ("agentstream.agent_loop",),
    ("agentstream.mcp_tools",),
    ("agentstream.app",),
    ("agentstream_services",),
    ("agentstream.cli", "agentstream.testing", "agentstream.demo", "agentstream.__main__"),
)
"""The folders of the library, bottom first: the wire; operations (settings, logs, metrics,
tracing: leaves every layer may use); what an app declares; the pure core (the context library,
the model formats and adapters, subagents, the step decision and fold); the runtime on Redis;
the agent loop (admission, the lease loop, applying a step's effects); MCP servers' tools;
running an app (tools in threads, loading it); the services; then what sits on top of everything
(the CLI, the testing kit, the demo app). The root package, the public API, imports lazily from
any layer and is left out."""

TYPE_ONLY_UPWARD: dict[tuple[str, str], str] = {
    ("agentstream.declarations.agents", "agentstream.context.limits"): "Agent's model_limits field is a ModelLimits",
    ("agentstream.declarations.agents", "agentstream.context.render"): "Agent's context field is a ContextConfig",
    ("agentstream.declarations.agents", "agentstream.context"): "the package of the two above",
}
"""Type-only imports (``if TYPE_CHECKING:``) that name a type of a higher layer: (module, what it
names) → why. They load nothing; keep the list short."""


def _layer(name: str) -> int:
    for index, layer in enumerate(LAYERS):
        if _in(name, layer):
            return index
    raise AssertionError(f"{name} is in no layer: add its folder to LAYERS")


def _folder(name: str) -> str:
    parts = name.split(".")
    return parts[0] if parts[0] == "agentstream_services" else ".".join(parts[:2])


LAYERED = sorted(name for name in MODULES if name != "agentstream")


@pytest.mark.parametrize("name", LAYERED)
def test_a_module_loads_only_its_own_layer_and_those_below(name: str) -> None:
    upward = sorted(dep for dep in LOADED[name] if dep != "agentstream" and _layer(dep) > _layer(name))
    assert not upward, f"{name} (layer {LAYERS[_layer(name)]}) imports upward: {upward}"


@pytest.mark.parametrize("name", LAYERED)
def test_a_type_only_import_upward_is_listed(name: str) -> None:
    type_only = GRAPH[name][0] - LOADED[name]
    upward = {dep for dep in type_only if dep != "agentstream" and _layer(dep) > _layer(name)}
    unlisted = sorted(dep for dep in upward if (name, dep) not in TYPE_ONLY_UPWARD)
    assert not unlisted, f"{name} names types of a higher layer: {unlisted} (import them where they belong)"


def test_the_type_only_list_is_current() -> None:
    stale = sorted(pair for pair in TYPE_ONLY_UPWARD if pair[1] not in GRAPH[pair[0]][0] - LOADED[pair[0]])
    assert not stale, f"no longer type-only imports (drop them from TYPE_ONLY_UPWARD): {stale}"


def test_no_two_folders_import_each_other() -> None:
    # the folders' graph (by what loads, through any module) has no cycle, however long
    edges: dict[str, set[str]] = {}
    for name in LAYERED:
        for dep in LOADED[name]:
            if dep != "agentstream" and _folder(dep) != _folder(name):
                edges.setdefault(_folder(name), set()).add(_folder(dep))

    def reaches(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    cycles = sorted(folder for folder in edges if folder in reaches(folder))
    assert not cycles, f"folders that import themselves back through others: {cycles}"


def test_pure_modules_reach_only_pure_layers_and_below() -> None:
    top = _layer("agentstream.steps")
    for name in PURE_MODULES:
        reached = sorted(dep for dep in _closure(name) if dep != "agentstream" and _layer(dep) > top)
        assert not reached, f"{name} (a pure layer) reaches, directly or not, {reached}"


LOAD_CHECKED = (
    "agentstream.wire",
    "agentstream.declarations",
    "agentstream.context",
    "agentstream.steps",
    "agentstream.models.formats",
    "agentstream.models.openai_format",
    "agentstream.models.anthropic_format",
)


@pytest.mark.parametrize("package", LOAD_CHECKED)
def test_importing_the_pure_layers_loads_no_asyncio_redis_or_httpx(package: str) -> None:
    # every module of the package, in a fresh interpreter: what it loads, not what it says
    modules = [name for name in MODULES if _in(name, (package,))]
    script = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in ('asyncio', 'redis', 'httpx') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", f"importing {package} loads {out.stdout.strip()}"


def test_the_layers_exist() -> None:
    for layer in (*PURE, "agentstream.runtime", "agentstream.app", "agentstream.ops", "agentstream.cli"):
        assert layer in MODULES, f"{layer} is missing: the layout changed without this test"


@pytest.mark.parametrize("name", PURE_MODULES)
def test_pure_modules_import_no_redis_no_asyncio(name: str) -> None:
    outside = GRAPH[name][1]
    assert not outside & {"redis", "asyncio"}, f"{name} (a pure layer) imports {sorted(outside & {'redis', 'asyncio'})}"


@pytest.mark.parametrize("name", PURE_MODULES)
def test_pure_modules_reach_no_runtime(name: str) -> None:
    reached = sorted(dep for dep in _closure(name) if _in(dep, UPPER))
    assert not reached, f"{name} (a pure layer) imports, directly or not, {reached}"


def test_the_wire_imports_only_the_wire_and_errors() -> None:
    for name in MODULES:
        if _in(name, ("agentstream.wire",)):
            other = sorted(dep for dep in GRAPH[name][0] if not _in(dep, ("agentstream.wire", "agentstream.errors")))
            assert not other, f"{name} (the wire) imports {other}"


def test_only_the_runtime_imports_redis() -> None:
    importers = {name for name, (_, outside) in GRAPH.items() if "redis" in outside and name.startswith("agentstream.")}
    outside_runtime = {name for name in importers if not _in(name, ("agentstream.runtime",))}
    assert outside_runtime <= REDIS_OUTSIDE_RUNTIME, (
        f"imports redis outside the runtime: {sorted(outside_runtime - REDIS_OUTSIDE_RUNTIME)}"
    )
    assert outside_runtime == REDIS_OUTSIDE_RUNTIME, (
        f"no longer import redis (drop them from the list): {sorted(REDIS_OUTSIDE_RUNTIME - outside_runtime)}"
    )


SERVICES_IMPORTING_REDIS: set[str] = set()
"""Services that still import ``redis`` (none: keep it so; a Redis command a service needs is a
named operation of :mod:`agentstream.runtime`)."""


def test_services_never_import_redis() -> None:
    offenders = {
        name for name, (_, outside) in GRAPH.items() if name.startswith("agentstream_services") and "redis" in outside
    }
    assert offenders <= SERVICES_IMPORTING_REDIS, (
        f"services import redis (use a runtime operation instead): {sorted(offenders - SERVICES_IMPORTING_REDIS)}"
    )
    assert offenders == SERVICES_IMPORTING_REDIS, (
        f"no longer import redis (drop them from the list): {sorted(SERVICES_IMPORTING_REDIS - offenders)}"
    )


def test_no_import_cycles() -> None:
    # package __init__ edges are left out: a package importing its own submodules is not a cycle
    def deps(name: str) -> set[str]:
        return {d for d in GRAPH[name][0] if MODULES[d].name != "__init__.py"}

    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in deps(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for name in MODULES:
        if name not in index:
            visit(name)
    assert not cycles, f"import cycles: {cycles}"


REDIS_COMMANDS = frozenset(
    """
    pipeline register_script eval evalsha eval_ro evalsha_ro fcall execute_command script_load script_exists
    multi transaction
    xadd xread xreadgroup xrange xrevrange xack xclaim xautoclaim xpending xpending_range xdel xtrim xlen
    xgroup_create xgroup_createconsumer xgroup_destroy xgroup_delconsumer xgroup_setid
    xinfo_stream xinfo_groups xinfo_consumers
    hset hget hmget hgetall hdel hexists hsetnx hincrby hkeys hvals hlen hscan hscan_iter
    sadd srem sismember smembers scard zadd zrem zrange zrangebyscore zremrangebyscore zscore zcard
    pttl pexpire persist incr incrby decr mget mset setnx getdel unlink scan scan_iter flushdb flushall
    publish pubsub subscribe psubscribe
""".split()
)
"""redis-py command methods (streams, hashes, sets, sorted sets, scripts, pipelines) whose names
say Redis wherever they are called."""

CLIENT_COMMANDS = frozenset({"set", "get", "delete", "exists", "ping", "expire", "ttl", "type", "keys", "info"})
"""redis-py command methods whose names other objects share (a dict's ``get``, the store's
``exists``): counted only on a receiver named like a client (``redis``, ``self.redis``,
``store.redis``, ``pipe``...)."""

COMMANDS_OUTSIDE_RUNTIME: set[str] = set()
"""Modules outside the runtime that still send Redis commands (none: keep it so; a command a
module needs is a named operation of :mod:`agentstream.runtime`)."""


def _receiver(node: ast.expr) -> str:
    """The last name of a call's receiver: ``redis`` for ``self.store.redis.xadd``."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _commands_in(source: str) -> list[str]:
    """Where ``source`` calls a Redis client's command method: ``["<line>: <call>"]``, in line order."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method, receiver = node.func.attr, _receiver(node.func.value).lower()
            if method in REDIS_COMMANDS or (method in CLIENT_COMMANDS and ("redis" in receiver or "pipe" in receiver)):
                out.append((node.lineno, f"{node.lineno}: {ast.unparse(node.func)}"))
    return [text for _, text in sorted(out)]


def _commands_sent(name: str) -> list[str]:
    return _commands_in(MODULES[name].read_text())


COMMANDS = {
    name: sent for name in MODULES if not _in(name, ("agentstream.runtime",)) and (sent := _commands_sent(name))
}


def test_only_the_runtime_sends_redis_commands() -> None:
    senders = set(COMMANDS)
    new = {name: COMMANDS[name] for name in sorted(senders - COMMANDS_OUTSIDE_RUNTIME)}
    assert not new, (
        f"send Redis commands outside the runtime (make them named operations of agentstream.runtime): {new}"
    )
    assert senders == COMMANDS_OUTSIDE_RUNTIME, (
        f"no longer send Redis commands (drop them from the list): {sorted(COMMANDS_OUTSIDE_RUNTIME - senders)}"
    )


def test_services_send_no_redis_commands() -> None:
    offenders = {name: sent for name, sent in COMMANDS.items() if name.startswith("agentstream_services")}
    assert not offenders, f"services send Redis commands (use a named operation of agentstream.runtime): {offenders}"


def test_the_command_check_sees_commands() -> None:
    # the rule is a reading of the source: it must see a pipeline, a script, a stream command on
    # any receiver and a generic command on a client, and leave a dict's get alone
    source = (
        "async def f(self, pipe, d):\n"
        "    p = self.redis.pipeline(transaction=False)\n"
        "    self.redis.register_script('return 1')\n"
        "    pipe.xadd('s', {'f': b'v'})\n"
        "    await self.store.redis.get('k')\n"
        "    d.get('k')\n"
        "    self.store.exists('t')\n"
    )
    sent = _commands_in(source)
    assert [s.split(": ", 1)[1] for s in sent] == [
        "self.redis.pipeline",
        "self.redis.register_script",
        "pipe.xadd",
        "self.store.redis.get",
    ]
