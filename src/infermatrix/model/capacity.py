"""The capacity model (issue 46): how many sequences a GPU holds at a context length, the
bandwidth-bound decode ceiling in output tokens/s, and the hours a job takes. Pure apart from
reading data/capacity.yaml and the learned-efficiency file a caller names.

Figures come from data/capacity.yaml (each with its source); this module only does arithmetic,
and every result carries its steps, a list of (label, value, unit) lines a command prints, so
that the arithmetic can be checked by hand (docs/capacity.md).

Memory: the engine may take `gpu_memory_utilization` of the card; less the weights and a
reserve (activations, CUDA graphs, non-torch memory), the rest holds per sequence the KV cache
of the full-attention layers (grows with the tokens) and the Gated DeltaNet state (fixed).

Decode: a step reads all weights once, and per sequence its KV cache and its GDN state (read
and written back). Step time = bytes / (bandwidth x efficiency); tokens/s = batch / step time.
The efficiency comes from the data (an estimate with its source), an override, or the ratios of
measured to predicted tokens/s kept per GPU class (`record_ratio`, `efficiency_for`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple

from ..datafiles import DATA_DIR, read_data
from ..errors import DamagedStateFile, UnknownChoice, UsageError
from . import engines

SPEC_PATH = DATA_DIR / "capacity.yaml"
RATIOS_FILE = "capacity-efficiency.json"
GB = 1e9
GIB = 2**30
DEFAULT_MODEL = "qwen3.6-27b"
# The sequence the plan's capacity column and deploy's sizing assume: an 8K prompt and an 8K
# answer (thinking included); `capacity` and `deploy` take others.
PLAN_CONTEXT_TOKENS = 8192
PLAN_OUTPUT_TOKENS = 8192


class Step(NamedTuple):
    """One line of shown arithmetic."""

    label: str
    value: float
    unit: str

    def text(self) -> str:
        return f"{self.label} = {format_value(self.value, self.unit)}"


def format_value(value: float, unit: str) -> str:
    """`65,536 B`, `53.79 GB (53,791,996,928 B)`, `0.0781 s`, `346.2 tok/s`."""
    if unit == "B":
        if abs(value) >= 1e8:
            return f"{value / GB:,.2f} GB ({value:,.0f} B)"
        return f"{value:,.0f} B"
    if unit == "s":
        return f"{value:.4f} s"
    if isinstance(value, int) or float(value).is_integer():
        return f"{value:,.0f} {unit}".rstrip()
    return f"{value:,.2f} {unit}".rstrip()


# --- the data ---------------------------------------------------------------------------------

def spec() -> dict[str, Any]:
    return read_data(SPEC_PATH)


@dataclass(frozen=True)
class GpuClass:
    key: str
    name: str
    arch: str
    memory_bytes: int
    bandwidth_bytes_per_s: float
    gpu_memory_utilization: float
    reserve_bytes: int
    sources: Mapping[str, str] = field(default_factory=dict)
    # time a decode step takes beyond its bytes (scheduling, launches, the sampler): what
    # bounds a tiny model; 0 where the data has no measured figure
    step_overhead_s: float = 0.0


@dataclass(frozen=True)
class ModelShape:
    key: str
    name: str
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    full_attention_layers: int
    linear_attention_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    attn_output_gate: bool
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    temporal_dtype_bytes: int
    conv_dtype_bytes: int
    state_traffic_per_step: int
    source: str = ""


@dataclass(frozen=True)
class Profile:
    key: str
    description: str
    checkpoint: str
    weight_bytes: float
    scale_bytes_per_weight: float
    kv_bytes: float
    vllm_flags: tuple[str, ...] = ()


def _choose(kind: str, key: str, table: Mapping[str, Any], option: str) -> Mapping[str, Any]:
    if key not in table:
        raise UnknownChoice(f"unknown {kind} {key!r}: choose one of {', '.join(table)} "
                            f"({option}; data/capacity.yaml)")
    return table[key]


def gpu_for_arch(arch: str, data: Mapping[str, Any] | None = None) -> str | None:
    """The GPU class a matrix arch is served on (`sm_120` -> rtx-pro-6000, `sm_121` -> gb10,
    with or without an a/f suffix); the first class of that arch, None for an arch without
    one (the CPU lane)."""
    base = arch.rstrip("af")
    for key, row in (data or spec())["gpus"].items():
        if row["arch"] == base:
            return key
    return None


def profile_names(data: Mapping[str, Any] | None = None) -> list[str]:
    return list((data or spec())["profiles"])


def gpu_class(key: str, data: Mapping[str, Any] | None = None) -> GpuClass:
    """A GPU class of the data; UsageError (exit 2) naming the choices."""
    row = _choose("GPU", key, (data or spec())["gpus"], "--gpu")
    return GpuClass(key, row["name"], row["arch"], int(row["memory_bytes"]),
                    float(row["bandwidth_gb_s"]) * GB, float(row["gpu_memory_utilization"]),
                    int(float(row["reserve_gib"]) * GIB),
                    {k: v for k, v in row.items() if k.endswith("_source")},
                    float(row.get("step_overhead_ms") or 0.0) / 1000)


def model_shape(key: str, data: Mapping[str, Any] | None = None) -> ModelShape:
    row = _choose("model", key, (data or spec())["models"], "--model")
    s, state = row["shape"], row["state"]
    return ModelShape(
        key, row["name"], s["hidden_size"], s["intermediate_size"], s["vocab_size"],
        bool(s["tie_word_embeddings"]), s["full_attention_layers"],
        s["linear_attention_layers"], s["num_attention_heads"], s["num_key_value_heads"],
        s["head_dim"], bool(s["attn_output_gate"]), s["linear_num_key_heads"],
        s["linear_num_value_heads"], s["linear_key_head_dim"], s["linear_value_head_dim"],
        s["linear_conv_kernel_dim"], state["temporal_dtype_bytes"], state["conv_dtype_bytes"],
        state["traffic_per_step"], row.get("source", ""))


def profile(key: str, data: Mapping[str, Any] | None = None) -> Profile:
    row = _choose("profile", key, (data or spec())["profiles"], "--profile")
    return Profile(key, row["description"], row["checkpoint"], float(row["weight_bytes"]),
                   float(row.get("scale_bytes_per_weight") or 0), float(row["kv_bytes"]),
                   tuple(row.get("vllm_flags") or ()))


# --- bytes ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Parameters:
    """The text decoder's parameters in the groups a quantized checkpoint treats apart."""

    large: int  # the projections an FP8 checkpoint quantizes (MLP, attention, GDN in/out)
    embeddings: int  # embed_tokens and the untied lm_head (kept BF16)
    small: int  # norms, conv1d, A_log, dt_bias, in_proj_a/b (kept BF16)
    steps: tuple[Step, ...] = ()

    @property
    def total(self) -> int:
        return self.large + self.embeddings + self.small


def parameter_groups(shape: ModelShape) -> Parameters:
    """Parameters counted from the shape (a Qwen3.5/3.6 hybrid: gated attention + Gated
    DeltaNet + dense SwiGLU MLP in every layer)."""
    h, layers = shape.hidden_size, shape.full_attention_layers + shape.linear_attention_layers
    mlp = 3 * h * shape.intermediate_size  # gate, up, down
    q_out = shape.num_attention_heads * shape.head_dim * (2 if shape.attn_output_gate else 1)
    kv_out = shape.num_key_value_heads * shape.head_dim
    attn = h * q_out + 2 * h * kv_out + shape.num_attention_heads * shape.head_dim * h
    key_dim = shape.linear_num_key_heads * shape.linear_key_head_dim
    value_dim = shape.linear_num_value_heads * shape.linear_value_head_dim
    gdn_large = h * (2 * key_dim + value_dim) + h * value_dim + value_dim * h  # qkv, z, out
    heads = shape.linear_num_value_heads
    conv_dim = 2 * key_dim + value_dim
    gdn_small = (2 * h * heads  # in_proj_b, in_proj_a
                 + conv_dim * shape.linear_conv_kernel_dim  # depthwise conv1d
                 + 2 * heads  # A_log, dt_bias
                 + shape.linear_value_head_dim)  # gated RMSNorm
    norms = layers * 2 * h + h + shape.full_attention_layers * 2 * shape.head_dim  # + q/k norm
    large = (layers * mlp + shape.full_attention_layers * attn
             + shape.linear_attention_layers * gdn_large)
    embeddings = shape.vocab_size * h * (1 if shape.tie_word_embeddings else 2)
    small = shape.linear_attention_layers * gdn_small + norms
    steps = (
        Step(f"MLP per layer = 3 x {h} x {shape.intermediate_size}", mlp, "params"),
        Step(f"attention per layer = {h} x {q_out} + 2 x {h} x {kv_out} + "
             f"{shape.num_attention_heads * shape.head_dim} x {h}", attn, "params"),
        Step(f"GDN projections per layer = {h} x {2 * key_dim + value_dim} + {h} x "
             f"{value_dim} + {value_dim} x {h}", gdn_large, "params"),
        Step(f"large = {layers} x MLP + {shape.full_attention_layers} x attention + "
             f"{shape.linear_attention_layers} x GDN", large, "params"),
        Step(f"embeddings = {shape.vocab_size} x {h} x "
             f"{1 if shape.tie_word_embeddings else 2} (untied lm_head)", embeddings, "params"),
        Step("small (norms, conv1d, A_log, dt_bias, in_proj_a/b)", small, "params"),
        Step("text decoder parameters", large + embeddings + small, "params"),
    )
    return Parameters(large, embeddings, small, steps)


def weight_bytes(shape: ModelShape, prof: Profile) -> tuple[int, list[Step]]:
    """Bytes of the weights the engine loads: the large projections at the profile's width
    (plus its block scales), the rest at BF16."""
    params = parameter_groups(shape)
    large = params.large * (prof.weight_bytes + prof.scale_bytes_per_weight)
    kept = (params.embeddings + params.small) * 2
    total = int(round(large + kept))
    scales = f" (+ 1/{1 / prof.scale_bytes_per_weight:,.0f} B of block scales)" \
        if prof.scale_bytes_per_weight else ""
    return total, [
        Step(f"weights = {params.large:,} large params x {prof.weight_bytes:g} B{scales} + "
             f"{params.embeddings + params.small:,} embedding/small params x 2 B", total, "B")]


def kv_bytes_per_token(shape: ModelShape, prof: Profile) -> tuple[int, Step]:
    """KV cache per token: full-attention layers x (K, V) x KV heads x head dim x bytes."""
    value = int(shape.full_attention_layers * 2 * shape.num_key_value_heads * shape.head_dim
                * prof.kv_bytes)
    return value, Step(f"KV per token = {shape.full_attention_layers} layers x 2 (K,V) x "
                       f"{shape.num_key_value_heads} heads x {shape.head_dim} x "
                       f"{prof.kv_bytes:g} B", value, "B")


def conv_dim(shape: ModelShape) -> int:
    return (2 * shape.linear_num_key_heads * shape.linear_key_head_dim
            + shape.linear_num_value_heads * shape.linear_value_head_dim)


def state_bytes_per_sequence(shape: ModelShape) -> tuple[int, int, list[Step]]:
    """(temporal, conv) bytes of the Gated DeltaNet state of one sequence, all layers."""
    n = shape.linear_attention_layers
    temporal = (n * shape.linear_num_value_heads * shape.linear_value_head_dim
                * shape.linear_key_head_dim * shape.temporal_dtype_bytes)
    conv = n * (shape.linear_conv_kernel_dim - 1) * conv_dim(shape) * shape.conv_dtype_bytes
    return temporal, conv, [
        Step(f"GDN temporal state per sequence = {n} layers x {shape.linear_num_value_heads} "
             f"heads x {shape.linear_value_head_dim} x {shape.linear_key_head_dim} x "
             f"{shape.temporal_dtype_bytes} B", temporal, "B"),
        Step(f"GDN conv state per sequence = {n} layers x "
             f"{shape.linear_conv_kernel_dim - 1} x {conv_dim(shape)} x "
             f"{shape.conv_dtype_bytes} B", conv, "B"),
    ]


# --- memory: how many sequences ---------------------------------------------------------------

@dataclass(frozen=True)
class Sizing:
    max_sequences: int
    sequence_tokens: int
    weight_bytes: int
    budget_bytes: int  # memory x utilization
    free_bytes: int  # budget - weights - reserve (never below 0)
    per_sequence_bytes: int
    kv_per_token: int
    state_bytes: int
    steps: tuple[Step, ...]


def max_sequences(gpu: GpuClass, shape: ModelShape, prof: Profile, sequence_tokens: int,
                  gpu_memory_utilization: float | None = None) -> Sizing:
    """Sequences of `sequence_tokens` (prompt + output) that fit at once: (memory x
    utilization - weights - reserve) / (KV per token x tokens + GDN state), rounded down."""
    if sequence_tokens < 1:
        raise UsageError(f"a sequence of {sequence_tokens} tokens: give a positive length")
    util = gpu.gpu_memory_utilization if gpu_memory_utilization is None \
        else gpu_memory_utilization
    weights, steps = weight_bytes(shape, prof)
    budget = int(gpu.memory_bytes * util)
    free = max(budget - weights - gpu.reserve_bytes, 0)
    kv, kv_step = kv_bytes_per_token(shape, prof)
    temporal, conv, state_steps = state_bytes_per_sequence(shape)
    per_seq = kv * sequence_tokens + temporal + conv
    count = free // per_seq
    steps = [
        Step(f"memory the engine may use = {gpu.memory_bytes:,} B x {util:g}", budget, "B"),
        *steps,
        Step(f"reserve (activations, graphs, non-torch) = {gpu.reserve_bytes / GIB:g} GiB",
             gpu.reserve_bytes, "B"),
        Step("left for KV and GDN state = memory - weights - reserve", free, "B"),
        kv_step, *state_steps,
        Step(f"per sequence at {sequence_tokens:,} tokens = KV x {sequence_tokens:,} + "
             "temporal + conv", per_seq, "B"),
        Step("max sequences = floor(left / per sequence)", count, "seqs"),
    ]
    return Sizing(int(count), sequence_tokens, weights, budget, free, per_seq, kv,
                  temporal + conv, tuple(steps))


# --- bandwidth: the decode ceiling ------------------------------------------------------------

@dataclass(frozen=True)
class Ceiling:
    batch: int
    average_context: float
    bytes_per_step: float
    step_seconds: float
    tokens_per_s: float
    efficiency: float
    steps: tuple[Step, ...]


def decode_ceiling(gpu: GpuClass, shape: ModelShape, prof: Profile, batch: int,
                   average_context: float, efficiency: float) -> Ceiling:
    """Output tokens/s of one GPU decoding `batch` sequences of `average_context` tokens,
    bound by memory bandwidth: a step reads the weights once and, per sequence, its KV cache
    and its GDN state (read and written back)."""
    if not 0 < efficiency <= 1:
        raise UsageError(f"efficiency {efficiency:g}: give a fraction in (0, 1]")
    weights, _ = weight_bytes(shape, prof)
    kv, _ = kv_bytes_per_token(shape, prof)
    temporal, conv, _ = state_bytes_per_sequence(shape)
    state_traffic = shape.state_traffic_per_step * (temporal + conv)
    per_seq = kv * average_context + state_traffic
    total = weights + batch * per_seq
    bandwidth = gpu.bandwidth_bytes_per_s * efficiency
    step_s = total / bandwidth + gpu.step_overhead_s
    rate = batch / step_s if batch else 0.0
    steps = (
        Step(f"KV read per sequence = KV per token x {average_context:,.0f} average tokens",
             kv * average_context, "B"),
        Step(f"GDN state traffic per sequence = {shape.state_traffic_per_step} (read + write) "
             "x (temporal + conv)", state_traffic, "B"),
        Step(f"bytes per step = weights + {batch} x (KV read + GDN traffic)", total, "B"),
        Step(f"effective bandwidth = {gpu.bandwidth_bytes_per_s / GB:,.0f} GB/s x "
             f"{efficiency:.2f}", bandwidth / GB, "GB/s"),
        Step("step time = bytes / bandwidth" + (f" + {gpu.step_overhead_s * 1000:g} ms "
                                                "step overhead" if gpu.step_overhead_s else ""),
             step_s, "s"),
        Step(f"tokens/s = {batch} / step time", rate, "tok/s"),
    )
    return Ceiling(batch, average_context, total, step_s, rate, efficiency, steps)


# --- the forecast -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Forecast:
    prompts: int
    expected_output_tokens: int
    tokens_per_s_per_replica: float
    replicas: int
    total_tokens: int
    hours: float

    @property
    def days(self) -> float:
        return self.hours / 24

    def describe(self) -> str:
        if math.isinf(self.hours):
            return (f"forecast: {self.prompts:,} prompts x {self.expected_output_tokens:,} "
                    "output tokens cannot finish: the predicted throughput is 0")
        return (f"forecast: {self.prompts:,} prompts x {self.expected_output_tokens:,} output "
                f"tokens = {self.total_tokens / 1e6:,.1f} M tokens at "
                f"{self.tokens_per_s_per_replica:,.0f} tok/s x {self.replicas} replica"
                f"{'s' if self.replicas != 1 else ''} = {self.hours:,.1f} h "
                f"({self.days:,.1f} days), decode only")

    def as_dict(self) -> dict[str, Any]:
        return {"prompts": self.prompts, "expected_output_tokens": self.expected_output_tokens,
                "tokens_per_s_per_replica": self.tokens_per_s_per_replica,
                "replicas": self.replicas, "total_tokens": self.total_tokens,
                "hours": None if math.isinf(self.hours) else self.hours}


def forecast(prompts: int, expected_output_tokens: int,
             predicted_tokens_per_s_per_replica: float, replicas: int = 1) -> Forecast:
    """Hours to generate `prompts` x `expected_output_tokens` at the predicted output tokens/s
    of each of `replicas` servers (decode only: prefill and stragglers come on top)."""
    if prompts < 0 or expected_output_tokens < 0:
        raise UsageError("prompts and output tokens must not be negative")
    if replicas < 1:
        raise UsageError(f"{replicas} replicas: give at least 1")
    total = prompts * expected_output_tokens
    rate = predicted_tokens_per_s_per_replica * replicas
    hours = total / rate / 3600 if rate > 0 else (0.0 if total == 0 else math.inf)
    return Forecast(prompts, expected_output_tokens, predicted_tokens_per_s_per_replica,
                    replicas, total, hours)


# --- one answer: a GPU, a model, a profile, a workload ----------------------------------------

@dataclass(frozen=True)
class Estimate:
    gpu: GpuClass
    model: ModelShape
    profile: Profile
    context_tokens: int
    output_tokens: int
    sizing: Sizing
    ceiling: Ceiling
    efficiency_source: str
    forecast: Forecast | None = None

    @property
    def steps(self) -> tuple[Step, ...]:
        return self.sizing.steps + self.ceiling.steps

    def reaches(self, target: float) -> bool:
        return self.ceiling.tokens_per_s >= target

    def summary(self) -> str:
        """One short line for a plan column or a report row: `bf16 27 seqs, 346 tok/s`."""
        return (f"{self.profile.key} {self.sizing.max_sequences} seqs, "
                f"{self.ceiling.tokens_per_s:,.0f} tok/s")

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu.key, "model": self.model.key, "profile": self.profile.key,
            "checkpoint": self.profile.checkpoint, "vllm_flags": list(self.profile.vllm_flags),
            "context_tokens": self.context_tokens, "output_tokens": self.output_tokens,
            "max_sequences": self.sizing.max_sequences,
            "weight_bytes": self.sizing.weight_bytes,
            "kv_bytes_per_token": self.sizing.kv_per_token,
            "state_bytes_per_sequence": self.sizing.state_bytes,
            "per_sequence_bytes": self.sizing.per_sequence_bytes,
            "batch": self.ceiling.batch, "average_context": self.ceiling.average_context,
            "bytes_per_step": self.ceiling.bytes_per_step,
            "step_seconds": self.ceiling.step_seconds,
            "tokens_per_s": self.ceiling.tokens_per_s,
            "efficiency": self.ceiling.efficiency, "efficiency_source": self.efficiency_source,
            "forecast": self.forecast.as_dict() if self.forecast else None,
            "steps": [{"label": s.label, "value": s.value, "unit": s.unit}
                      for s in self.steps],
        }


def estimate(gpu_key: str, profile_key: str, context_tokens: int, output_tokens: int, *,
             model_key: str = DEFAULT_MODEL, efficiency: float | None = None,
             ratios_path: Path | None = None, batch: int | None = None,
             prompts: int | None = None, replicas: int = 1,
             data: Mapping[str, Any] | None = None) -> Estimate:
    """The whole answer for one profile: sequences that fit at context + output tokens, the
    decode ceiling at that batch (or `batch`) and the average context of a decode (context +
    half the output), and with `prompts` the hours over `replicas` servers."""
    if context_tokens < 0 or output_tokens < 0 or context_tokens + output_tokens < 1:
        raise UsageError("give a positive context and output length (tokens)")
    gpu, shape, prof = (gpu_class(gpu_key, data), model_shape(model_key, data),
                        profile(profile_key, data))
    if efficiency is None:
        efficiency, source = efficiency_for(gpu_key, ratios_path, data)
    else:
        source = "given (--efficiency)"
    sizing = max_sequences(gpu, shape, prof, context_tokens + output_tokens)
    chosen = sizing.max_sequences if batch is None else min(batch, sizing.max_sequences)
    ceiling = decode_ceiling(gpu, shape, prof, chosen, context_tokens + output_tokens / 2,
                             efficiency)
    plan = (forecast(prompts, output_tokens, ceiling.tokens_per_s, replicas)
            if prompts is not None else None)
    return Estimate(gpu, shape, prof, context_tokens, output_tokens, sizing, ceiling, source,
                    plan)


def max_num_seqs(gpu_key: str, profile_key: str, context_tokens: int, output_tokens: int = 0,
                 *, model_key: str = DEFAULT_MODEL, gpu_memory_utilization: float | None = None,
                 data: Mapping[str, Any] | None = None) -> int:
    """The value of the engine's max-concurrent-sequences flag (vLLM --max-num-seqs, SGLang
    --max-running-requests) for a GPU class and profile: the sequences of context + output
    tokens that fit. UsageError when not even one does (a shorter context, or a profile with
    narrower weights or KV cache, is the fix)."""
    sizing = max_sequences(gpu_class(gpu_key, data), model_shape(model_key, data),
                           profile(profile_key, data), context_tokens + output_tokens,
                           gpu_memory_utilization)
    if sizing.max_sequences < 1:
        raise UsageError(
            f"not one sequence of {sizing.sequence_tokens:,} tokens fits on {gpu_key} with the "
            f"{profile_key} profile: {sizing.free_bytes / GB:.2f} GB are left after the weights "
            f"and the reserve, one sequence needs {sizing.per_sequence_bytes / GB:.2f} GB",
            fix="serve a shorter context, or a profile with an FP8 KV cache or FP8 weights")
    return sizing.max_sequences


def max_seqs_flag(engine: str) -> str | None:
    """The engine's max-concurrent-sequences flag (data/engines.yaml); None: it has none."""
    return engines.row(engine).get("max_seqs_flag")


def best_profile(estimates: Iterable[Estimate], target: float) -> Estimate | None:
    """Of the estimates that reach `target` tok/s, the one with the widest weights (the
    closest to the BF16 checkpoint), then the fastest; None when none does."""
    reaching = [e for e in estimates if e.reaches(target)]
    if not reaching:
        return None
    return max(reaching, key=lambda e: (e.profile.weight_bytes, e.profile.kv_bytes,
                                        e.ceiling.tokens_per_s))


# --- learned efficiency -----------------------------------------------------------------------

def learned_efficiency(measured: float, predicted: float) -> float:
    """measured / predicted tokens/s of one run: the factor the predicted efficiency was off
    by (1.0: the model was right)."""
    if predicted <= 0 or measured < 0:
        raise ValueError(f"measured {measured} / predicted {predicted}: need predicted > 0")
    return measured / predicted


def ratios_path(state_root: Path) -> Path:
    """Where the ratios of one state directory are kept."""
    return Path(state_root) / RATIOS_FILE


_FIX = "delete it: the ratios are learned again from the next workload run"


def read_ratios(path: Path | None) -> dict[str, list[dict[str, Any]]]:
    """{gpu class: [{measured, predicted, ratio, efficiency, ...}, ...]}; {} when absent."""
    from ..state import read_state_json

    if path is None or not Path(path).is_file():
        return {}
    data = read_state_json(Path(path), "capacity efficiency file", _FIX)
    for gpu, runs in data.items():
        if not isinstance(runs, list) or not all(
                isinstance(r, dict) and isinstance(r.get("ratio"), (int, float)) for r in runs):
            raise DamagedStateFile(f"damaged capacity efficiency file: {gpu!r} is not a list "
                                   "of runs with a ratio", path, 1, _FIX)
    return data


def record_ratio(path: Path, gpu_key: str, measured: float, predicted: float,
                 efficiency: float, **extra: Any) -> dict[str, Any]:
    """Keep one run's measured / predicted tokens/s for `gpu_key` (`efficiency`: the one the
    prediction used); returns the entry written."""
    from ..state import write_json_atomic

    data = read_ratios(path)
    entry = {"measured": measured, "predicted": predicted,
             "ratio": learned_efficiency(measured, predicted), "efficiency": efficiency,
             **extra}
    data.setdefault(gpu_key, []).append(entry)
    write_json_atomic(Path(path), data)
    return entry


def efficiency_for(gpu_key: str, path: Path | None = None,
                   data: Mapping[str, Any] | None = None) -> tuple[float, str]:
    """(efficiency, where it comes from) for a GPU class: each recorded run's efficiency x
    its ratio, the median of them (capped at 1), else the data's default with its source."""
    runs = read_ratios(path).get(gpu_key, [])
    learned = [min(float(r.get("efficiency") or default_efficiency(data)) * float(r["ratio"]),
                   1.0) for r in runs if r["ratio"] > 0]
    if learned:
        value = statistics.median(learned)
        return value, (f"learned from {len(learned)} measured run"
                       f"{'s' if len(learned) != 1 else ''} on {gpu_key} ({path})")
    block = (data or spec())["efficiency"]
    return float(block["default"]), f"default: {' '.join(str(block['source']).split())}"


def default_efficiency(data: Mapping[str, Any] | None = None) -> float:
    return float((data or spec())["efficiency"]["default"])
