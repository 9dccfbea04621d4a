"""The CLI's failures are one clean line and exit code 2; `trace verify` and `trace explain`
rebuild with the configured endpoint settings and agree; `agentstream dev` prints what another
shell needs; `ask` rides out a Redis restart."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis.exceptions
from typer.testing import CliRunner

from agentstream.cli import commands as cli_module
from agentstream.cli.commands import cli, environment_lines
from agentstream.models import formats
from agentstream.models.endpoints import ModelEndpoint, Quirks
from agentstream.runtime.deltas import follow
from agentstream.steps.summarising import sent_request
from agentstream.wire import codec
from agentstream.wire.events import ModelOutput, ToolCall, ToolOutput, TurnEnded, TurnInput
from agentstream.wire.keys import Keys
from tests.support import apps

pytestmark = pytest.mark.integration

APP = ["--app", "tests.support.apps:app"]


def invoke(args, env):
    result = CliRunner().invoke(cli, args, env=env)
    return result


@pytest.mark.parametrize(
    "command", [["trace", "show", "x"], ["trace", "verify", "x", *APP], ["trace", "explain", "x", "--step", "0", *APP]]
)
@pytest.mark.parametrize(
    "url, says",
    [
        (None, "REDIS_URL is not set"),
        ("not-a-url", "is not a Redis URL"),
        ("redis://127.0.0.1:notaport", "is not a Redis URL"),
        ("redis://:hunter2@127.0.0.1:1", "cannot reach Redis at redis://:***@127.0.0.1:1"),
    ],
)
def test_trace_commands_fail_with_one_line_when_redis_is_not_reachable(command, url, says, monkeypatch, tmp_path):
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("AGENTSTREAM_DATA_DIR", raising=False)
    # no REDIS_URL and an empty cache: no embedded Redis data to read either
    result = invoke(
        command, {"REDIS_URL": url, "XDG_CACHE_HOME": str(tmp_path)} if url else {"XDG_CACHE_HOME": str(tmp_path)}
    )
    assert result.exit_code == 2, result.output
    assert says in result.output and "Traceback" not in result.output
    assert "hunter2" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_verify_of_a_missing_trace_fails_like_show(redis_url, namespace):
    env = {"REDIS_URL": redis_url, "AGENTSTREAM_NAMESPACE": namespace}
    for command in (["trace", "show", "nope"], ["trace", "verify", "nope", *APP]):
        result = invoke(command, env)
        assert result.exit_code == 2 and "trace 'nope' has no events" in result.output, result.output


def test_bad_option_values_are_refused():
    assert invoke(["ask", "hi", "--timeout-s", "0"], {}).exit_code == 2
    assert invoke(["ask", "hi", "--timeout-s", "-5"], {}).exit_code == 2
    result = invoke(["serve", "tool-worker", "--queue", ""], {"COLUMNS": "200"})  # one line: the message is not wrapped
    assert result.exit_code == 2 and "queue name cannot be empty" in result.output


REFUSED_ARGUMENTS = [  # (command line, what the one line must name)
    (["partition", ""], "a trace id cannot be empty"),
    (["partition", "   "], "a trace id cannot be empty"),
    (["partition", "a\u202eb"], "a trace id may not hold U+202E"),
    (["cancel", ""], "a trace id cannot be empty"),
    (["cancel", "c1", "--turn-id", " "], "a turn id cannot be empty"),
    (["cancel", "c1", "--by", ""], "who asks (--by) cannot be empty"),
    (["cancel", "c1", "--wait-s", "-1"], "'--wait-s'"),
    (["ask", ""], "the message cannot be empty"),
    (["ask", "hi", "--agent", " "], "an agent name cannot be empty"),
    (["ask", "hi", "--trace-id", ""], "a trace id cannot be empty"),
    (["ask", "hi", "--timeout-s", "-5"], "'--timeout-s'"),
    (["run", "hi", "--app", ""], "the app path cannot be empty"),
    (["trace", "verify", "c1", "--app", " "], "the app path cannot be empty"),
    (["run", "--turns", "0"], "'--turns'"),
    (["run", "--turns", "-3"], "'--turns'"),
    (["run", "hi", "--agent", ""], "an agent name cannot be empty"),
    (["trace", "show", ""], "a trace id cannot be empty"),
    (["trace", "verify", "\t"], "a trace id cannot be empty"),
    (["trace", "explain", "c1", "--step", "-1"], "'--step'"),
    (["trace", "explain", "c1", "--step", "0", "--turn", ""], "a turn id cannot be empty"),
    (["trace", "explain", "c1", "--step", "0", "--turn-id", ""], "a turn id cannot be empty"),
    (["serve", "tool-worker", "--queue", ""], "a tool queue name cannot be empty"),
    (["serve", "tool-worker", "--queue", "a", "--queue", " "], "a tool queue name cannot be empty"),
    (["gateway-key", "--name", "", "--agent", "demo"], "a key name cannot be empty"),
    (["gateway-key", "--name", "k", "--agent", " "], "an agent name cannot be empty"),
    (["prompt", ""], "the prompt file cannot be empty"),
    (["prompt", "p", "--var", "=x"], "NAME=VALUE"),
    (["prompt", "p", "--var", "novalue"], "NAME=VALUE"),
    # the wire's one rule for ids (AGENTSTREAM_MAX_ID_BYTES, in UTF-8 bytes), before anything is published
    (["ask", "hi", "--trace-id", "x" * 600], "a trace id is 600 bytes, over the limit AGENTSTREAM_MAX_ID_BYTES=256"),
    (["ask", "hi", "--trace-id", "é" * 200], "a trace id is 400 bytes"),
    (["ask", "hi", "--trace-id", "a}b"], "a trace id cannot name a trace"),
    (["ask", "hi", "--agent", "a" * 300], "an agent name is 300 bytes"),
    (["fork", "c1", "--turn", "t1", "--to", "é" * 200], "'--to': a fork id is 400 bytes"),
    (["fork", "c1", "--turn", "t1", "--step", "0", "--to", "f" * 300], "a fork id is 300 bytes"),
    (["fork", "c1", "--turn", "t" * 300], "'--turn': a turn id is 300 bytes"),
    (["approve", "c1", "c" * 300], "a call id is 300 bytes"),
    (["deny", "x" * 300, "c1"], "a trace id is 300 bytes"),
    (["cancel", "x" * 300], "a trace id is 300 bytes"),
    (["cancel", "c1", "--turn-id", "t" * 300], "'--turn-id': a turn id is 300 bytes"),
    (["trace", "show", "x" * 10_000], "a trace id is 10,000 bytes"),
    (["trace", "explain", "c1", "--step", "0", "--turn-id", "t" * 300], "a turn id is 300 bytes"),
    (["partition"], "Missing argument"),
    (["partition", "c1", "--bogus"], "No such option"),
]


@pytest.mark.parametrize("args, says", REFUSED_ARGUMENTS, ids=[" ".join(a)[:60] or "-" for a, _ in REFUSED_ARGUMENTS])
def test_empty_blank_and_out_of_range_arguments_are_refused_in_one_line_with_exit_code_2(
    args, says, capsys, monkeypatch
):
    """Empty or blank ids, names and messages, ids with control characters, negative or zero
    counts: refused by the parsing library before anything runs (no Redis is asked), as one line
    on stderr that names the argument, exit code 2."""
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1")  # nothing may get as far as connecting
    with pytest.raises(SystemExit) as exited:
        cli_module.main(args)
    out, err = capsys.readouterr()
    assert exited.value.code == 2, (out, err)
    assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert says in err and "--help" in err, err


async def test_ask_with_a_trace_id_over_the_wire_limit_fails_at_once_and_publishes_nothing(
    redis_url, namespace, redis, keys, capsys, monkeypatch
):
    """It published, waited 300 s and asked whether the agent loop ran, while the agent loop had
    refused the turn at once. The command checks with the wire's rule and the configured limit."""
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("AGENTSTREAM_NAMESPACE", namespace)
    with pytest.raises(SystemExit) as exited:
        await asyncio.to_thread(cli_module.main, ["ask", "--agent", "calc", "--trace-id", "x" * 600, "hi"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "'--trace-id'" in err and "AGENTSTREAM_MAX_ID_BYTES=256" in err, err
    assert await redis.xlen(keys.turns) == 0 and await redis.xlen(keys.errors) == 0
    monkeypatch.setenv("AGENTSTREAM_MAX_ID_BYTES", "128")  # the configured limit
    with pytest.raises(SystemExit) as exited:
        await asyncio.to_thread(cli_module.main, ["ask", "--agent", "calc", "--trace-id", "x" * 200, "hi"])
    assert exited.value.code == 2 and "AGENTSTREAM_MAX_ID_BYTES=128" in capsys.readouterr().err


def test_good_arguments_still_pass_and_help_is_not_an_error(capsys, monkeypatch):
    monkeypatch.delenv("AGENTSTREAM_PARTITIONS", raising=False)
    with pytest.raises(SystemExit) as exited:
        cli_module.main(["partition", "conv-42"])
    assert exited.value.code == 0 and "partition 0 of 1" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:
        cli_module.main(["partition", "--help"])
    assert exited.value.code == 0 and "trace" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:
        cli_module.main(["trace"])  # a group alone: its help, exit code 2 as before
    assert exited.value.code == 2 and "show" in capsys.readouterr().out


LLAMA_LIKE = Quirks(tool_call_content="null", required_tool_choice="named", stream_tools="forced")


async def test_explain_and_verify_rebuild_with_the_configured_endpoint_and_agree(store, redis_url, namespace):
    options = {"stream": False, "window_tokens": 16000, "quirks": LLAMA_LIKE.model_dump(exclude_defaults=True)}
    endpoint = ModelEndpoint(
        id="default",
        provider="openai",
        base_url="http://127.0.0.1:9/v1",
        model="m",
        stream=False,
        window_tokens=16000,
        quirks=LLAMA_LIKE,
    )
    calc = apps.app.agent("calc")
    from agentstream.delegation import offered_agent

    turn = TurnInput(turn_id="t1", agent="calc", text="what is 2 + 3?")
    agent = offered_agent(calc, turn, {"default": endpoint})
    events: list = [turn]
    for step, output in enumerate(
        [
            ModelOutput(
                turn_id="t1",
                step=0,
                tool_calls=(ToolCall(id="c1", name="calculator", arguments='{"expression": "2+3"}'),),
            ),
            ModelOutput(turn_id="t1", step=1, content="5"),
        ]
    ):
        body = formats.request_body(sent_request(events, agent, turn_id="t1", step=step), endpoint)
        events.append(
            type(output)(
                **{
                    **{f: getattr(output, f) for f in output.__struct_fields__},
                    "request_sha256": formats.fingerprint(body),
                }
            )
        )
        if step == 0:
            events.append(ToolOutput(turn_id="t1", call_id="c1", name="calculator", text="5"))
    events.append(TurnEnded(turn_id="t1", answer="5"))
    for event in events:
        await store.append("q", event)
    env = {
        "REDIS_URL": redis_url,
        "AGENTSTREAM_NAMESPACE": namespace,
        "OPENAI_BASE_URL": endpoint.base_url,
        "OPENAI_MODEL": "m",
        "AGENTSTREAM_DEFAULT_MODEL_OPTIONS": json.dumps(options),
    }
    verified = await asyncio.to_thread(invoke, ["trace", "verify", "q", *APP], env)
    assert verified.exit_code == 0, verified.output
    explained = await asyncio.to_thread(invoke, ["trace", "explain", "q", "--step", "1", "--turn-id", "t1", *APP], env)
    assert explained.exit_code == 0 and " matches the recorded" in explained.output, explained.output
    assert '"content": null' in explained.output  # the body as sent (the endpoint's quirk), not the default one

    # without the quirks, both say so, and which settings they used
    plain = {k: v for k, v in env.items() if k != "AGENTSTREAM_DEFAULT_MODEL_OPTIONS"}
    verified = await asyncio.to_thread(invoke, ["trace", "verify", "q", *APP], plain)
    assert verified.exit_code == 1 and "rebuilt with endpoint 'default'" in verified.output, verified.output
    assert "AGENTSTREAM_DEFAULT_MODEL_OPTIONS" in verified.output
    explained = await asyncio.to_thread(invoke, ["trace", "explain", "q", "--step", "1", "--turn", "t1", *APP], plain)
    assert "DOES NOT match" in explained.output and "quirks default" in explained.output, explained.output


def test_dev_prints_the_environment_another_shell_needs(monkeypatch, redis_url, scripted_model):
    served = []

    async def no_services(services, app_path, queues, settings, **_):
        served.append(settings)

    monkeypatch.setattr(cli_module, "_serve", no_services)
    options = json.dumps({"quirks": {"tool_call_content": "null"}})
    env = {
        "REDIS_URL": redis_url,
        "OPENAI_BASE_URL": scripted_model.base_url,  # it answers: dev checks that before it starts
        "OPENAI_MODEL": "smol model",
        "AGENTSTREAM_DEFAULT_MODEL_OPTIONS": options,
    }
    result = invoke(["dev", *APP], env)
    assert result.exit_code == 0 and served, result.output
    lines = result.output.splitlines()
    assert f"export REDIS_URL={redis_url}" in lines
    assert f"export OPENAI_BASE_URL={scripted_model.base_url}" in lines
    assert "export OPENAI_MODEL='smol model'" in lines
    assert f"export AGENTSTREAM_DEFAULT_MODEL_OPTIONS='{options}'" in lines
    assert environment_lines({"REDIS_URL": "redis://x"}) == ["export REDIS_URL=redis://x"]


class FlakyRedis:
    """A client whose reads fail (a Redis restart) before they return the turn's ending."""

    def __init__(self, keys: Keys, trace_id: str, failures: int):
        self.keys, self.trace_id, self.failures, self.reads = keys, trace_id, failures, 0

    async def xread(self, positions, block, count):
        self.reads += 1
        if self.reads <= self.failures:
            raise redis.exceptions.ConnectionError("Connection refused")
        assert positions[self.keys.trace(self.trace_id)] == "5-0"  # the same position after the outage
        return [
            (
                self.keys.trace(self.trace_id).encode(),
                [(b"6-0", codec.encode_entry(TurnEnded(turn_id="t", answer="ok")))],
            )
        ]


async def test_following_a_turn_rides_out_a_redis_restart():
    keys = Keys("k")
    flaky = FlakyRedis(keys, "c", failures=3)
    items = []
    async for item in follow(flaky, keys, "c", after="5-0", block_ms=10, outage_s=30):  # type: ignore[arg-type]
        items.append(item)
        break
    assert isinstance(items[0].event, TurnEnded) and flaky.reads == 4
    with pytest.raises(redis.exceptions.ConnectionError):  # without outage_s, as before: the error at once
        async for _ in follow(FlakyRedis(keys, "c", failures=3), keys, "c", after="5-0", block_ms=10):  # type: ignore[arg-type]
            pass


async def test_trace_show_writes_terminal_controls_of_a_published_turn_as_escapes(redis_url, namespace, store):
    """A client's text holding an OSC sequence (retitles the terminal), CSI (clears it), BEL, NUL
    and a bidi override is shown escaped, never sent raw to the reader's terminal."""
    hostile = "Please wait.\x1b]0;pwned\x07 \x1b[2J \x00 \u202eevil"
    await store.append("esc-1", TurnInput(turn_id="t1", agent="calc", text=hostile))
    result = await asyncio.to_thread(
        invoke, ["trace", "show", "esc-1"], {"REDIS_URL": redis_url, "AGENTSTREAM_NAMESPACE": namespace}
    )
    assert result.exit_code == 0, result.output
    assert not any(c in result.output for c in "\x1b\x07\x00\u202e"), repr(result.output)
    assert "\\x1b]0;pwned\\x07" in result.output and "\\u202eevil" in result.output


def test_a_followed_turn_prints_terminal_controls_as_escapes():
    from agentstream.cli.watch import TurnPrinter, terminal_safe

    printed: list[str] = []
    printer = TurnPrinter("t1", lambda text="", **_: printed.append(text), describe=lambda e: e.text)
    printer.on_event(TurnInput(turn_id="t1", agent="calc", text="hi\x1b[31mred\x9b"))
    assert printed == ["hi\\x1b[31mred\\x9b"]
    assert (
        terminal_safe("line one\n\tline two, café, 日本, 👨\u200d👩\u200d👧")
        == "line one\n\tline two, café, 日本, 👨\u200d👩\u200d👧"
    )


@pytest.mark.slow
def test_an_unexpected_error_is_one_line_and_exit_code_1_with_the_traceback_at_log_level_debug(
    tmp_path, capsys, monkeypatch
):
    """A data folder whose append-only file is not Redis's (the embedded Redis does not start on
    it): not a usage error anyone foresaw, yet one line `error: unexpected ...`, exit code 1; at
    log level debug the traceback comes first."""
    (tmp_path / "appendonly.aof").write_bytes(b"\x00\xffnot an append-only file\n" * 20)
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("AGENTSTREAM_LOG_LEVEL", raising=False)
    with pytest.raises(SystemExit) as exited:
        cli_module.main(["trace", "show", "x", "--data-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert exited.value.code == 1, (out, err)
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: unexpected "), err
    assert "AGENTSTREAM_LOG_LEVEL=debug shows the traceback" in err and "Traceback" not in err
    monkeypatch.setenv("AGENTSTREAM_LOG_LEVEL", "debug")
    with pytest.raises(SystemExit) as exited:
        cli_module.main(["trace", "show", "x", "--data-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert exited.value.code == 1 and err.startswith("Traceback (most recent call last)"), err
    assert err.strip().splitlines()[-1].startswith("error: unexpected "), err


def test_an_app_factory_that_raises_is_a_configuration_error(tmp_path, capsys, monkeypatch):
    (tmp_path / "factoryapp.py").write_text("def make():\n    raise KeyError('REDIS_URL')\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        cli_module.main(["schema", "turn", "--app", "factoryapp:make"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.startswith(
        "error: app factory 'factoryapp:make' failed: KeyError: 'REDIS_URL'"
    ), err


def test_gateway_key_with_a_backend_writes_a_key_the_gateway_confines_to_that_backend(tmp_path, capsys, monkeypatch):
    """Written where AGENTSTREAM_BACKENDS is not set (a workstation), with a warning that the
    services must name the backend for the key to be confined to streams of its own."""
    from agentstream.ops.apikeys import hash_key, load_keys

    monkeypatch.delenv("AGENTSTREAM_BACKENDS", raising=False)
    keys_file = tmp_path / "keys.yaml"
    with pytest.raises(SystemExit) as exited:
        cli_module.main(
            ["gateway-key", "--name", "billing", "--agent", "*", "--backend", "billing", "--keys-file", str(keys_file)]
        )
    assert exited.value.code == 0
    out, err = capsys.readouterr()
    key = out.strip()
    assert "warning: AGENTSTREAM_BACKENDS is not set here; the services must name 'billing' in it" in err, err
    ring = load_keys(path=str(keys_file))
    [entry] = ring.keys
    assert (entry.name, entry.backend) == ("billing", "billing")
    assert ring.find(key) == entry and entry.sha256 == hash_key(key)


def test_gateway_key_with_a_name_that_cannot_name_a_backend_is_refused_and_writes_nothing(tmp_path, capsys):
    keys_file = tmp_path / "keys.yaml"
    with pytest.raises(SystemExit) as exited:
        cli_module.main(
            ["gateway-key", "--name", "k", "--agent", "*", "--backend", "a:b", "--keys-file", str(keys_file)]
        )
    assert exited.value.code != 0
    err = capsys.readouterr().err
    assert "cannot name a backend" in err and "--backend" in err and not keys_file.exists()


def test_gateway_key_for_a_backend_the_services_do_not_name_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AGENTSTREAM_BACKENDS", "billing,shop")
    keys_file = tmp_path / "keys.yaml"
    with pytest.raises(SystemExit) as exited:
        cli_module.main(
            ["gateway-key", "--name", "k", "--agent", "*", "--backend", "other", "--keys-file", str(keys_file)]
        )
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "not one of AGENTSTREAM_BACKENDS (billing, shop)" in err and not keys_file.exists()
    assert "warning" not in err, err
