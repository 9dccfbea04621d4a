"""Window misses: every server's wording of "the request is over the context window", and what the
estimate learns from one (agentstream.models.overflow, agentstream.context.limits.learn_from_miss)."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentstream.context.limits import ModelLimits, Tokens, learn_from_miss
from agentstream.errors import ContextWindowExceeded, ModelInputRejected
from agentstream.models.http import check_status, stream_error
from agentstream.models.overflow import WindowMiss, window_miss


def openai_error(message: str, *, code=None, kind="invalid_request_error", **extra) -> str:
    return json.dumps({"error": {"message": message, "type": kind, "param": "messages", "code": code, **extra}})


# (server, status, body as the server sends it, the figures read from it)
MISSES = [
    (
        "openai",
        400,
        openai_error(
            "This model's maximum context length is 8192 tokens. However, your messages resulted in 9013 tokens. "
            "Please reduce the length of the messages.",
            code="context_length_exceeded",
        ),
        WindowMiss(prompt_tokens=9013, window_tokens=8192),
    ),
    (
        "openai, code only",
        400,
        openai_error("Request too long.", code="context_length_exceeded"),
        WindowMiss(),
    ),
    (
        "vllm",
        400,
        json.dumps(
            {
                "object": "error",
                "message": "This model's maximum context length is 4096 tokens. However, you requested 5120 tokens "
                "(4096 in the messages, 1024 in the completion). Please reduce the length of the messages or "
                "completion.",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
        ),
        WindowMiss(prompt_tokens=4096, window_tokens=4096),
    ),
    (
        "vllm, newer",
        400,
        openai_error(
            "'max_tokens' or 'max_completion_tokens' is too large: 1024. This model's maximum context length is "
            "4096 tokens and your request has 3500 input tokens (1024 > 4096 - 3500).",
            kind="BadRequestError",
            code=400,
        ),
        WindowMiss(prompt_tokens=3500, window_tokens=4096),
    ),
    (
        "vllm, decoder prompt",
        400,
        openai_error("The decoder prompt (length 5000) is longer than the maximum model length of 4096."),
        WindowMiss(prompt_tokens=5000, window_tokens=4096),
    ),
    (
        "llama.cpp server",
        400,
        json.dumps(
            {
                "error": {
                    "code": 400,
                    "message": "the request exceeds the available context size, try increasing it",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": 5012,
                    "n_ctx": 4096,
                }
            }
        ),
        WindowMiss(prompt_tokens=5012, window_tokens=4096),
    ),
    (
        "llama.cpp server, older",
        400,
        json.dumps(
            {
                "error": {
                    "code": 400,
                    "message": "the request exceeds the available context size. try increasing the context size "
                    "or enable context shift",
                    "type": "invalid_request_error",
                }
            }
        ),
        WindowMiss(),
    ),
    (
        "ollama",
        400,
        json.dumps({"error": {"message": "prompt too long; exceeded max context length by 120 tokens"}}),
        WindowMiss(over_by_tokens=120),
    ),
    (
        "ollama, input length",
        400,
        json.dumps({"error": {"message": "the input length exceeds the context length", "type": "api_error"}}),
        WindowMiss(),
    ),
    (
        "lm studio",
        400,
        json.dumps(
            {
                "error": "Trying to keep the first 5000 tokens when context the overflows. However, the model is "
                "loaded with context length of only 4096 tokens, which is not enough. Try to load the model with "
                "a larger context length, or provide a shorter input"
            }
        ),
        WindowMiss(prompt_tokens=5000, window_tokens=4096),
    ),
    (
        "lm studio, keep",
        400,
        json.dumps(
            {"error": "The number of tokens to keep from the initial prompt is greater than the context length"}
        ),
        WindowMiss(),
    ),
    (
        "litellm proxy",
        400,
        json.dumps(
            {
                "error": {
                    "message": "litellm.ContextWindowExceededError: litellm.BadRequestError: "
                    "ContextWindowExceededError: OpenAIException - Input is too long for requested model.",
                    "type": None,
                    "param": None,
                    "code": "400",
                }
            }
        ),
        WindowMiss(),
    ),
    (
        "anthropic",
        400,
        json.dumps(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 208396 tokens > 200000 maximum",
                },
            }
        ),
        WindowMiss(prompt_tokens=208396, window_tokens=200000),
    ),
    (
        "anthropic, with max_tokens",
        400,
        json.dumps(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "input length and `max_tokens` exceed context limit: 195000 + 8192 > 200000, "
                    "decrease input length or `max_tokens` and try again",
                },
            }
        ),
        WindowMiss(prompt_tokens=195000, window_tokens=200000),
    ),
    (
        "gemini",
        400,
        json.dumps(
            [
                {
                    "error": {
                        "message": "The input token count (40000) exceeds the maximum number of tokens allowed (32768)."
                    }
                }
            ]
        ),
        WindowMiss(prompt_tokens=40000, window_tokens=32768),
    ),
    (
        "mistral",
        400,
        json.dumps(
            {
                "object": "error",
                "message": "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum "
                "context length",
                "type": "invalid_request_message_error",
            }
        ),
        WindowMiss(prompt_tokens=40000, window_tokens=32768),
    ),
    ("plain text body, 413", 413, "Request Entity Too Large: prompt is too long", WindowMiss()),
    (
        "text-generation-inference",
        422,
        json.dumps(
            {
                "error": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 "
                "`inputs` tokens and 500 `max_new_tokens`",
                "error_type": "validation",
            }
        ),
        WindowMiss(prompt_tokens=4000, window_tokens=4096),
    ),
    (
        "llama.cpp server answering 500",
        500,
        json.dumps(
            {
                "error": {
                    "code": 500,
                    "message": "the request exceeds the available context size",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": 4200,
                    "n_ctx": 4096,
                }
            }
        ),
        WindowMiss(prompt_tokens=4200, window_tokens=4096),
    ),
]

NOT_MISSES = [
    ("bad schema", 400, openai_error("Invalid schema for function 'f': 'object' is not valid", code="invalid_schema")),
    ("bad signature", 400, json.dumps({"type": "error", "error": {"message": "Invalid `signature` in `thinking`"}})),
    ("max_tokens alone", 400, openai_error("max_tokens must be at least 1, got 0")),
    ("rate limit saying context", 429, openai_error("This model's maximum context length is 8192 tokens.")),
    ("server error saying context", 500, "prompt is too long"),
    ("empty", 400, ""),
]


@pytest.mark.parametrize(("server", "status", "body", "figures"), MISSES, ids=[m[0] for m in MISSES])
def test_every_servers_wording_of_a_window_miss_is_recognised_with_its_figures(server, status, body, figures):
    assert window_miss(status, body) == figures


@pytest.mark.parametrize(("case", "status", "body"), NOT_MISSES, ids=[m[0] for m in NOT_MISSES])
def test_other_refusals_are_not_window_misses(case, status, body):
    assert window_miss(status, body) is None


@pytest.mark.parametrize(("server", "status", "body", "figures"), MISSES, ids=[m[0] for m in MISSES])
def test_a_refused_window_is_a_typed_error_with_the_figures(server, status, body, figures):
    response = httpx.Response(status, content=body.encode())
    with pytest.raises(ContextWindowExceeded) as caught:
        check_status(response, url="http://x/v1/chat/completions", model="m")
    assert isinstance(caught.value, ModelInputRejected)  # callers that catch a refused input still do
    assert caught.value.status_code == status
    assert (caught.value.prompt_tokens, caught.value.window_tokens) == (figures.prompt_tokens, figures.window_tokens)
    assert "context window" in str(caught.value)


def test_another_refusal_stays_a_plain_refused_input():
    response = httpx.Response(400, content=NOT_MISSES[0][2].encode())
    with pytest.raises(ModelInputRejected) as caught:
        check_status(response, url="http://x", model="m")
    assert not isinstance(caught.value, ContextWindowExceeded)


def test_a_window_miss_inside_a_stream_is_the_typed_error():
    error = {"type": "exceed_context_size_error", "message": "too big", "n_prompt_tokens": 9000, "n_ctx": 8192}
    exc = stream_error(error, url="http://x", model="m")
    assert isinstance(exc, ContextWindowExceeded) and (exc.prompt_tokens, exc.window_tokens) == (9000, 8192)
    plain = stream_error({"type": "invalid_request_error", "message": "bad role"}, url="http://x", model="m")
    assert type(plain) is ModelInputRejected


LIMITS = ModelLimits(window=Tokens(8192), characters_per_token=3.0, model="m")


def test_a_miss_with_the_servers_figures_teaches_its_count_and_window():
    learned = learn_from_miss(LIMITS, sent_chars=18_000, output_tokens=512, prompt_tokens=7900, window_tokens=6144)
    assert learned.prompt_tokens == 7900
    assert learned.limits.window == Tokens(6144)
    assert learned.limits.characters_per_token == pytest.approx(18_000 / 7900)
    assert learned.limits.model == "m"


def test_a_miss_without_figures_still_makes_the_same_request_too_big():
    # estimated 6000 + 512 of 8192: it fitted; the server refused it anyway
    learned = learn_from_miss(LIMITS, sent_chars=18_000, output_tokens=512)
    assert learned.prompt_tokens == 8192 - 512 + 1
    assert learned.limits.tokens_of_chars(18_000) + 512 > learned.limits.window.count


@given(
    window=st.integers(min_value=64, max_value=300_000),
    per_token=st.floats(min_value=0.5, max_value=8.0),
    sent_chars=st.integers(min_value=0, max_value=2_000_000),
    output_tokens=st.integers(min_value=0, max_value=50_000),
    prompt_tokens=st.none() | st.integers(min_value=1, max_value=400_000),
    window_tokens=st.none() | st.integers(min_value=1, max_value=400_000),
    over_by_tokens=st.none() | st.integers(min_value=1, max_value=10_000),
)
def test_after_any_miss_the_refused_request_no_longer_fits_the_learned_limits(
    window, per_token, sent_chars, output_tokens, prompt_tokens, window_tokens, over_by_tokens
):
    limits = ModelLimits(window=Tokens(window), characters_per_token=per_token, model="m")
    learned = learn_from_miss(
        limits,
        sent_chars=sent_chars,
        output_tokens=output_tokens,
        prompt_tokens=prompt_tokens,
        window_tokens=window_tokens,
        over_by_tokens=over_by_tokens,
    )
    # the builder would shrink before sending it again: by the estimate, and by the counted size
    assert learned.limits.tokens_of_chars(sent_chars) + output_tokens > learned.limits.window.count or (sent_chars == 0)
    assert learned.prompt_tokens + output_tokens > learned.limits.window.count
    assert learned.limits.window <= limits.window
    assert learned.limits.characters_per_token <= limits.characters_per_token
