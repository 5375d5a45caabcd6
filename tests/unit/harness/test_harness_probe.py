"""The probe's response parsing and checks (pure: answers as the engines return them)."""

from __future__ import annotations

import pytest

from infermatrix.harness import _result
from infermatrix.harness.probe import (
    ProbeError,
    ProbeSettings,
    Reply,
    check_greedy,
    check_thinking_off,
    check_thinking_on,
    parse_reply,
)


def completion(content, finish="length", tokens=8, **message_fields):
    return {"choices": [{"index": 0, "finish_reason": finish,
                         "message": {"role": "assistant", "content": content, **message_fields}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": tokens}}


def test_vllm_recent_reasoning_field_is_read():
    reply = parse_reply(completion(None, reasoning="let me think", reasoning_content=None), 0.5)
    assert reply.reasoning == "let me think"
    assert reply.reasoning_field == "reasoning"
    assert reply.content is None
    assert reply.completion_tokens == 8
    assert reply.tokens_per_s == 16.0


def test_sglang_and_older_vllm_reasoning_content_is_read():
    reply = parse_reply(completion("Paris", finish="stop", reasoning_content="France..."))
    assert (reply.reasoning, reply.reasoning_field) == ("France...", "reasoning_content")
    assert check_thinking_on(reply, real_model=True)["status"] == "pass"


@pytest.mark.parametrize("body", [{}, {"choices": []}, {"choices": [{"text": "x"}]}, []])
def test_malformed_answers_are_probe_errors(body):
    with pytest.raises(ProbeError, match="malformed"):
        parse_reply(body)


def test_thinking_on_without_reasoning_parser_fails_and_says_why():
    # Without --reasoning-parser the thinking text lands in `content` (spark-vllm-docker#128).
    reply = parse_reply(completion("The user asks about France so"))
    result = check_thinking_on(reply, real_model=False)
    assert result["status"] == "fail"
    assert "reasoning parser" in result["reason"]


def test_thinking_on_with_a_tag_leaking_into_content_fails():
    reply = parse_reply(completion("</think>Paris", reasoning="hmm"))
    assert "leaked" in check_thinking_on(reply, real_model=False)["reason"]


def test_thinking_on_real_model_must_answer_when_it_stops():
    reply = parse_reply(completion("", finish="stop", reasoning="long thought"))
    assert check_thinking_on(reply, real_model=True)["status"] == "fail"
    assert check_thinking_on(reply, real_model=False)["status"] == "pass"


def test_thinking_off_needs_content():
    assert check_thinking_off(parse_reply(completion("Paris")))["status"] == "pass"
    # `content: null` with thinking off (vllm#17349)
    result = check_thinking_off(parse_reply(completion(None, reasoning="Paris")))
    assert result["status"] == "fail" and "`reasoning`" in result["reason"]
    assert check_thinking_off(parse_reply(completion("  \n")))["status"] == "fail"
    assert check_thinking_off(parse_reply(completion("<think>x")))["status"] == "fail"


def test_greedy_answer_is_checked_only_for_a_real_model():
    wrong = Reply("Berlin", None, None, "stop", 1, 0.1)
    assert check_greedy(wrong, "Paris", real_model=True)["status"] == "fail"
    assert check_greedy(Reply("paris.", None, None, "stop", 1, 0.1), "Paris", True)["status"] \
        == "pass"
    fixture = check_greedy(wrong, "Paris", real_model=False)
    assert fixture["status"] == "pass" and fixture["meaning_checked"] is False
    assert check_greedy(Reply(None, None, None, "stop", 0, 0.1), "Paris", False)["status"] \
        == "fail"


def test_fixture_requests_ask_for_a_few_tokens_at_least():
    assert ProbeSettings(real_model=False, max_tokens=32).sampling() == {"min_tokens": 4}
    assert ProbeSettings(real_model=True).sampling() == {}


def test_result_line_is_found_among_other_output():
    output = "INFO loading\n" + _result.RESULT_MARKER + '{"status": "pass", "n": 1}\nbye\n'
    assert _result.parse(output) == {"status": "pass", "n": 1}
    assert _result.parse("no result here") is None
    assert _result.overall([{"status": "pass"}, {"status": "skip"}]) == "pass"
    assert _result.overall([{"status": "pass"}, {"status": "fail"}]) == "fail"
    assert _result.overall([{"status": "skip"}]) == "skip"
