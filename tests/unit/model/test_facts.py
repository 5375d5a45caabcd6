"""The encoded facts held against recorded copies of their sources (#45), offline.

Each fact the planner acts on that rests on an engine's or a library's released code is checked
here against an excerpt of that file, recorded from the wheel (or repository commit) its
`source` names, under tests/fixtures/facts/. The checks read the data (rules.yaml, matrix.yaml)
and derive what the source must say from it: a change to the data that the source does not
support fails here, and so does a fixture that no longer says what the data claims.

Not covered (no recorded copy possible from here): the torch index's cu129 listing
(download.pytorch.org is unreachable from this network; the planner asks it and says
"unverified"), NVIDIA's driver and toolkit tables (data/drivers.yaml).
"""

from __future__ import annotations

import json
import re

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from infermatrix.model.rules import load_rules
from tests.paths import TESTS

FACTS = TESTS / "fixtures" / "facts"
ROOT = TESTS.parent
RULES = load_rules()
BACKENDS = RULES["attention-backend-arch"]


def excerpt(name: str) -> str:
    path = FACTS / name
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# Excerpt of"), f"{name}: a recorded excerpt names its source first"
    return text


def lower_bound(versions: str) -> str:
    """The release a `>=X` range starts at (the one whose code was read)."""
    return next(s.version for s in SpecifierSet(versions) if s.operator == ">=")


def upper_bound(versions: str) -> str | None:
    return next((s.version for s in SpecifierSet(versions) if s.operator == "<"), None)


def every_entry_with_a_source():
    yield "flashinfer-jit-arch", RULES["flashinfer-jit-arch"]["refuses"]
    for engine, entries in BACKENDS["engine_default"].items():
        yield f"engine_default.{engine}", entries
    for name, spec in BACKENDS["backends"].items():
        for engine, entries in (spec.get("engines") or {}).items():
            yield f"backends.{name}.engines.{engine}", entries
    yield "triton-ptxas", [RULES["triton-ptxas"]]
    rows = [row for row in RULES["torch-cuda-variant"]["variants"].values() if "source" in row]
    yield "torch-cuda-variant", rows


@pytest.mark.parametrize("where, entries", list(every_entry_with_a_source()),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_every_fact_carries_its_source_and_the_date_it_was_checked(where, entries):
    assert entries, where
    for entry in entries:
        assert entry.get("source"), (where, entry)
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(entry.get("checked"))), (where, entry)


# --- FlashInfer's JIT on SM 12.x --------------------------------------------------------------
def flashinfer_context(version: str) -> str:
    return excerpt(f"flashinfer/compilation_context-{version}.py.txt")


def test_flashinfer_refusals_match_the_wheels_compilation_context():
    first, later = RULES["flashinfer-jit-arch"]["refuses"]
    start, end = lower_bound(first["versions"]), upper_bound(first["versions"])
    refusing = flashinfer_context(start)
    assert f'raise RuntimeError("{first["message"]}")' in refusing
    assert f'is_cuda_version_at_least("{first["below_nvcc"]}")' in refusing
    # the release before the range has no check at all
    assert "requires CUDA" not in flashinfer_context("0.6.6")
    # where the range ends, SM 12.0 is accepted on CUDA 12.8 and only 12.1+ is refused
    fixed = flashinfer_context(end)
    assert first["message"] not in fixed
    assert 'if is_cuda_version_at_least("12.8"):\n                    return (major, "0a")' in fixed
    assert lower_bound(later["versions"]) == end
    assert f'raise RuntimeError("{later["message"]}")' in fixed
    assert later["archs"] == ["sm_121"]


@pytest.mark.parametrize("version", ["0.6.7.post2", "0.7.2"])
def test_a_suffixed_arch_list_entry_is_used_as_is(version):
    """Why a suffixed FLASHINFER_CUDA_ARCH_LIST lets a refusing release JIT on nvcc 12.8."""
    text = flashinfer_context(version)
    assert 'if "FLASHINFER_CUDA_ARCH_LIST" in os.environ:' in text
    assert "if minor[-1].isalpha():\n                    self.TARGET_CUDA_ARCHS.add((major, minor))" \
        in text
    table = RULES["flashinfer-jit-arch"]["arch_list"]
    assert all(v[-1].isalpha() for v in [*table["specific"].values(), *table["family"].values()])


# --- the engines' own default attention backend ------------------------------------------------
SGLANG_READ = {  # each release read -> (default backend file, sm checks, Qwen3.5 adjustment,
    # the return of the MHA branch's last case, the Qwen3.5 adjustment's SM100-only gate)
    "0.5.10": ("sglang/0.5.10-server_args-default_attn_backend.py.txt",
               "sglang/0.5.10-utils-common-sm_checks.py.txt",
               "sglang/0.5.10-server_args-qwen3_5.py.txt",
               'return "{backend}" if is_flashinfer_available() else "triton"',
               "            is_sm100_supported()\n            and self.attention_backend is None"),
    "0.5.11": ("sglang/0.5.11-server_args-default_attn_backend.py.txt",
               "sglang/0.5.11-utils-common-sm_checks.py.txt",
               "sglang/0.5.11-server_args-qwen3_5.py.txt",
               "if is_flashinfer_available() and not model_config.has_attention_sinks:\n"
               '                    return "{backend}"',
               "            is_sm100_supported()\n            and self.attention_backend is None"),
    "0.5.23": ("sglang/0.5.23-model_override_base-default_attn_backend.py.txt",
               "sglang/0.5.23-utils-common-sm_checks.py.txt",
               "sglang/0.5.23-model_overrides-qwen3_5.py.txt",
               'if get_platform().has_flashinfer and not model_config.has_attention_sinks:\n'
               '                return "{backend}"',
               "if not get_platform().is_sm100 or cfg.attention_backend is not None:"),
}


@pytest.mark.parametrize("entry, version", [
    (e, v) for e in BACKENDS["engine_default"]["sglang"] for v in e["read"]],
    ids=lambda x: x if isinstance(x, str) else "")
def test_sglang_default_backend_is_what_its_release_picks_on_12x(entry, version):
    assert SpecifierSet(entry["versions"]).contains(version)
    assert lower_bound(entry["versions"]) in entry["read"]  # the range starts at a read release
    default, checks, qwen, returns, qwen_gate = SGLANG_READ[version]
    text = excerpt(default)
    # MHA branch: Hopper -> fa3, SM100 -> trtllm_mha, else the recorded backend
    assert returns.format(backend=entry["backend"]) in text
    assert 'return "fa3"' in text and 'return "trtllm_mha"' in text
    # "SM100" is capability major 10 only: 12.x cells reach the last branch
    assert "device_capability_majors=[10], cuda_version=(12, 8)" in excerpt(checks)
    assert {a[:5] for a in entry["archs"]} == {"sm_12"}
    # the Qwen3.5/3.6 adjustment sets a backend only on SM100
    assert qwen_gate in excerpt(qwen)


def test_a_sglang_range_claims_no_release_beyond_those_read():
    for entry in BACKENDS["engine_default"]["sglang"]:
        end = upper_bound(entry["versions"])
        if end is not None:  # the last read release is just below where the range ends
            newest = max(entry["read"], key=Version)
            assert Version(newest).release[:2] == Version(end).release[:2] and \
                Version(end).release[2] == Version(newest).release[2] + 1, entry


@pytest.mark.parametrize("version", ["0.19.0", "0.33.0"])
def test_vllm_default_is_the_first_of_its_12x_priorities(version):
    entry = next(e for e in BACKENDS["engine_default"]["vllm"]
                 if SpecifierSet(e["versions"]).contains(version))
    gate = next(g for g in BACKENDS["hybrid_gdn"]["vllm"]
                if SpecifierSet(g["versions"]).contains(version))
    text = excerpt(f"vllm/{version}-platforms-cuda-backend_priorities.py.txt")
    last = text[text.rindex("return ["):]
    last = re.sub(r"\*\(\s*\[[^\]]*\]\s*if[^)]*\),", "", last)  # a 9.x-only entry
    order = re.findall(r"AttentionBackendEnum\.(\w+)", last)
    assert order[0] == entry["backend"] == gate["default"]
    assert order[:len(gate["allowed"])] == gate["allowed"]


def test_sglang_hybrid_gdn_gate_on_sm120_is_the_releases_assert():
    gate = next(g for g in BACKENDS["hybrid_gdn"]["sglang"]
                if g["versions"] == ">=0.5.23" and "sm_120" in g["archs"])
    text = excerpt("sglang/0.5.23-attention_registry-hybrid_gdn.py.txt")
    found = re.search(r"is_sm120:\n\s+allowed = \{([^}]*)\}", text)
    assert found and {s.strip().strip('"') for s in found.group(1).split(",")} == set(
        gate["allowed"])
    # the engine's own default is one its gate accepts
    default = next(e for e in BACKENDS["engine_default"]["sglang"] if e["versions"] == ">=0.5.23")
    assert default["backend"] in gate["allowed"]


def test_trtllm_mha_reaches_sm90_and_sm12x_from_sglang_0_5_23():
    entry, = BACKENDS["backends"]["trtllm_mha"]["engines"]["sglang"]
    text = excerpt(f"sglang/{lower_bound(entry['versions'])}-trtllm_mha_backend.py.txt")
    assert "self.use_fmha_v2 = get_platform().is_sm90 or get_platform().is_sm120" in text
    assert "Decode: uses XQA on SM90 and SM120" in text
    # is_sm120 is capability major 12: GB10 (12.1) too
    assert "device_capability_majors=[12]" in excerpt("sglang/0.5.23-utils-common-sm_checks.py.txt")
    assert set(entry["archs"]) == {"sm_90", "sm_120", "sm_121"}
    # 0.5.10 says the opposite: the range must not reach back to it
    assert "trtllm_mha does not support SM120" in excerpt(
        "sglang/0.5.10-server_args-default_attn_backend.py.txt")
    assert not SpecifierSet(entry["versions"]).contains("0.5.10")


def test_fa4_arch_list_is_the_interface_assert():
    text = excerpt("flash-attention/004b1a2e-cute-interface-arch.py.txt")
    majors = json.loads(re.search(r"arch // 10 in (\[[\d, ]+\])", text).group(1))
    archs = BACKENDS["backends"]["fa4"]["archs"]
    assert {int(re.match(r"sm_(\d+)", a).group(1)) // 10 for a in archs} == set(majors)
    assert 12 not in majors
    assert "004b1a2e" in BACKENDS["backends"]["fa4"]["source"]


# --- Triton's ptxas for Blackwell ----------------------------------------------------------------
def test_triton_runs_ptxas_blackwell_for_arch_100_up_from_3_6():
    fact = RULES["triton-ptxas"]
    for version in ("3.6.0", "3.8.0"):
        text = excerpt(f"triton/{version}-backends-nvidia-compiler-get_ptxas.py.txt")
        assert f"ptxas_blackwell if arch >= {fact['blackwell_from_arch']} else" in text
        assert Version(version) >= Version(fact["blackwell_from_triton"])
    older = excerpt("triton/3.5.1-backends-nvidia-compiler-get_ptxas.py.txt")
    assert "def get_ptxas() ->" in older and "blackwell" not in older.split("\n", 2)[2]
    knobs = excerpt("triton/3.8.0-knobs-ptxas.py.txt")
    assert 'env_nvidia_tool("ptxas-blackwell")' in knobs
    assert "binary.upper().replace('-', '_')}_PATH" in knobs
    assert fact["blackwell_variable"] == "TRITON_" + "ptxas-blackwell".upper().replace("-", "_") \
        + "_PATH"


# --- vLLM's MTP method name ---------------------------------------------------------------------
def test_vllm_mtp_method_of_the_matrix_is_the_floors_current_name():
    matrix = yaml.safe_load((ROOT / "matrix.yaml").read_text(encoding="utf-8"))
    flags = matrix["model"]["mtp"]["launch"]["vllm"]
    method = json.loads(flags[flags.index("--speculative-config") + 1])["method"]
    text = excerpt("vllm/0.19.0-config-speculative-mtp.py.txt")
    names = re.search(r"MTPModelTypes = Literal\[(.*?)\]", text, re.S).group(1)
    assert f'"{method}"' in names and '"qwen3_next_mtp"' in names
    assert f'self.method != "{method}"' in text and f'self.method = "{method}"' in text
    assert "is deprecated and replaced with mtp" in text
    assert "0.19.0" in matrix["model"]["mtp"]["source"]
    assert matrix["model"]["floors"]["vllm"] == ">=0.19.0"  # the release read is the floor
