"""What a model output teaches the fold about the size of its requests (:func:`usage_recorded`, pure).

When a model output is folded, the prompt token count it recorded corrects the estimate of the
calls after it: its usage when plausible, the server's figures after a window miss, and
nothing for an output of another model. One row per case, no Redis.
"""

from __future__ import annotations

import pytest

from agentstream.context._context_fold import usage_recorded
from agentstream.context.limits import WINDOW_MISS, ModelLimits, Tokens
from agentstream.wire.events import ModelOutput, Usage

LIMITS = ModelLimits(window=Tokens(1000), characters_per_token=3.0)  # 3000 characters: 1000 tokens
OF_GPT = ModelLimits(window=Tokens(1000), characters_per_token=3.0, model="gpt")
SENT = 1500  # the request as built: 500 tokens by the estimate
EARLIER = (123, 456)  # the correction in effect


def output(prompt_tokens: int | None = None, model: str = "gpt", miss: object = None) -> ModelOutput:
    return ModelOutput(
        turn_id="t1",
        step=0,
        content="hi",
        model=model,
        usage=Usage(prompt_tokens=prompt_tokens),
        attributes={WINDOW_MISS: miss} if miss is not None else {},
    )


@pytest.mark.parametrize(
    ("case", "event", "limits", "expected"),
    [
        ("no usage: the correction in effect stays", output(), LIMITS, EARLIER),
        ("a plausible count corrects", output(prompt_tokens=600), LIMITS, (600, SENT)),
        ("half the estimate is still plausible", output(prompt_tokens=250), LIMITS, (250, SENT)),
        ("an under-report corrects nothing", output(prompt_tokens=249), LIMITS, EARLIER),
        ("the limits' own model corrects", output(prompt_tokens=600), OF_GPT, (600, SENT)),
        ("another model's count corrects nothing", output(prompt_tokens=600, model="other"), OF_GPT, EARLIER),
        (
            "a window miss counts the refused request as the server did",
            output(prompt_tokens=300, miss={"prompt_tokens": 900}),
            LIMITS,
            (900, SENT),
        ),
        (
            "a window miss without figures: the least a refusal proves",
            output(miss={"prompt_tokens": None}),
            LIMITS,
            (1000 - 100 + 1, SENT),
        ),
        (
            "figures that are not counts are left out",
            output(miss={"prompt_tokens": True, "window_tokens": -5, "over_by_tokens": "7"}),
            LIMITS,
            (1000 - 100 + 1, SENT),
        ),
        ("a window miss that is not a mapping is no miss", output(prompt_tokens=600, miss=[900]), LIMITS, (600, SENT)),
        (
            "another model's window miss teaches nothing",
            output(model="other", miss={"prompt_tokens": 900}),
            OF_GPT,
            EARLIER,
        ),
    ],
)
def test_what_a_model_output_records(case: str, event: ModelOutput, limits: ModelLimits, expected) -> None:
    assert usage_recorded(event, limits, SENT, 100, EARLIER) == expected, case


def test_with_no_correction_in_effect_an_output_that_tells_nothing_leaves_none() -> None:
    assert usage_recorded(output(), LIMITS, SENT, 100, None) is None
