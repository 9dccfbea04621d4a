"""agentstream.testing: the model doubles and the in-process test bed, on a real Redis, with the
README's app and its example tests run as written."""

from __future__ import annotations

import dataclasses
import sys
import types
from pathlib import Path

import pytest

from agentstream import Agent, App, tool
from agentstream.testing import (
    FunctionModel,
    RealModelCallBlocked,
    ScriptedModel,
    TestBed,
    TestModel,
    UnexpectedModelCall,
    call,
)
from agentstream.wire.events import ModelOutput, ToolOutput, TurnEnded
from tests.support import docs

pytestmark = pytest.mark.integration

FIRST_AGENT, TESTING = "tutorials/first-agent.md", "how-to/testing.md"


def readme_blocks(where: str) -> list[str]:
    """The Python blocks of a docs page (the first agent's app, the testing example)."""
    return docs.blocks(docs.page(where), "python")


def readme_app(*, model_answers: bool = True) -> App:
    """The README's first app; with ``model_answers`` its agent answers from the tool's result
    itself (without ``result_as_answer``), so a model double is called after the tool."""
    (code, *_) = readme_blocks(FIRST_AGENT)
    module = types.ModuleType("readme_app")
    exec(compile(code, "docs/tutorials/first-agent.md", "exec"), module.__dict__)
    if not model_answers:
        return module.app
    return App(agents=[dataclasses.replace(a, result_as_answer=()) for a in module.app.agents])


async def test_the_readme_app_example_tests_pass_as_written(redis_url, monkeypatch):
    app = readme_app(model_answers=False)
    tests_code = readme_blocks(TESTING)[0]
    monkeypatch.setitem(sys.modules, "weather", types.SimpleNamespace(app=app))  # `from weather import app`
    module = types.ModuleType("readme_tests")
    exec(
        compile(
            tests_code.replace("TestBed(app,", f"TestBed(app, redis_url={redis_url!r},"),
            "docs/how-to/testing.md",
            "exec",
        ),
        module.__dict__,
    )
    tests = [v for k, v in vars(module).items() if k.startswith("test_")]
    assert len(tests) == 2
    for test in tests:
        await test()


async def test_test_model_calls_every_tool_once_then_answers_with_the_results(redis_url):
    app = readme_app()
    model = TestModel()
    async with TestBed(app, model=model, redis_url=redis_url) as bed:
        reply = await bed.ask("Weather?")
        events = await bed.trace(reply.trace_id)
    assert reply.status == "ended" and reply.answer == '{"get_weather": "18C, cloudy in a"}'
    outputs = [e for e in events if isinstance(e, ModelOutput)]
    assert [len(o.tool_calls) for o in outputs] == [1, 0]
    assert outputs[0].tool_calls[0].name == "get_weather" and outputs[0].tool_calls[0].arguments == '{"city": "a"}'
    assert len(model.requests) == 2 and [t.name for t in model.requests[0].tools] == ["get_weather"]


async def test_a_second_turn_continues_the_conversation(redis_url):
    app = readme_app()
    async with TestBed(app, model=TestModel(answer="ok"), redis_url=redis_url) as bed:
        first = await bed.ask("one")
        second = await bed.ask("two", trace_id=first.trace_id)
        events = await bed.trace(first.trace_id)
    assert second.answer == "ok"
    assert sum(isinstance(e, TurnEnded) for e in events) == 2


async def test_function_model_follows_a_rule_and_sees_the_results(redis_url):
    app = readme_app()

    def rule(request, info):
        if not info.results:
            return call("get_weather", {"city": info.user_text.split()[-1].rstrip("?"), "unit": "F"})
        return f"the tool said: {info.results[0].text}"

    async with TestBed(app, model=FunctionModel(rule), redis_url=redis_url) as bed:
        reply = await bed.ask("Weather in Oslo?")
    assert reply.answer == "the tool said: 18F, cloudy in Oslo"


async def test_scripted_model_fails_the_test_on_an_unexpected_call(redis_url):
    app = readme_app()
    script = ScriptedModel([call("get_weather", {"city": "Rome"})])  # no reply for the second call
    with pytest.raises(UnexpectedModelCall, match="past the end of the script"):
        async with TestBed(app, model=script, redis_url=redis_url) as bed:
            await bed.ask("Weather in Rome?")


async def test_scripted_model_fails_the_test_on_unconsumed_replies(redis_url):
    app = readme_app()
    script = ScriptedModel(["first answer", "never asked"])
    with pytest.raises(UnexpectedModelCall, match="1 scripted reply was never asked for"):
        async with TestBed(app, model=script, redis_url=redis_url) as bed:
            reply = await bed.ask("hello")
            assert reply.answer == "first answer"


async def test_bad_arguments_from_a_double_reach_the_model_as_an_error_result(redis_url):
    app = readme_app()
    script = ScriptedModel(
        [call("get_weather", "{not json"), lambda request, info: f"saw: {info.results[0].text[:40]}"]
    )
    async with TestBed(app, model=script, redis_url=redis_url) as bed:
        reply = await bed.ask("Weather?")
        events = await bed.trace(reply.trace_id)
    (result,) = [e for e in events if isinstance(e, ToolOutput)]
    assert result.error and reply.answer.startswith("saw: ")


async def test_real_model_calls_are_impossible_unless_opted_in(redis_url, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_MODEL", "real-model")
    app = readme_app()
    async with TestBed(app, redis_url=redis_url) as bed:  # no double given: TestModel, never HTTP
        reply = await bed.ask("Weather?")
        assert reply.status == "ended"
        assert isinstance(bed.doubles["default"], TestModel)
        with pytest.raises(RealModelCallBlocked, match="real model calls are off"):
            await bed._http.post("https://api.openai.com/v1/chat/completions")
    async with TestBed(app, redis_url=redis_url, allow_model_requests=True, settings={"model_retries": 0}) as bed:
        reply = await bed.ask("Weather?")  # the configured endpoint, for real: nothing listens there
    assert reply.status == "failed" and reply.code == "model_error"


async def test_a_tool_that_raises_and_a_slow_tool_are_run_by_the_workers(redis_url):
    import asyncio

    @tool(timeout_s=5)
    async def slow(seconds: float = 0.3) -> str:
        """Sleeps."""
        await asyncio.sleep(seconds)
        return "slept"

    @tool
    def broken() -> str:
        """Fails."""
        raise RuntimeError("kaput")

    app = App(agents=[Agent(name="a", system_prompt="s", tools=[slow, broken], max_passes=3)])
    async with TestBed(app, model=TestModel(), redis_url=redis_url) as bed:
        reply = await bed.ask("go")
        results = {e.name: e for e in await bed.trace(reply.trace_id) if isinstance(e, ToolOutput)}
    assert results["slow"].text == "slept" and not results["slow"].error
    assert results["broken"].error and "kaput" in results["broken"].text
    assert reply.status == "ended"


@pytest.mark.slow
async def test_the_bed_runs_on_the_embedded_redis_without_a_url(monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    app = readme_app()
    async with TestBed(app, model=TestModel(answer="hi")) as bed:
        assert bed.redis_url.startswith("unix://")
        assert (await bed.ask("hello")).answer == "hi"


async def test_an_app_with_several_agents_needs_the_agent_named(redis_url):
    app = App(agents=[Agent(name="x", system_prompt="s"), Agent(name="y", system_prompt="s")])
    async with TestBed(app, model=TestModel(answer="fine"), redis_url=redis_url) as bed:
        with pytest.raises(ValueError, match="name one with agent="):
            await bed.ask("hi")
        assert (await bed.ask("hi", agent="y")).answer == "fine"


async def test_the_bed_asks_with_a_typed_input(redis_url):
    from agentstream import ChatTurnInput, ToolDeclaration

    @tool
    def forecast(city: str) -> str:
        """The forecast."""
        return f"sun in {city}"

    seen = []

    def rule(request, info):
        seen.append(([t.name for t in request.tools], request.messages[-1].text))
        return "ok"

    app = App(
        agents=[
            Agent(
                name="w",
                system_prompt="S",
                input=ChatTurnInput,
                tools=[forecast],
                declared=[ToolDeclaration(name="forecast", default="off")],
            )
        ]
    )
    async with TestBed(app, model=FunctionModel(rule), redis_url=redis_url) as bed:
        assert (await bed.ask("Hi")).answer == "ok"
        assert (await bed.ask(input={"text": "Oslo?", "tools": {"forecast": "required"}})).answer == "ok"
    assert seen == [([], "Hi"), (["forecast"], "Oslo?\n\nUse the forecast tool for this message.")]


@pytest.mark.slow
@pytest.mark.parametrize("pytest_asyncio", ["absent", "strict"])
def test_the_readme_testing_example_runs_as_written_in_a_fresh_project(tmp_path, pytest_asyncio):
    """The README's app saved as weather.py and its testing example as test_weather.py, in a
    folder of their own, run by the user's own pytest (a process of its own, no settings file):
    both tests pass without a marker, with pytest-asyncio absent or in its default strict mode
    (agentstream's pytest plugin runs them), on the embedded Redis (no REDIS_URL); the temp dir
    holds nothing of agentstream afterwards (each TestBed's embedded Redis once left a folder)."""
    import os
    import subprocess
    import tempfile

    project, scratch = tmp_path / "project", Path(tempfile.mkdtemp(prefix="as-tmp-"))  # short: unix socket paths
    project.mkdir()
    (project / "weather.py").write_text(readme_blocks(FIRST_AGENT)[0])
    (project / "test_weather.py").write_text(readme_blocks(TESTING)[0])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_URL", "AGENTSTREAM_", "PYTEST_"))}
    env.update(TMPDIR=str(scratch))
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
    if pytest_asyncio == "absent":
        args += ["-p", "no:asyncio"]
    try:
        ran = subprocess.run(
            [*args, "test_weather.py"], cwd=project, env=env, capture_output=True, text=True, timeout=240
        )
        assert ran.returncode == 0 and "2 passed" in ran.stdout, ran.stdout[-3000:] + ran.stderr[-3000:]
        assert "PytestUnhandledCoroutineWarning" not in ran.stdout and "not natively supported" not in ran.stdout
        left = sorted(p.name for p in scratch.iterdir())
        assert not [name for name in left if name.startswith("agentstream-")], left
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)


async def test_a_turn_that_names_a_second_model_is_answered_by_that_models_double():
    # issue 34: the doubles had no endpoint, so a turn naming one of the agent's models was refused
    two = App(agents=[Agent(name="a", system_prompt="s", model="default", models=["small"])])
    big, small = ScriptedModel(["from default"]), ScriptedModel(["from small"])
    async with TestBed(two, models={"default": big, "small": small}) as bed:
        first = await bed.ask("hi")
        second = await bed.ask("hi again", model="small", trace_id=first.trace_id)
        refused = await bed.ask("and?", model="large", trace_id=first.trace_id)
    assert (first.answer, second.answer) == ("from default", "from small")
    assert len(big.requests) == 1 and len(small.requests) == 1
    assert refused.status == "failed" and "large" in refused.reason  # a model the agent does not allow


def test_the_readmes_first_agent_and_its_test_are_the_docs_ones():
    """README.md shows the first agent and its test; they are the blocks this module runs (from
    docs/tutorials/first-agent.md and docs/how-to/testing.md), so the README's run as written too."""
    app_code, test_code = readme_blocks("README.md")
    assert app_code == readme_blocks(FIRST_AGENT)[0]
    assert test_code == readme_blocks(TESTING)[0]
