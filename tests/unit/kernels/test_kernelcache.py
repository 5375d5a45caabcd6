"""Kernel wheel cache keys and the on-disk cache (no Docker)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from infermatrix.kernels import kernelcache as kc
from infermatrix.state import StatePaths

SPEC = {"package": "flash-attn", "version": "2.8.3", "gb_per_nvcc_thread": 5.0}


def key(**changes):
    args = dict(torch="2.11.0", cuda="13.0", python="3.12", archs=["sm_120"], stage_text="S")
    args.update(changes)
    return kc.make_key(changes.pop("spec", SPEC), **{k: v for k, v in args.items() if k != "spec"})


# The key of key(), written out: a change of the key's form orphans every cached wheel, so it
# must be a deliberate one (update this literal with it).
KNOWN_SLUG = "flash-attn-2.8.3-torch2.11.0-cu13.0-py3.12-sm120-1b08bbcf119b4ce5"


def test_same_inputs_same_key_in_any_process():
    assert key() == kc.KernelKey("flash-attn", "2.8.3", "2.11.0", "13.0", "3.12", ("sm_120",),
                                 (), hashlib.sha256(b"S").hexdigest()[:16], "linux/amd64")
    assert key().slug == KNOWN_SLUG
    code = ("from infermatrix.kernels import kernelcache as kc; print(kc.make_key(" + repr(SPEC) +
            ", torch='2.11.0', cuda='13.0', python='3.12', archs=['sm_120'], stage_text='S').slug)")
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
        assert out.strip() == KNOWN_SLUG


@pytest.mark.parametrize("change", [dict(torch="2.10.0"), dict(cuda="12.9"), dict(python="3.11"),
                                    dict(archs=["sm_121"]), dict(archs=["sm_120", "sm_121"]),
                                    dict(stage_text="other recipe"),
                                    dict(platform="linux/arm64")])
def test_each_part_of_the_key_matters(change):
    assert key(**change).slug != key().slug


def test_arch_order_does_not_matter():
    assert key(archs=["sm_121", "sm_120"]) == key(archs=["sm_120", "sm_121"])


def test_version_and_env_matter():
    other = dict(SPEC, version="2.8.2")
    assert key(spec=other).slug != key().slug
    with_env = dict(SPEC, env={"FLASH_ATTN_FORCE": "1"})
    assert key(spec=with_env).slug != key().slug


def test_slug_is_readable():
    slug = key().slug
    assert slug.startswith("flash-attn-2.8.3-torch2.11.0-cu13.0-py3.12-sm120-")
    assert "-sm121-arm64-" in key(archs=["sm_121"], platform="linux/arm64").slug


def test_match_engine_needs_the_resolved_version():
    spec = {"package": "flashinfer-python", "version": "match-engine", "gb_per_nvcc_thread": 4}
    with pytest.raises(ValueError):
        key(spec=spec)
    assert key(spec=spec, resolved_version="0.6.8").version == "0.6.8"


def test_local_source_tree_keyed_by_content(tmp_path):
    src = tmp_path / "pkg"
    (src / "src").mkdir(parents=True)
    (src / "src" / "a.cu").write_text("kernel A")
    spec = {"package": "cudakern", "version": "0.1.0", "path": "pkg", "gb_per_nvcc_thread": 1}
    first = key(spec=spec, source_root=tmp_path)
    assert first.version.startswith("src-")
    (src / "build").mkdir()
    (src / "build" / "junk.o").write_text("ignored")
    assert key(spec=spec, source_root=tmp_path) == first
    (src / "src" / "a.cu").write_text("kernel A changed")
    assert key(spec=spec, source_root=tmp_path) != first


def test_store_then_lookup_and_stage(tmp_path):
    state = StatePaths.at(tmp_path / "state")
    k = key()
    assert kc.lookup(state, k) is None
    built = tmp_path / "out" / "wheels"
    built.mkdir(parents=True)
    wheel = built / "flash_attn-2.8.3-cp312-cp312-linux_x86_64.whl"
    wheel.write_bytes(b"wheel bytes")
    entry = kc.store(state, k, kc.find_wheels(tmp_path / "out"), details={"by": "cell-a"})
    assert entry.directory == state.kernels / k.slug
    again = kc.lookup(state, k)
    assert again is not None and [w.name for w in again.wheels] == [wheel.name]
    # A second store of the same key keeps the first entry.
    assert kc.store(state, k, [wheel]).wheels == again.wheels
    placed = kc.stage_into([again], tmp_path / "ctx" / "kernel-wheels")
    assert [p.read_bytes() for p in placed] == [b"wheel bytes"]


def test_incomplete_entry_is_ignored_and_replaced(tmp_path):
    state = StatePaths.at(tmp_path / "state")
    k = key()
    leftover = state.kernels / k.slug
    leftover.mkdir(parents=True)
    (leftover / "half.whl").write_bytes(b"half")  # no entry.json: an interrupted store
    assert kc.lookup(state, k) is None
    wheel = tmp_path / "x-1-py3-none-any.whl"
    wheel.write_bytes(b"ok")
    entry = kc.store(state, k, [wheel])
    assert [w.name for w in entry.wheels] == [wheel.name]
    assert not (entry.directory / "half.whl").exists()


def test_store_refuses_nothing(tmp_path):
    with pytest.raises(ValueError):
        kc.store(StatePaths.at(tmp_path), key(), [])


def test_a_cells_kernel_keys_are_computed_once_per_run_and_again_for_a_new_dockerfile(
        monkeypatch):
    """The compile plan and the build both ask for a cell's kernel keys: one computation
    serves both, and a Dockerfile that changed (a new render) gets its own."""
    from infermatrix.stages import build
    from tests.support.render_support import GOLDEN_DIR, golden_context, golden_plans

    ctx = golden_context()
    plan = ctx.spec(next(p for p in golden_plans(ctx)
                         if p.id == "cu130-torch2.11.0-sglang0.5.11-sm121"))
    text = (GOLDEN_DIR / plan.id / "Dockerfile").read_text(encoding="utf-8")
    computed = []
    real = build._compute_kernel_keys
    monkeypatch.setattr(build, "_compute_kernel_keys",
                        lambda *a: computed.append(a[1].id) or real(*a))
    first = build.kernel_keys_for(ctx, plan, text)
    assert build.kernel_keys_for(ctx, plan, text) is first
    assert computed == [plan.id] and "flashinfer" in first
    changed = build.kernel_keys_for(ctx, plan, text + "\n# rendered again\n")
    assert computed == [plan.id, plan.id]
    assert {n: k.slug for n, k in changed.items()} == {n: k.slug for n, k in first.items()}


def test_a_local_entry_whose_wheel_changed_is_not_used_and_is_replaced(tmp_path, capsys):
    """Local entries are hashed again before use (issue 44): a wheel changed in the cache
    after it was stored is not taken; the next store of the key puts the compiled one back."""
    from infermatrix.kernels import kernelcache as cache
    from infermatrix.state import StatePaths

    state = StatePaths.at(tmp_path / "state")
    key = cache.make_key({"package": "flash-attn", "version": "2.8.3"}, torch="2.13.0",
                         cuda="13.0", python="3.11", archs=["sm_120"], stage_text="S")
    wheel = tmp_path / "out" / "flash_attn-2.8.3-cp311-cp311-linux_x86_64.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"compiled")
    entry = cache.store(state, key, [wheel])
    assert cache.lookup(state, key) is not None
    entry.wheels[0].write_bytes(b"changed in the cache")
    assert cache.lookup(state, key) is None
    assert "no longer hashes to the sha256 recorded" in capsys.readouterr().err
    again = cache.store(state, key, [wheel])
    assert again.wheels[0].read_bytes() == b"compiled" and cache.lookup(state, key) is not None
