"""The model's real ops on the GPU, each against a torch reference (used by harness.gpu_check).

Qwen3.6-27B's shapes, bf16 inputs, float32 references:
  flash-attn   forward + backward at head dim 256 (the training profile), 24 query / 4 KV heads;
               backward with dropout where the device's shared memory allows it, and the known
               refusal where it does not (FLASH_ATTN_BWD_DROPOUT, mirrored in data/gpu_ops.yaml)
  flashinfer   batch prefill and batch decode over a paged bf16 KV cache, head dim 256
  gdn          Gated DeltaNet (16 key heads, 48 value heads, dim 128, conv width 4): chunked
               prefill (256 and 16 tokens) and recurrent decode against a naive recurrence,
               relative to the reference's RMS (GDN_TOLERANCES), with four negative controls
               run on the kernels under test (GDN_CONTROLS); and causal conv1d
  vLLM / SGLang decode  their fused-gating decode ops (the gating inputs, the state cache and
               its slots, as the engines' decode paths pass them), same comparison
Each check returns the harness result fields: status, reason, max_abs_error / atol / rtol per
compared tensor (GDN: rel_rms / rel_max / ratio, the largest error's place), shapes, the
implementation that ran. Standard library + torch only (the harness runs inside images); the
pure parts (tolerances, verdicts, the naive references) run on a CPU.
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
# Gated DeltaNet is compared relative to its signal instead (GDN_TOLERANCES).
TOLERANCES: dict[str, tuple[float, float]] = {
    "flash_attn.out": (2e-2, 2e-2),
    "flash_attn.grad": (5e-2, 5e-2),
    "flashinfer.prefill": (2e-2, 2e-2),
    "flashinfer.decode": (2e-2, 2e-2),
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
# Triton kernels run, not an opt-in Gluon/TileLang/CUDA backend). A spec may list alternatives
# ("a|b", the first that imports wins): the engines moved their copies (vllm 0.33.0:
# vllm/third_party/flash_linear_attention/ops; sglang 0.5.23: sglang/kernels/ops/attention/fla).
GDN_IMPLEMENTATIONS: list[dict[str, str]] = [
    {"name": "vllm",
     "chunk": "vllm.third_party.flash_linear_attention.ops:chunk_gated_delta_rule|"
              "vllm.model_executor.layers.fla.ops:chunk_gated_delta_rule",
     "recurrent": "vllm.third_party.flash_linear_attention.ops:fused_recurrent_gated_delta_rule|"
                  "vllm.model_executor.layers.fla.ops:fused_recurrent_gated_delta_rule",
     # vllm 0.33.0's decode ops (model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py), the
     # gating (g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)) fused in: a batch of
     # decodes only runs the packed one (_forward_core_decode_non_spec, while
     # VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE=1, the default); decodes batched with prefills,
     # and MTP (spec) decode, run the sigmoid-gating one (_forward_core)
     "packed_decode": "vllm.third_party.flash_linear_attention.ops.fused_recurrent:"
                      "fused_recurrent_gated_delta_rule_packed_decode",
     "gated_decode": "vllm.third_party.flash_linear_attention.ops.fused_sigmoid_gating:"
                     "fused_sigmoid_gating_delta_rule_update",
     "conv": "vllm.model_executor.layers.mamba.ops.causal_conv1d:causal_conv1d_fn"},
    {"name": "sglang",
     "chunk": "sglang.kernels.ops.attention.fla.chunk:chunk_gated_delta_rule|"
              "sglang.srt.layers.attention.fla.chunk:chunk_gated_delta_rule",
     "recurrent": "sglang.kernels.ops.attention.fla.fused_recurrent:"
                  "fused_recurrent_gated_delta_rule|"
                  "sglang.srt.layers.attention.fla.fused_recurrent:"
                  "fused_recurrent_gated_delta_rule",
     # sglang 0.5.23's decode (srt/layers/attention/linear/gdn_backend.py -> kernels/
     # gdn_triton.py: packed_decode, where supported: not on CPU/NPU) runs this one; its other
     # decode op (kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py) is not run
     "packed_decode": "sglang.kernels.ops.attention.fla.fused_recurrent:"
                      "fused_recurrent_gated_delta_rule_packed_decode",
     "conv": "sglang.kernels.ops.mamba.causal_conv1d_triton:causal_conv1d_fn|"
             "sglang.srt.layers.attention.mamba.causal_conv1d_triton:causal_conv1d_fn"},
    {"name": "fla", "chunk": "fla.ops.gated_delta_rule:chunk_gated_delta_rule",
     "recurrent": "fla.ops.gated_delta_rule:fused_recurrent_gated_delta_rule",
     "conv": "fla.modules.causal_conv1d:causal_conv1d"},
]

# The recurrent state's layout per op module: [N, HV, V, K] ("vk") in the engines' current copies
# (their docstrings: vllm 0.33.0 third_party/flash_linear_attention/ops/chunk.py and
# fused_recurrent.py "Initial state of shape `[N, HV, V, K]`"; sglang 0.5.23 fla/chunk.py and
# fused_recurrent.py the same), [N, HV, K, V] ("kv") in fla-core 0.6.0 (the 2026-12-02 H200 run
# matched the reference's state with it). At K = V = 128 a wrong layout raises nothing: the
# kernel silently reads the transposed state. Modules not named here are taken as "kv".
GDN_STATE_LAYOUT: dict[str, str] = {
    "vllm.third_party.flash_linear_attention.ops": "vk",
    "sglang.kernels.ops.attention.fla.chunk": "vk",
    "sglang.kernels.ops.attention.fla.fused_recurrent": "vk",
}

# GDN comparisons are relative to the signal: the error's RMS and its largest element, each over
# the reference's RMS; name -> (rms, max), the same as data/gpu_ops.yaml `gdn_tolerances` (a test
# holds them equal). The outputs at these inputs are small (RMS ~0.008), so the absolute
# tolerances of 0.02-0.03 used before let a 0.5x output pass. The correct kernel's error: the
# output is rounded to bf16 (relative step 2**-8): on the CPU, the exact recurrence rounded to
# bf16 gives rel_rms ~0.0017 and rel_max ~0.015-0.025 (tests/unit/harness/test_gpu_ops.py); the
# chunked kernels also round intermediates (w, u, the chunk states) to bf16. The engines' own
# kernels on an H100 (docs/h100-gdn-engine-kernels.txt, scripts/gdn_device_check.py, seeds 2-4):
# chunk out rel_rms 0.0042 (ratio 0.21, the binding term: a 4.8x margin), rel_max <= 0.080; chunk
# state 0.0032 / <= 0.085; the recurrent and the fused-gating decode ops rel_rms ~0.0017 (12x).
# A 0.8x output is 0.2 in RMS: 10x the rms tolerance. The max term is kept against the largest
# error over the reference's RMS, not relative to each element's own magnitude (an allclose-style
# bound): the chunk kernels' largest errors sit at large elements (|ref| 6-10 x RMS, error
# ~0.07 x RMS), so an element-wise bound would only have loosened the check; vLLM's larger
# errors of the 2026-12-06 runs (0.36 x RMS, 1.4x margin) came from feeding its chunk op a bf16
# beta, which the engines never do (docs/gdn-evidence.md).
GDN_TOLERANCES: dict[str, tuple[float, float]] = {
    "gdn.chunk.out": (0.02, 0.5),
    "gdn.chunk.state": (0.02, 0.5),
    "gdn.recurrent.out": (0.02, 0.5),
    "gdn.recurrent.state": (0.02, 0.5),
    "gdn.gated_decode.out": (0.02, 0.5),
    "gdn.gated_decode.state": (0.02, 0.5),
    "gdn.packed_decode.out": (0.02, 0.5),
    "gdn.packed_decode.state": (0.02, 0.5),
}

# The negative controls the GDN check runs on the real kernels: each is a deliberate corruption
# of the path under test (its inputs or its output), compared with the correct reference. Each
# must fail by at least GDN_CONTROL_MARGIN x its tolerance, else the check cannot tell that
# wrong kernel from the right one at its inputs and fails itself.
GDN_CONTROLS: dict[str, str] = {
    "output_x0.8": "the output scaled by 0.8",
    "no_decay": "the decay gate ignored (g = 0)",
    "no_initial_state": "the initial state dropped (zeros)",
    "heads_permuted": "value head i reads key head (i // group + 1) % H (GQA mapping off by one)",
}
GDN_CONTROL_MARGIN = 3.0


def resolve(spec: str):
    """`module:name`, or alternatives `a|b`: the first that imports."""
    errors = []
    for alternative in spec.split("|"):
        module, name = alternative.split(":")
        try:
            return getattr(importlib.import_module(module), name)
        except Exception as exc:  # noqa: BLE001 - the next alternative, else all reasons
            errors.append(f"{alternative}: {type(exc).__name__}: {exc}"[:300])
    if len(errors) == 1:
        raise ImportError(errors[0])
    raise ImportError("; ".join(errors))


def state_layout(op) -> str:
    """'vk' or 'kv': the state layout of the module that defines `op` (GDN_STATE_LAYOUT)."""
    module = getattr(op, "__module__", "") or ""
    for prefix, layout in GDN_STATE_LAYOUT.items():
        if module == prefix or module.startswith(prefix + "."):
            return layout
    return "kv"


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
            tried.append(f"{impl['name']}: {type(exc).__name__}: {exc}"[:600])
    return None, tried


def package_version(module: str) -> str | None:
    try:
        from importlib.metadata import packages_distributions, version

        dists = packages_distributions().get(module.split(".")[0], [])
        return f"{dists[0]} {version(dists[0])}" if dists else None
    except Exception:  # noqa: BLE001
        return None


def gdn_inputs(b: int, t: int, shapes: dict[str, int], gen, device: str = "cuda"):
    """bf16 q/k/v/beta, float32 log-decay g (decays in (0, 1), mean ~0.85) and a float32
    initial state [B, HV, K, V] of RMS 0.1 (the reference's layout)."""
    import torch

    h, hv, kd = shapes["gdn_k_heads"], shapes["gdn_v_heads"], shapes["gdn_head_dim"]
    bf16 = torch.bfloat16
    q = torch.randn(b, t, h, kd, device=device, generator=gen).to(bf16)
    k = torch.randn(b, t, h, kd, device=device, generator=gen).to(bf16)
    v = torch.randn(b, t, hv, kd, device=device, generator=gen).to(bf16)
    g = torch.nn.functional.logsigmoid(
        torch.randn(b, t, hv, device=device, generator=gen) + 2.0)
    beta = torch.sigmoid(torch.randn(b, t, hv, device=device, generator=gen)).to(bf16)
    state = torch.randn(b, hv, kd, kd, device=device, generator=gen) * 0.1
    return q, k, v, g, beta, state


def as_varlen(*tensors):
    """[B, T, ...] -> [1, B*T, ...] (the engines run prefill as one packed batch)."""
    return [x.reshape(1, -1, *x.shape[2:]) for x in tensors]


# The cases: (name, op, batch, tokens). The long prefill spans 4 chunks of 64; after 256 tokens
# the initial state has decayed (exp(sum g) ~ 1e-20), so the short prefill (16 tokens, inside
# one chunk) is where the initial state still shapes the output and the final state.
GDN_CASES: list[tuple[str, str, int, int]] = [
    ("chunk", "chunk", 2, 256),
    ("chunk_short", "chunk", 2, 16),
    ("recurrent", "recurrent", 4, 1),
]
# where the implementation has fused-gating decode ops (vllm 0.33.0), also these (one token per
# sequence: the engine runs them so)
GDN_DECODE_CASES: dict[str, tuple[str, str, int, int]] = {
    "packed_decode": ("packed_decode", "packed_decode", 4, 1),
    "gated_decode": ("gated_decode", "gated_decode", 4, 1),
}


def gdn_case_inputs(shapes: dict[str, int], gen, device: str = "cuda",
                    cases: list[tuple[str, str, int, int]] = GDN_CASES):
    return [(name, op, gdn_inputs(b, t, shapes, gen, device)) for name, op, b, t in cases]


def corrupt_inputs(control: str | None, q, k, v, g, beta, state):
    """The inputs a wrong kernel would in effect use (`control` from GDN_CONTROLS)."""
    import torch

    if control == "no_decay":
        g = torch.zeros_like(g)
    elif control == "no_initial_state":
        state = torch.zeros_like(state)
    elif control == "heads_permuted":
        q, k = q.roll(1, dims=2), k.roll(1, dims=2)
    return q, k, v, g, beta, state


def corrupt_output(control: str | None, o):
    return o * 0.8 if control == "output_x0.8" else o


def compare_relative(name: str, got, want) -> dict[str, Any]:
    """`got` against `want` relative to the signal: rel_rms = RMS(got - want) / RMS(want),
    rel_max = max|got - want| / RMS(want), each against GDN_TOLERANCES[name]; `ratio` is the
    larger of the two over its tolerance (pass iff ratio <= 1)."""
    import torch

    if name not in GDN_TOLERANCES:
        raise KeyError(f"no tolerance is known for {name}; add it to gpu_ops.GDN_TOLERANCES")
    tol_rms, tol_max = GDN_TOLERANCES[name]
    got64, want64 = got.detach().double().cpu(), want.detach().double().cpu()
    if got64.shape != want64.shape:
        return {"status": "fail", "ratio": float("inf"),
                "reason": f"{name}: shape {tuple(got64.shape)}, the reference has "
                          f"{tuple(want64.shape)}"}
    ref_rms = want64.pow(2).mean().sqrt().item()
    result: dict[str, Any] = {"tol_rms": tol_rms, "tol_max": tol_max, "ref_rms": ref_rms}
    if not bool(torch.isfinite(got64).all()):
        return {**result, "status": "fail", "ratio": float("inf"), "max_abs_error": float("inf"),
                "reason": f"{name}: non-finite values in the result"}
    if ref_rms == 0.0:
        return {**result, "status": "fail", "ratio": float("inf"),
                "reason": f"{name}: the reference is all zeros (no signal to compare against)"}
    err = got64 - want64
    rel_rms = err.pow(2).mean().sqrt().item() / ref_rms
    rel_max = err.abs().max().item() / ref_rms
    ratio = max(rel_rms / tol_rms, rel_max / tol_max)
    result.update(max_abs_error=err.abs().max().item(), rel_rms=rel_rms, rel_max=rel_max,
                  ratio=ratio, **largest_error(err, want64, ref_rms))
    if ratio > 1.0:
        return {**result, "status": "fail",
                "reason": f"{name}: differs from the torch reference (error RMS {rel_rms:.3g}, "
                          f"max {rel_max:.3g} x the reference's RMS {ref_rms:.3g}; tolerance "
                          f"{tol_rms} / {tol_max}: {ratio:.3g} x)"}
    return {**result, "status": "pass"}


def largest_error(err, want, ref_rms: float) -> dict[str, Any]:
    """Where the largest error is (`worst_index` into the compared tensor, the reference and
    the error there) and the largest error relative to (the reference's RMS + the element's
    own magnitude), `rel_elem`: rounding to bf16 scales with each element's magnitude."""
    flat = int(err.abs().argmax().item())
    index = [int(i) for i in _unravel(flat, tuple(err.shape))]
    elem = (err.abs() / (ref_rms + want.abs())).max().item()
    return {"worst_index": index, "worst_ref": want.reshape(-1)[flat].item(),
            "worst_error": err.reshape(-1)[flat].item(), "rel_elem": elem}


def _unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return index[::-1]


def gdn_compare_cases(ops: dict[str, Any], cases, references, scale: float,
                      control: str | None = None) -> dict[str, Any]:
    """Run `ops` ({'chunk'|'recurrent': fn(q, k, v, g, beta, scale, state) -> (o [B, T, HV, V],
    final [B, HV, K, V] or None)}) on each case, `control` applied, against `references`."""
    parts: dict[str, Any] = {}
    for (name, op, inputs), (ref_o, ref_state) in zip(cases, references):
        q, k, v, g, beta, state = corrupt_inputs(control, *inputs)
        o, final = ops[op](q, k, v, g, beta, scale, state)
        o = corrupt_output(control, o)
        parts[f"{name}.out"] = compare_relative(f"gdn.{op}.out", o, ref_o)
        if final is not None:
            parts[f"{name}.state"] = compare_relative(f"gdn.{op}.state", final, ref_state)
    return parts


def gdn_references(cases, scale: float):
    return [gdn_recurrence_reference(q, k, v, g, beta, scale, state)
            for _name, _op, (q, k, v, g, beta, state) in cases]


def judge_controls(controls: dict[str, dict[str, Any]],
                   margin: float = GDN_CONTROL_MARGIN) -> dict[str, Any]:
    """Each control's parts -> its margin (the largest ratio: the check fails by that much)
    and whether it failed clearly (margin >= `margin`)."""
    out: dict[str, Any] = {}
    for control, parts in controls.items():
        worst = max(parts, key=lambda p: parts[p].get("ratio", 0.0))
        got = parts[worst].get("ratio", 0.0)
        out[control] = {"what": GDN_CONTROLS[control], "margin": got, "worst": worst,
                        "ratios": {p: parts[p].get("ratio") for p in parts},
                        "status": "pass" if got >= margin else "fail"}
        if got < margin:
            out[control]["reason"] = (f"negative control {control} ({GDN_CONTROLS[control]}) "
                                      f"fails the comparison by only {got:.3g} x its tolerance "
                                      f"(needs {margin} x): the check cannot tell it apart")
    return out


def run_gdn_check(ops: dict[str, Any], shapes: dict[str, int], gen, device: str = "cuda",
                  controls: tuple[str, ...] | list[str] = tuple(GDN_CONTROLS),
                  cases: list[tuple[str, str, int, int]] = GDN_CASES) -> dict[str, Any]:
    """The GDN comparison of `ops` (the kernels, or a stand-in on the CPU) and its negative
    controls: {'parts': the real comparison, 'controls': judge_controls(...)}."""
    scale = shapes["gdn_head_dim"] ** -0.5
    case_inputs = gdn_case_inputs(shapes, gen, device, cases)
    references = gdn_references(case_inputs, scale)
    parts = gdn_compare_cases(ops, case_inputs, references, scale)
    judged = judge_controls({c: gdn_compare_cases(ops, case_inputs, references, scale, c)
                             for c in controls})
    return {"parts": parts, "controls": judged}


def engine_gdn_ops(chunk, recurrent, gated_decode=None, packed_decode=None) -> dict[str, Any]:
    """The engines' chunk / recurrent (and vLLM's fused-gating decode) ops as fn(q, k, v, g,
    beta, scale, state [B, HV, K, V]) -> (o [B, T, HV, V], final [B, HV, K, V]): packed varlen
    (cu_seqlens), l2norm in kernel, the state in the op's own layout."""
    import torch

    def to_op(state, layout):
        return state.transpose(-1, -2).contiguous() if layout == "vk" else state.clone()

    def done(o, bt, final, layout):
        """(o as [B, T, HV, V], `bt` being (B, T); the final state as [B, HV, K, V]) once
        the kernels finished."""
        if o.is_cuda:
            torch.cuda.synchronize()
        if final is not None and layout == "vk":
            final = final.transpose(-1, -2)
        return o.reshape(*bt, *o.shape[-2:]), final

    def seq_starts(q, dtype=torch.long):
        """cu_seqlens of a [B, T, ...] batch packed as one sequence."""
        b, t = q.shape[:2]
        return torch.arange(0, (b + 1) * t, t, dtype=dtype, device=q.device)

    def run_chunk(q, k, v, g, beta, scale, state):
        # beta as float32: both engines' gating gives the chunk op float32 beta (vllm 0.33.0
        # fused_post_conv_prep: "beta: [L, HV] float32"; sglang 0.5.23 fused_gdn_gating: a
        # float32 tensor of bf16-rounded values), and vLLM's chunk_scaled_dot_kkt keeps "the
        # promoted precision of the beta-scaled operand" in its dot (another kernel than bf16)
        layout = state_layout(chunk)
        h0 = to_op(state, layout)
        result = call_known(chunk, *as_varlen(q, k, v, g, beta.float()), scale=scale,
                            initial_state=h0,
                            output_final_state=True, cu_seqlens=seq_starts(q),
                            initial_state_indices=torch.arange(q.shape[0], dtype=torch.int32,
                                                               device=q.device),
                            inplace_update=True, use_qk_l2norm_in_kernel=True)
        o, final = (result[0], result[1]) if isinstance(result, tuple) else (result, None)
        if final is None and "inplace_update" in inspect.signature(chunk).parameters:
            final = h0                                   # sglang: written back in place
        return done(o, q.shape[:2], final, layout)

    def run_recurrent(q, k, v, g, beta, scale, state):
        b, t = q.shape[:2]
        layout = state_layout(recurrent)
        cu = seq_starts(q)
        q, k, v, g, beta = as_varlen(q, k, v, g, beta)
        result = call_known(recurrent, q, k, v, g=g, beta=beta, scale=scale,
                            initial_state=to_op(state, layout), output_final_state=True,
                            inplace_final_state=False, cu_seqlens=cu,
                            use_qk_l2norm_in_kernel=True)
        o, final = result if isinstance(result, tuple) else (result, None)
        return done(o, (b, t), final, layout)

    def decode_inputs(op, name, q, v, g, beta, state) -> dict[str, Any]:
        """What the engine's decode ops take besides q/k/v: the raw gating inputs a/b
        [tokens, HV] with the layer's A_log/dt_bias, the whole state cache (`initial_state`)
        with each sequence's slot (`ssm_state_indices`), l2norm in the kernel."""
        decode_only(q.shape[1], name)
        A_log, dt_bias = gating_params(v.shape[2], q.device)
        a, b = gating_inputs(g, beta, A_log, dt_bias)
        pool, slots = state_pool(to_op(state, state_layout(op)))
        return {"A_log": A_log, "a": a, "b": b, "dt_bias": dt_bias, "initial_state": pool,
                "ssm_state_indices": slots, "use_qk_l2norm_in_kernel": True}

    def run_gated_decode(q, k, v, g, beta, scale, state):
        # as vllm 0.33.0's _forward_core passes it for decodes: q/k/v [1, tokens, H(V), D],
        # the final state written back in place, cu_seqlens int32, no scale (the kernel's
        # K ** -0.5) and the softplus parameters (`beta`, `threshold`) left at their defaults
        inputs = decode_inputs(gated_decode, "gated_decode", q, v, g, beta, state)
        if not math.isclose(scale, q.shape[-1] ** -0.5):
            raise ValueError("the engine's sigmoid-gating decode passes no scale (K ** -0.5)")
        o, _pool = call_known(gated_decode, **inputs, q=as_varlen(q)[0].contiguous(),
                              k=as_varlen(k)[0].contiguous(), v=as_varlen(v)[0].contiguous(),
                              inplace_final_state=True, cu_seqlens=seq_starts(q, torch.int32))
        pool, slots = inputs["initial_state"], inputs["ssm_state_indices"]
        return done(o, q.shape[:2], pool[slots.long()], state_layout(gated_decode))

    def run_packed_decode(q, k, v, g, beta, scale, state):
        # as vllm 0.33.0's _forward_core_decode_non_spec passes it: mixed_qkv [tokens, q | k | v]
        # (the conv's output), scale = head_k_dim ** -0.5, out [tokens, 1, HV, V] (zeros); the
        # state is updated in place
        inputs = decode_inputs(packed_decode, "packed_decode", q, v, g, beta, state)
        b, hv = q.shape[0], v.shape[2]
        mixed = torch.cat([q.reshape(b, -1), k.reshape(b, -1), v.reshape(b, -1)], dim=-1)
        out = torch.zeros(b, 1, hv, v.shape[-1], dtype=v.dtype, device=q.device)
        call_known(packed_decode, **inputs, mixed_qkv=mixed.contiguous(), scale=scale, out=out)
        pool, slots = inputs["initial_state"], inputs["ssm_state_indices"]
        return done(out, q.shape[:2], pool[slots.long()], state_layout(packed_decode))

    ops = {"chunk": run_chunk, "recurrent": run_recurrent}
    if gated_decode is not None:
        ops["gated_decode"] = run_gated_decode
    if packed_decode is not None:
        ops["packed_decode"] = run_packed_decode
    return ops


def decode_only(tokens: int, op: str) -> None:
    if tokens != 1:
        raise ValueError(f"{op}: the engine runs it with one token per sequence, not {tokens}")


def gating_params(v_heads: int, device):
    """A layer's A_log and dt_bias [HV] float32 (as vLLM keeps them): A = exp(A_log) from 1 to
    16 (Qwen3-Next's initialisation range), dt_bias from -1 to 1."""
    import torch

    return (torch.linspace(1.0, 16.0, v_heads, device=device).log(),
            torch.linspace(-1.0, 1.0, v_heads, device=device))


def gating_inputs(g, beta, A_log, dt_bias):
    """The raw gating inputs (a, b), each [tokens, HV] float32, from which the engine's fused
    gating gives back g and beta: g = -exp(A_log) softplus(a + dt_bias) (softplus with
    beta 1, threshold 20), beta = sigmoid(b)."""
    import torch

    y = ((-g.float()) / A_log.exp()).clamp(min=1e-30)            # softplus(a + dt_bias) > 0
    a = y + torch.log(-torch.expm1(-y)) - dt_bias                 # softplus^-1(y) - dt_bias
    b = torch.logit(beta.float()).clamp(-30.0, 30.0)
    return a.reshape(-1, a.shape[-1]).contiguous(), b.reshape(-1, b.shape[-1]).contiguous()


def state_pool(states):
    """Per-sequence states [B, ...] -> (pool [B + 2, ...], slots int32 [B]) as vLLM's state cache
    holds them: sequence i in slot B - i (not the identity: a kernel that ignores the index reads
    another sequence's state); slot 0 is vLLM's NULL_BLOCK_ID (its decode kernels skip a
    sequence whose slot is <= 0, writing no output) and, with slot B + 1, is filled with NaN, so
    a kernel that read either gives a non-finite result."""
    import torch

    b = states.shape[0]
    pool = torch.full((b + 2, *states.shape[1:]), float("nan"), dtype=states.dtype,
                      device=states.device)
    slots = torch.arange(b, 0, -1, dtype=torch.int32, device=states.device)
    pool[slots.long()] = states
    return pool, slots


def reference_gdn_ops(round_output_to=None) -> dict[str, Any]:
    """The torch reference as the op under test (a CPU stand-in for the kernels in the unit
    tests), its output optionally rounded to a dtype (the kernels return bf16)."""
    def run(q, k, v, g, beta, scale, state):
        o, final = gdn_recurrence_reference(q, k, v, g, beta, scale, state)
        return (o.to(round_output_to).float() if round_output_to is not None else o), final

    return {"chunk": run, "recurrent": run, "gated_decode": run, "packed_decode": run}


def check_gdn(shapes: dict[str, int] = MODEL_SHAPES, preferred: str | None = None,
              required: bool = False, with_conv: bool = True, seed: int = 2) -> dict[str, Any]:
    impl, tried = gdn_implementation(preferred)
    if impl is None:
        reason = "no Gated DeltaNet implementation imports: " + "; ".join(tried)
        if not required:
            reason += " (not part of this image)"
        return {"status": "fail" if required else "skip", "reason": reason}
    import torch

    chunk, recurrent = resolve(impl["chunk"]), resolve(impl["recurrent"])
    decode = {op: resolve(impl[op]) for op in GDN_DECODE_CASES if impl.get(op)}
    cases = GDN_CASES + [GDN_DECODE_CASES[op] for op in decode]
    version = package_version(chunk.__module__)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    result = run_gdn_check(engine_gdn_ops(chunk, recurrent, **decode), shapes, gen, cases=cases)
    parts = dict(result["parts"])
    if with_conv:
        parts["conv1d"] = check_conv1d(impl, shapes, gen)
    weak = {f"control.{c}": r for c, r in result["controls"].items() if r["status"] == "fail"}
    ops = {"chunk": chunk, "recurrent": recurrent, **decode}
    out = combine({**parts, **weak},
                  implementation=impl["name"] + (f" ({version})" if version else ""),
                  ops={**{op: f"{fn.__module__}:{fn.__name__}" for op, fn in ops.items()},
                       "conv": impl["conv"]},
                  state_layout={op: state_layout(fn) for op, fn in ops.items()},
                  not_importable=tried,
                  shapes={"k_heads": shapes["gdn_k_heads"], "v_heads": shapes["gdn_v_heads"],
                          "head_dim": shapes["gdn_head_dim"], "conv_width": shapes["conv_width"],
                          "cases": [list(c) for c in cases], "dtype": "bfloat16",
                          "state_dtype": "float32"})
    out["compared"] = parts
    out["negative_controls"] = result["controls"]
    return out


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
