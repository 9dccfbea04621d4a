"""Model errors and retries are counted by endpoint and HTTP status (a 429 storm is visible),
against the failure-injecting HTTP server (real sockets)."""

from __future__ import annotations

from prometheus_client import REGISTRY
from pydantic import SecretStr

from agentstream.context.request import ChatRequest, UserMessage
from agentstream.errors import ModelConfigError, ModelUnanswered
from agentstream.models import build_model
from agentstream.models.endpoints import ModelEndpoint
from tests.support.fault_server import FaultServer, Reply, chat

REQUEST = ChatRequest(system="S", messages=(UserMessage(text="Say hello"),), max_output_tokens=64)


async def no_wait(_seconds: float) -> None:
    return None


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def model_for(server: FaultServer, endpoint_id: str, retries: int = 3):
    endpoint = ModelEndpoint(
        id=endpoint_id, provider="openai", base_url=server.base_url, model="m", api_key=SecretStr("k")
    )
    return build_model(endpoint, retries=retries, backoff_s=0.01, sleep=no_wait)


async def test_429s_then_an_answer_count_three_errors_and_three_retries_by_status():
    storm = Reply(status=429, body={"error": {"message": "slow down"}}, headers={"retry-after": "0"})
    with FaultServer([storm, storm, Reply(status=503, body={}), chat("Hello!")]) as server:
        model = model_for(server, "storm")
        output = await model.complete(REQUEST, turn_id="t", step=0)
        await model.aclose()
    assert output.content == "Hello!"
    assert value("agentstream_model_errors_total", endpoint="storm", status="429") == 2
    assert value("agentstream_model_errors_total", endpoint="storm", status="503") == 1
    assert value("agentstream_model_retries_total", endpoint="storm", status="429") == 2
    assert value("agentstream_model_retries_total", endpoint="storm", status="503") == 1


async def test_a_refused_key_is_an_error_and_no_retry():
    with FaultServer([Reply(status=401, body={"error": {"message": "bad key"}})], repeat_last=True) as server:
        model = model_for(server, "badkey")
        try:
            await model.complete(REQUEST, turn_id="t", step=0)
        except ModelConfigError:
            pass
        else:
            raise AssertionError("a 401 must fail the call")
        await model.aclose()
    assert value("agentstream_model_errors_total", endpoint="badkey", status="401") == 1
    assert value("agentstream_model_retries_total", endpoint="badkey", status="401") == 0


async def test_a_server_that_is_down_counts_network_errors():
    with FaultServer([chat("unused")]) as server:
        url = server.base_url
    endpoint = ModelEndpoint(id="down", provider="openai", base_url=url, model="m", api_key=SecretStr("k"))
    model = build_model(endpoint, retries=1, backoff_s=0.01, sleep=no_wait)
    try:
        await model.complete(REQUEST, turn_id="t", step=0)
    except ModelUnanswered:
        pass
    await model.aclose()
    assert value("agentstream_model_errors_total", endpoint="down", status="network") == 2
    assert value("agentstream_model_retries_total", endpoint="down", status="network") == 1
