"""The model's real ops on the GPU, each against a torch reference (used by harness.gpu_check).

Qwen3.6-27B's shapes, bf16 inputs, float32 references:
  flash-attn   forward + backward at head dim 256 (the training profile), 24 query / 4 KV heads;
               backward with dropout where the device's shared memory allows it, and the known
               refusal where it does not (FLASH_ATTN_BWD_DROPOUT, mirrored in data/gpu_ops.yaml)
  flashinfer   batch prefill and batch decode over a paged bf16 KV cache, head dim 256
  gdn          Gated DeltaNet (16 key heads, 48 value heads, dim 128, conv width 4): chunked
               prefill and recurrent decode against a naive recurrence, and causal conv1d
Each check returns the harness result fields: status, reason, max_abs_error / atol / rtol per
compared tensor, shapes, the implementation that ran. Standard library + torch only (the harness
runs inside images); the pure parts (tolerances, verdicts, the naive references) run on a CPU.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
from typing import Any

# --------------------------------------------------------------------------------------------
# Facts (the harness cannot read src/infermatrix/data/gpu_ops.yaml inside an image; a test keeps
# these equal to it)
# --------------------------------------------------------------------------------------------

MODEL_SHAPES: dict[str, int] = {
    "head_dim": 256, "q_heads": 24, "kv_heads": 4,                       # full attention
    "gdn_k_heads": 16, "gdn_v_heads": 48, "gdn_head_dim": 128, "conv_width": 4,  # Gated DeltaNet
}

# (atol, rtol) per compared tensor: torch.allclose(got, want, atol, rtol) on float64 copies.
# bf16 has 8 bits of mantissa (relative step 2**-8 = 0.0039); kernels accumulate in fp32.
TOLERANCES: dict[str, tuple[float, float]] = {
    "flash_attn.out": (2e-2, 2e-2),
    "flash_attn.grad": (5e-2, 5e-2),
    "flashinfer.prefill": (2e-2, 2e-2),
    "flashinfer.decode": (2e-2, 2e-2),
    "gdn.chunk.out": (3e-2, 3e-2),
    "gdn.state": (3e-2, 3e-2),
    "gdn.recurrent.out": (2e-2, 2e-2),
    "conv1d": (2e-2, 2e-2),
}

# flash-attn 2 (>= 2.5.5, still so in 2.8.3): the head-dim-256 backward picks its tiles from the
# device's opt-in shared memory per block; below 144 KiB (sm86/sm89, and sm_120/sm_121 with
# 99 KiB) only the no-dropout kernel exists: with dropout nothing is launched and no error is
# raised (csrc/flash_attn/src/flash_bwd_launch_template.h, run_mha_bwd_hdim256; README: "Head dim
# 256 backward now works on consumer GPUs (if there's no dropout) as of flash-attn 2.5.5").
FLASH_ATTN_BWD_DROPOUT: dict[str, Any] = {
    "package": "flash-attn", "since": "2.5.5", "head_dim_min": 193, "head_dim_max": 256,
    "dropout_needs_smem_optin_bytes": 147456,
}


def tolerance(name: str) -> tuple[float, float]:
    if name not in TOLERANCES:
        raise KeyError(f"no tolerance is known for {name}; add it to gpu_ops.TOLERANCES")
    return TOLERANCES[name]


def verdict(name: str, max_abs_error: float, finite: bool, within: bool) -> dict[str, Any]:
    """The result of one comparison: within the tolerance of `name`, finite, or a fail."""
    atol, rtol = tolerance(name)
    result = {"max_abs_error": max_abs_error, "atol": atol, "rtol": rtol}
    if not finite:
        return {**result, "status": "fail",
                "reason": f"{name}: non-finite values in the GPU result"}
    if not within:
        return {**result, "status": "fail",
                "reason": f"{name}: GPU result differs from the torch reference "
                          f"(max abs error {max_abs_error:.3g}; atol {atol}, rtol {rtol})"}
    return {**result, "status": "pass"}


def compare(name: str, got, want) -> dict[str, Any]:
    """`got` against `want` with the tolerance of `name` (float64 copies on the CPU)."""
    import torch

    atol, rtol = tolerance(name)
    got64, want64 = got.detach().double().cpu(), want.detach().double().cpu()
    if got64.shape != want64.shape:
        return {"status": "fail", "reason": f"{name}: shape {tuple(got64.shape)}, the reference "
                                            f"has {tuple(want64.shape)}"}
    finite = bool(torch.isfinite(got64).all())
    err = (got64 - want64).abs().max().item() if finite else float("inf")
    return verdict(name, err, finite, finite and torch.allclose(got64, want64, atol=atol,
                                                                rtol=rtol))


def combine(parts: dict[str, dict[str, Any]], **facts: Any) -> dict[str, Any]:
    """Several comparisons as one check: fail if any failed (first reason), else pass."""
    failed = [p for p in parts.values() if p.get("status") == "fail"]
    out = {**facts, "compared": parts,
           "max_abs_error": max((p.get("max_abs_error", 0.0) for p in parts.values()), default=0.0),
           "status": "fail" if failed else "pass"}
    if failed:
        out["reason"] = "; ".join(p["reason"] for p in failed)
    return out


# --------------------------------------------------------------------------------------------
# Pure verdicts
# --------------------------------------------------------------------------------------------

def dropout_bwd_expected(head_dim: int, smem_optin_bytes: int,
                         rule: dict[str, Any] = FLASH_ATTN_BWD_DROPOUT) -> str:
    """'runs' or 'refused': what flash-attn's backward with dropout does at `head_dim` on a device
    with `smem_optin_bytes` of opt-in shared memory per block."""
    if rule["head_dim_min"] <= head_dim <= rule["head_dim_max"] and \
            smem_optin_bytes < rule["dropout_needs_smem_optin_bytes"]:
        return "refused"
    return "runs"


def judge_dropout_bwd(expected: str, error: BaseException | None,
                      grads: dict[str, Any] | None) -> dict[str, Any]:
    """The verdict on a backward with dropout: `error` is what the call raised (None: it
    returned), `grads` the comparison of its gradients with the reference (None: not compared)."""
    if expected == "refused":
        if error is not None:
            return {"status": "pass", "expected": expected,
                    "note": f"refused as known: {type(error).__name__}: {error}"[:400]}
        if grads is not None and grads.get("status") == "pass":
            return {"status": "pass", "expected": expected, "note": (
                "ran and matched the reference although the data says this device's shared "
                "memory allows no dropout backward at this head dim: the rule is out of date")}
        return {"status": "fail", "expected": expected, "reason": (
            "flash-attn accepted a backward with dropout at head dim 256 on a device below "
            f"{FLASH_ATTN_BWD_DROPOUT['dropout_needs_smem_optin_bytes']} bytes of shared memory "
            "per block and returned without error, but no kernel exists for it there: the "
            "gradients are not computed (silently wrong); train without dropout on this arch"
            + (f" ({grads['reason']})" if grads and grads.get("reason") else ""))}
    if error is not None:
        return {"status": "fail", "expected": expected,
                "reason": f"backward with dropout failed: {type(error).__name__}: {error}"[:600]}
    if grads is None:
        return {"status": "fail", "expected": expected, "reason": "gradients were not compared"}
    return {**grads, "expected": expected}


ENGINE_MODULES = ("vllm", "sglang")


def engine_claim(claimed: str | None = None, find_spec=importlib.util.find_spec) -> str | None:
    """The engine the image claims: the caller's word (`--engine`), else an importable engine."""
    if claimed and claimed != "none":
        return claimed
    if claimed == "none":
        return None
    for name in ENGINE_MODULES:
        try:
            if find_spec(name) is not None:
                return name
        except (ImportError, ValueError):
            continue
    return None


def triton_missing(engine: str | None) -> dict[str, Any]:
    """The verdict when triton does not import: every engine's GDN and attention paths launch
    Triton kernels, so in an engine image that is a failure, elsewhere a skip."""
    if engine:
        return {"status": "fail", "engine": engine,
                "reason": f"triton is not installed, but the image claims the engine {engine}, "
                          "whose Gated DeltaNet and attention paths are Triton kernels"}
    return {"status": "skip", "reason": "triton is not installed (no engine in this image)"}


# --------------------------------------------------------------------------------------------
# Torch references (float32; run on any device, the CPU included)
# --------------------------------------------------------------------------------------------

def attention_reference(q, k, v, causal: bool, scale: float | None = None, dropout_mask=None,
                        dropout_p: float = 0.0):
    """q [B, T, Hq, D], k/v [B, S, Hkv, D] -> [B, T, Hq, D] in float32. GQA by repeating KV
    heads; causal aligned to the end of the keys (as flash-attn and FlashInfer do for T < S);
    `dropout_mask` [B, Hq, T, S] of kept entries, scaled by 1/(1-p)."""
    import torch

    qf, kf, vf = (x.float().transpose(1, 2) for x in (q, k, v))  # [B, H, T, D]
    group = qf.shape[1] // kf.shape[1]
    kf, vf = kf.repeat_interleave(group, dim=1), vf.repeat_interleave(group, dim=1)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = (qf @ kf.transpose(-1, -2)) * scale
    if causal:
        t, s = scores.shape[-2:]
        keep = torch.ones(t, s, dtype=torch.bool, device=scores.device).tril(diagonal=s - t)
        scores = scores.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if dropout_mask is not None:
        probs = probs * dropout_mask.to(probs.dtype) / (1.0 - dropout_p)
    return (probs @ vf).transpose(1, 2)


def l2norm(x, eps: float = 1e-6):
    import torch

    return x / torch.sqrt((x.float() * x.float()).sum(-1, keepdim=True) + eps)


def gdn_recurrence_reference(q, k, v, g, beta, scale: float, initial_state=None,
                             qk_l2norm: bool = True):
    """The gated delta rule, one token at a time, in float32.

    q/k [B, T, H, K], v [B, T, HV, V], g (log decay) and beta [B, T, HV]; HV a multiple of H
    (value head i reads key head i // (HV // H)); state [B, HV, K, V]. Per token t:
        S = S * exp(g_t);  S += k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T (scale q_t)
    Returns (o [B, T, HV, V] float32, final state [B, HV, K, V] float32)."""
    import torch

    qf, kf, vf = q.float(), k.float(), v.float()
    if qk_l2norm:
        qf, kf = l2norm(qf), l2norm(kf)
    b, t, h, kd = qf.shape
    hv, vd = vf.shape[2], vf.shape[3]
    group = hv // h
    qf, kf = qf.repeat_interleave(group, dim=2), kf.repeat_interleave(group, dim=2)
    state = torch.zeros(b, hv, kd, vd, dtype=torch.float32, device=q.device) \
        if initial_state is None else initial_state.float().clone()
    out = torch.empty(b, t, hv, vd, dtype=torch.float32, device=q.device)
    gf, bf = g.float(), beta.float()
    for i in range(t):
        state = state * gf[:, i].exp()[..., None, None]
        k_i = kf[:, i]                                           # [B, HV, K]
        predicted = torch.einsum("bhk,bhkv->bhv", k_i, state)
        delta = (vf[:, i] - predicted) * bf[:, i][..., None]
        state = state + torch.einsum("bhk,bhv->bhkv", k_i, delta)
        out[:, i] = torch.einsum("bhk,bhkv->bhv", qf[:, i] * scale, state)
    return out, state


def causal_conv1d_reference(x, weight, bias=None, initial_state=None, silu: bool = True):
    """Depthwise causal conv over time: x [B, T, D], weight [D, W], bias [D], initial_state
    [B, D, W-1] (the previous W-1 inputs; zeros when None) -> [B, T, D] float32."""
    import torch

    b, t, d = x.shape
    width = weight.shape[-1]
    xf = x.float().transpose(1, 2)                               # [B, D, T]
    prefix = torch.zeros(b, d, width - 1, dtype=torch.float32, device=x.device) \
        if initial_state is None else initial_state.float()
    xf = torch.cat([prefix, xf], dim=-1)
    out = torch.nn.functional.conv1d(xf, weight.float().unsqueeze(1),
                                     None if bias is None else bias.float(), groups=d)
    out = out[..., -t:]
    if silu:
        out = torch.nn.functional.silu(out)
    return out.transpose(1, 2)


# --------------------------------------------------------------------------------------------
# flash-attn: forward + backward at head dim 256
# --------------------------------------------------------------------------------------------

def check_flash_attn(shapes: dict[str, int] = MODEL_SHAPES) -> dict[str, Any]:
    import flash_attn
    import torch
    from flash_attn import flash_attn_func

    d, hq, hkv = shapes["head_dim"], shapes["q_heads"], shapes["kv_heads"]
    gen = torch.Generator(device="cuda").manual_seed(0)

    def inputs(b: int, t: int):
        q = torch.randn(b, t, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(b, t, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(b, t, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        return [x.requires_grad_() for x in (q, k, v)]

    def grads_of(out, do, tensors):
        return torch.autograd.grad(out, tensors, do)

    # 1. causal forward + backward, no dropout (what training runs at p=0)
    b, t = 2, 512
    q, k, v = inputs(b, t)
    do = torch.randn(b, t, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    out = flash_attn_func(q, k, v, causal=True)
    dq, dk, dv = grads_of(out, do, (q, k, v))
    torch.cuda.synchronize()
    ref = attention_reference(q, k, v, causal=True)
    rq, rk, rv = grads_of(ref, do.float(), (q, k, v))
    parts = {"fwd": compare("flash_attn.out", out, ref),
             "bwd.dq": compare("flash_attn.grad", dq, rq),
             "bwd.dk": compare("flash_attn.grad", dk, rk),
             "bwd.dv": compare("flash_attn.grad", dv, rv)}

    # 2. backward with dropout: runs on a device with the shared memory for it, else refused
    smem = int(torch.cuda.get_device_properties(0).shared_memory_per_block_optin)
    expected = dropout_bwd_expected(d, smem)
    parts["bwd.dropout"] = dropout_bwd(flash_attn_func, inputs, expected, shapes)
    return combine(parts, implementation=f"flash_attn {flash_attn.__version__}",
                   shapes={"q": [b, t, hq, d], "kv": [b, t, hkv, d], "dtype": "bfloat16",
                           "causal": True, "dropout_case": [1, 128, hq, d]},
                   smem_optin_bytes=smem, dropout_bwd_expected=expected)


def dropout_bwd(flash_attn_func, inputs, expected: str, shapes: dict[str, int],
                p: float = 0.1) -> dict[str, Any]:
    """Forward with dropout returning the kept-entry mask (flash-attn encodes a dropped entry
    as a negative probability in S_dmask), then the backward against the reference's
    gradients under the same mask."""
    import torch

    q, k, v = inputs(1, 128)
    t = q.shape[1]
    do = torch.randn_like(q)
    error, grads = None, None
    try:
        out, _lse, s_dmask = flash_attn_func(q, k, v, dropout_p=p, causal=False,
                                             return_attn_probs=True)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - a refusal is the expected outcome on 99 KB
        error = exc
    if error is None:
        keep = s_dmask[:, :, :t, :t] >= 0
        ref = attention_reference(q, k, v, causal=False, dropout_mask=keep, dropout_p=p)
        rq, rk, rv = torch.autograd.grad(ref, (q, k, v), do.float())
        grads = combine({"fwd": compare("flash_attn.out", out, ref),
                         "dq": compare("flash_attn.grad", dq, rq),
                         "dk": compare("flash_attn.grad", dk, rk),
                         "dv": compare("flash_attn.grad", dv, rv)}, dropout_p=p)
    return judge_dropout_bwd(expected, error, grads)


# --------------------------------------------------------------------------------------------
# FlashInfer: batch prefill and batch decode over a paged KV cache
# --------------------------------------------------------------------------------------------

def paged_kv(lengths: list[int], page_size: int, hkv: int, d: int, gen):
    """A paged bf16 KV cache [pages, 2, page_size, Hkv, D] (NHD) holding `lengths` tokens per
    sequence in shuffled pages, its indptr/indices/last_page_len, and the dense K/V per sequence."""
    import torch

    pages_per = [(n + page_size - 1) // page_size for n in lengths]
    total = sum(pages_per)
    cache = torch.randn(total + 3, 2, page_size, hkv, d, device="cuda", dtype=torch.bfloat16,
                        generator=gen)
    order = torch.randperm(total + 3, device="cuda", generator=gen)[:total].to(torch.int32)
    indptr = torch.tensor([0, *torch.tensor(pages_per).cumsum(0).tolist()], dtype=torch.int32,
                          device="cuda")
    last = torch.tensor([n - (p - 1) * page_size for n, p in zip(lengths, pages_per)],
                        dtype=torch.int32, device="cuda")
    dense = []
    for i, n in enumerate(lengths):
        pages = cache[order[indptr[i]:indptr[i + 1]].long()]      # [p, 2, page, H, D]
        kv = pages.transpose(0, 1).reshape(2, -1, hkv, d)[:, :n]
        dense.append((kv[0], kv[1]))
    return cache, indptr, order, last, dense


def call_known(fn, *args, **kwargs):
    """Call `fn` with the keyword arguments its signature takes (releases add and drop some)."""
    parameters = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return fn(*args, **kwargs)
    return fn(*args, **{n: v for n, v in kwargs.items() if n in parameters})


def check_flashinfer_attention(shapes: dict[str, int] = MODEL_SHAPES) -> dict[str, Any]:
    import flashinfer
    import torch

    d, hq, hkv = shapes["head_dim"], shapes["q_heads"], shapes["kv_heads"]
    gen = torch.Generator(device="cuda").manual_seed(1)
    page_size = 16
    workspace = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    parts: dict[str, Any] = {}

    # prefill: 3 sequences, new tokens after a cached prefix (chunked prefill), causal
    kv_lens, q_lens = [300, 77, 130], [300, 13, 64]
    cache, indptr, indices, last, dense = paged_kv(kv_lens, page_size, hkv, d, gen)
    qo_indptr = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32,
                             device="cuda")
    q = torch.randn(sum(q_lens), hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    prefill = call_known(flashinfer.BatchPrefillWithPagedKVCacheWrapper, workspace, "NHD",
                         backend="fa2")
    call_known(prefill.plan, qo_indptr, indptr, indices, last, hq, hkv, d, page_size,
               causal=True, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    out = prefill.run(q, cache)
    torch.cuda.synchronize()
    ref = torch.cat([attention_reference(q[qo_indptr[i]:qo_indptr[i + 1]][None], kd[None],
                                         vd[None], causal=True)[0]
                     for i, (kd, vd) in enumerate(dense)])
    parts["prefill"] = compare("flashinfer.prefill", out, ref)

    # decode: 4 sequences, one new token each
    kv_lens = [1, 16, 257, 1000]
    cache, indptr, indices, last, dense = paged_kv(kv_lens, page_size, hkv, d, gen)
    q = torch.randn(len(kv_lens), hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    tensor_cores = hq // hkv > 4  # what SGLang and vLLM choose for a GQA group of 6
    decode = call_known(flashinfer.BatchDecodeWithPagedKVCacheWrapper, workspace, "NHD",
                        use_tensor_cores=tensor_cores, backend="fa2")
    call_known(decode.plan, indptr, indices, last, hq, hkv, d, page_size,
               q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    out = decode.run(q, cache)
    torch.cuda.synchronize()
    ref = torch.cat([attention_reference(q[i:i + 1][None], kd[None], vd[None], causal=False)[0]
                     for i, (kd, vd) in enumerate(dense)])
    parts["decode"] = compare("flashinfer.decode", out, ref)
    return combine(parts, implementation=f"flashinfer {flashinfer.__version__} (backend fa2)",
                   shapes={"head_dim": d, "q_heads": hq, "kv_heads": hkv, "page_size": page_size,
                           "prefill_q_lens": q_lens, "prefill_kv_lens": [300, 77, 130],
                           "decode_kv_lens": kv_lens, "decode_tensor_cores": tensor_cores,
                           "dtype": "bfloat16"})


# --------------------------------------------------------------------------------------------
# Gated DeltaNet: chunked prefill, recurrent decode, causal conv1d
# --------------------------------------------------------------------------------------------

# The first importable wins: the engine's own Triton ops, else the standalone package they
# derive from (flash-linear-attention, import `fla`; its backend dispatch is switched off so the
# Triton kernels run, not an opt-in Gluon/TileLang/CUDA backend).
GDN_IMPLEMENTATIONS: list[dict[str, str]] = [
    {"name": "vllm", "chunk": "vllm.model_executor.layers.fla.ops:chunk_gated_delta_rule",
     "recurrent": "vllm.model_executor.layers.fla.ops:fused_recurrent_gated_delta_rule",
     "conv": "vllm.model_executor.layers.mamba.ops.causal_conv1d:causal_conv1d_fn"},
    {"name": "sglang", "chunk": "sglang.srt.layers.attention.fla.chunk:chunk_gated_delta_rule",
     "recurrent": "sglang.srt.layers.attention.fla.fused_recurrent:"
                  "fused_recurrent_gated_delta_rule",
     "conv": "sglang.srt.layers.attention.mamba.causal_conv1d_triton:causal_conv1d_fn"},
    {"name": "fla", "chunk": "fla.ops.gated_delta_rule:chunk_gated_delta_rule",
     "recurrent": "fla.ops.gated_delta_rule:fused_recurrent_gated_delta_rule",
     "conv": "fla.modules.causal_conv1d:causal_conv1d"},
]


def resolve(spec: str):
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def gdn_implementation(preferred: str | None = None) -> tuple[dict[str, str] | None, list[str]]:
    """The first GDN implementation whose chunk op imports (or `preferred`), and why others
    did not."""
    import os

    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    tried: list[str] = []
    for impl in GDN_IMPLEMENTATIONS:
        if preferred and impl["name"] != preferred:
            continue
        try:
            resolve(impl["chunk"])
            return impl, tried
        except Exception as exc:  # noqa: BLE001 - reported as not importable
            tried.append(f"{impl['name']}: {type(exc).__name__}: {exc}"[:300])
    return None, tried


def package_version(module: str) -> str | None:
    try:
        from importlib.metadata import packages_distributions, version

        dists = packages_distributions().get(module.split(".")[0], [])
        return f"{dists[0]} {version(dists[0])}" if dists else None
    except Exception:  # noqa: BLE001
        return None


def gdn_inputs(b: int, t: int, shapes: dict[str, int], gen):
    import torch

    h, hv, kd = shapes["gdn_k_heads"], shapes["gdn_v_heads"], shapes["gdn_head_dim"]
    bf16 = torch.bfloat16
    q = torch.randn(b, t, h, kd, device="cuda", dtype=bf16, generator=gen)
    k = torch.randn(b, t, h, kd, device="cuda", dtype=bf16, generator=gen)
    v = torch.randn(b, t, hv, kd, device="cuda", dtype=bf16, generator=gen)
    g = torch.nn.functional.logsigmoid(
        torch.randn(b, t, hv, device="cuda", generator=gen) + 2.0)  # decays in (0, 1)
    beta = torch.sigmoid(torch.randn(b, t, hv, device="cuda", generator=gen)).to(bf16)
    state = torch.randn(b, hv, kd, kd, device="cuda", dtype=torch.float32, generator=gen) * 0.1
    return q, k, v, g, beta, state


def as_varlen(*tensors):
    """[B, T, ...] -> [1, B*T, ...] (the engines run prefill as one packed batch)."""
    return [x.reshape(1, -1, *x.shape[2:]) for x in tensors]


def check_gdn(shapes: dict[str, int] = MODEL_SHAPES, preferred: str | None = None,
              required: bool = False) -> dict[str, Any]:
    impl, tried = gdn_implementation(preferred)
    if impl is None:
        reason = "no Gated DeltaNet implementation imports: " + "; ".join(tried)
        if not required:
            reason += " (not part of this image)"
        return {"status": "fail" if required else "skip", "reason": reason}
    import torch

    chunk, recurrent = resolve(impl["chunk"]), resolve(impl["recurrent"])
    version = package_version(impl["chunk"].split(":")[0])
    kd = shapes["gdn_head_dim"]
    scale = kd ** -0.5
    gen = torch.Generator(device="cuda").manual_seed(2)
    parts: dict[str, Any] = {}

    # chunked prefill: 2 sequences of 256 tokens (4 chunks of 64), packed, with initial states
    b, t = 2, 256
    q, k, v, g, beta, state = gdn_inputs(b, t, shapes, gen)
    cu = torch.tensor([0, t, 2 * t], dtype=torch.long, device="cuda")
    o, final = call_known(chunk, *as_varlen(q, k, v, g, beta), scale=scale,
                          initial_state=state.clone(), output_final_state=True, cu_seqlens=cu,
                          use_qk_l2norm_in_kernel=True)
    torch.cuda.synchronize()
    ref_o, ref_state = gdn_recurrence_reference(q, k, v, g, beta, scale, state)
    parts["chunk.out"] = compare("gdn.chunk.out", o.reshape(b, t, *o.shape[2:]), ref_o)
    if final is not None:
        parts["chunk.state"] = compare("gdn.state", final, ref_state)

    # recurrent decode: 4 sequences, one token each, from a cached state
    b = 4
    q, k, v, g, beta, state = gdn_inputs(b, 1, shapes, gen)
    cu = torch.arange(b + 1, dtype=torch.long, device="cuda")
    result = call_known(recurrent, *as_varlen(q, k, v), g=as_varlen(g)[0], beta=as_varlen(beta)[0],
                        scale=scale, initial_state=state.clone(), output_final_state=True,
                        inplace_final_state=False, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    o, final = result if isinstance(result, tuple) else (result, None)
    torch.cuda.synchronize()
    ref_o, ref_state = gdn_recurrence_reference(q, k, v, g, beta, scale, state)
    parts["recurrent.out"] = compare("gdn.recurrent.out", o.reshape(b, 1, *o.shape[2:]), ref_o)
    if final is not None:
        parts["recurrent.state"] = compare("gdn.state", final, ref_state)

    parts["conv1d"] = check_conv1d(impl, shapes, gen)
    return combine(parts, implementation=impl["name"] + (f" ({version})" if version else ""),
                   ops={k: impl[k] for k in ("chunk", "recurrent", "conv")},
                   not_importable=tried,
                   shapes={"k_heads": shapes["gdn_k_heads"], "v_heads": shapes["gdn_v_heads"],
                           "head_dim": kd, "conv_width": shapes["conv_width"],
                           "prefill": [2, 256], "decode_batch": 4, "dtype": "bfloat16",
                           "state_dtype": "float32"})


def check_conv1d(impl: dict[str, str], shapes: dict[str, int], gen) -> dict[str, Any]:
    """Causal conv1d over the GDN's q/k/v projection (2*16*128 + 48*128 = 10240 channels)."""
    import torch

    width = shapes["conv_width"]
    channels = 2 * shapes["gdn_k_heads"] * shapes["gdn_head_dim"] + \
        shapes["gdn_v_heads"] * shapes["gdn_head_dim"]
    b, t = 2, 100
    x = torch.randn(b, t, channels, device="cuda", dtype=torch.bfloat16, generator=gen)
    weight = torch.randn(channels, width, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.5
    bias = torch.randn(channels, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.1
    conv = resolve(impl["conv"])
    if impl["name"] == "fla":
        out = call_known(conv, x, weight=weight, bias=bias, activation="silu", backend="triton")
        out = out[0] if isinstance(out, tuple) else out
    else:
        # the engines' varlen form: x [channels, tokens], conv_states [cache lines, channels,
        # width - 1], query_start_loc int32 [B + 1]
        packed = x.reshape(-1, channels).t().contiguous()
        states = torch.zeros(b, channels, width - 1, device="cuda", dtype=torch.bfloat16)
        loc = torch.tensor([0, t, 2 * t], dtype=torch.int32, device="cuda")
        out = call_known(conv, packed, weight, bias, conv_states=states, query_start_loc=loc,
                         cache_indices=torch.arange(b, dtype=torch.int32, device="cuda"),
                         has_initial_state=torch.zeros(b, dtype=torch.bool, device="cuda"),
                         activation="silu")
        out = out.t().reshape(b, t, channels)
    torch.cuda.synchronize()
    result = compare("conv1d", out, causal_conv1d_reference(x, weight, bias, silu=True))
    return {**result, "shape": [b, t, channels], "width": width}
