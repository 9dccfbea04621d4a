"""CPU of the observability calls one step makes, with no tracer configured (issue 35 item 2).

    python bench/obs_hotpath.py [--n 200000]

Replays, N times, what the agent loop and the tool worker call into ``agentstream.ops`` for one
step of a tool round (step span with its attributes, model-call span and histogram, token
counters, ``inject()`` for the tool job, the consumer's in-flight gauge, the tool-call span and
histogram, a turn counter) and prints the process CPU per step in microseconds (the best of
``--reps`` runs). OpenTelemetry's API is installed, no SDK provider is set: a deployment without
tracing. The turn carries a ``traceparent``, as a traced publisher's would.
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

from agentstream.ops import metrics, tracing
from agentstream.wire.events import ModelOutput, Usage

PARENT = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
MODEL = SimpleNamespace(endpoint=SimpleNamespace(provider="openai", model="m", id="e"))
OUTPUT = ModelOutput(turn_id="u1", step=1, content="", usage=Usage(prompt_tokens=10, completion_tokens=5))


def one_step() -> None:
    attributes = lambda: {  # noqa: E731  # as the agent loop passes them
        "agentstream.decision": "Act",
        "agentstream.trace_id": "t1",
        "agentstream.turn_id": "u1",
        "agentstream.agent": "a",
        "agentstream.step": 1,
    }
    in_flight = metrics.HANDLERS_IN_FLIGHT.labels(service=metrics.service_of_group("agent-loop"), stream="s")
    in_flight.inc()
    with tracing.span("agentstream.step", parent=PARENT, attributes=attributes):
        model_attributes = tracing.model_call_attributes(MODEL, turn_id="u1", step=1)
        with (
            metrics.MODEL_CALL_SECONDS.labels(model="m").time(),
            tracing.span("agentstream.model_call", kind="client", attributes=model_attributes) as span,
        ):
            tracing.record_model_output(span, OUTPUT)
        metrics.record_usage("m", OUTPUT)
        tracing.inject()
        metrics.TURNS_ENDED.labels(agent="a").inc()
    in_flight.dec()
    # the tool worker's side of the step
    tool_attributes = lambda: {  # noqa: E731
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "x",
        "gen_ai.tool.call.id": "c",
    }
    with tracing.span("agentstream.tool_call", parent=PARENT, kind="consumer", attributes=tool_attributes):
        metrics.TOOL_CALL_SECONDS.labels(tool="x").observe(0.001)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    best = float("inf")
    for _ in range(args.reps):
        start = time.process_time()
        for _ in range(args.n):
            one_step()
        best = min(best, (time.process_time() - start) / args.n)
    print(f"{best * 1e6:.2f} us CPU per step ({tracing.__file__})")


if __name__ == "__main__":
    main()
