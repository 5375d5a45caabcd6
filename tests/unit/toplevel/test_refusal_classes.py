"""Issue 49: refusals are error classes of the catalogue (errors.py), each with its exit code and
fix, raised where the refusal is made: a caller (or a script reading the exit code) tells a bad
input line from an unknown name, a missing earlier step, a server that never got ready or one
that serves another model. Pure: no Docker; the one server is a closed local port."""

from __future__ import annotations

import socket

import pytest

from infermatrix.errors import (InputFileError, MissingPrerequisite, ModelNotServed,
                                ServerNotReady, UnknownChoice, UsageError)
from infermatrix.job import generate
from infermatrix.model import capacity


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_bad_prompt_line_is_an_input_file_error_naming_file_and_line(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n{not json\n')
    with pytest.raises(InputFileError, match=r"prompts\.jsonl:2: not JSON") as info:
        generate.read_prompts(prompts)
    assert info.value.exit_code == 2 and isinstance(info.value, UsageError)


def test_an_unknown_gpu_class_is_an_unknown_choice_listing_the_choices():
    with pytest.raises(UnknownChoice, match="choose one of a100, b200") as info:
        capacity._choose("GPU class", "h900", {"a100": {}, "b200": {}}, "--gpu")
    assert info.value.exit_code == 2


def test_a_deployment_without_compose_is_a_missing_prerequisite_with_its_command(tmp_path):
    with pytest.raises(MissingPrerequisite) as info:
        generate.deployment_endpoints(tmp_path)
    assert info.value.exit_code == 2
    assert info.value.fix == "write one with `infermatrix deploy`"
    assert "infermatrix deploy" not in info.value.message  # the fix is its own line


def test_a_server_that_lists_no_model_is_model_not_served_with_the_flag_to_pass():
    endpoint = generate.ServerEndpoint("r0", f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(ModelNotServed) as info:
        generate.served_model(endpoint, timeout_s=2)
    assert info.value.exit_code == 1 and "--model" in (info.value.fix or "")
    assert str(info.value).endswith("fix: " + ModelNotServed.default_fix)


def test_no_healthy_replica_is_server_not_ready_naming_each_replica():
    endpoints = [generate.ServerEndpoint(f"r{i}", f"http://127.0.0.1:{closed_port()}")
                 for i in range(2)]
    with pytest.raises(ServerNotReady, match=r"for 0 s: r0 .*, r1 ") as info:
        generate.wait_until_any_healthy(endpoints, timeout_s=0.0)
    assert info.value.exit_code == 1
