"""A tiny random-weight model of the real Qwen3.6 text architecture, made offline in the image.

    python3 -m harness.make_fixture_model --out /tmp/model [--broken] [--seed 0]

Uses the image's own transformers (5.x: `Qwen3_5TextConfig`, `Qwen3_5ForCausalLM`,
model_type `qwen3_5_text`): 4 layers, 3 x linear_attention (Gated DeltaNet) + 1 x full_attention,
like each block of Qwen3.6-27B. Shapes suit vLLM's CPU kernels (full-attention head_dim 32,
gated-delta-net key/value head dims 64, hidden 64: knowledge/this-machine.md); `--broken` uses
linear head dims 16, which the CPU kernels reject at the first request while /health answers
200 (a fixture for a model level that must fail). A small byte-level BPE tokenizer is trained
with `tokenizers`; the chat template is ChatML and opens `<think>\\n` unless enable_thinking is
false (then it closes an empty think block, as Qwen3's template does). Random weights never
close `</think>`: a probe of this model checks structure, not meaning.
`--trained` (variant "trained"): the same architecture, then ~120 steps of AdamW on chat
transcripts in the job's shape (a short reasoning, `</think>`, an answer, `<|im_end|>`; with
thinking off the answer alone), so that sampled generations end on their own: the workload
level and `generate` see complete thinking answers (finish_reason stop), as with real weights.
Its generation_config.json carries sampling values, as Qwen3 checkpoints do. It learns the
shape, not facts: answers are checked for structure, never for meaning.
Writes `infermatrix-fixture.json` beside the model (variant, parameter count, versions).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

try:
    from ._result import emit
except ImportError:  # pragma: no cover
    from _result import emit  # type: ignore[no-redef]

FIXTURE_FILE = "infermatrix-fixture.json"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
THINK_TOKENS = ["<think>", "</think>"]  # plain added tokens: the reasoning parser reads them as text

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}"
    "{{- '<think>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

# Shapes: (normal, broken). Everything else is shared.
SHAPES: dict[str, dict[str, int]] = {
    "normal": {"linear_key_head_dim": 64, "linear_value_head_dim": 64},
    "broken": {"linear_key_head_dim": 16, "linear_value_head_dim": 16},
    "trained": {"linear_key_head_dim": 64, "linear_value_head_dim": 64},
}
# The trained fixture's transcripts: reasoning i goes with answer i (three, so sampling shows).
REASONING = ["let me think about this step by step.",
             "the question is short, so the answer is short.",
             "first i read the question, then i answer it."]
ANSWERS = ["the answer is paris.", "the answer is four.", "hello world, this is the answer."]
TRAIN_STEPS, TRAIN_BATCH, TRAIN_LR = 120, 8, 6e-3
# Sampling the trained fixture ships in its generation_config.json (the Qwen3 thinking values)
TRAINED_SAMPLING = {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}

CORPUS_WORDS = ["the", "capital", "of", "france", "is", "paris", "and", "the", "capital", "of", "italy", "is", "rome", "while", "berlin", "is", "the", "capital", "of", "germany", ".", "a", "model", "answers", "questions", "about", "cities", "rivers", "mountains", "numbers", "and", "colours", ".", "what", "is", "two", "plus", "two", "?", "four", ".", "think", "step", "by", "step", "before", "you", "answer", "the", "user", ".", "the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", ".", "hello", "world", ",", "this", "is", "a", "tiny", "test", "model", "for", "smoke", "tests", "of", "inference", "engines", "on", "machines", "without", "a", "gpu", ".", "reasoning", "comes", "first", "and", "the", "answer", "after"]


def corpus(lines: int = 400) -> list[str]:
    """Deterministic training text: rotations of a small English vocabulary, plus chat markup."""
    words = CORPUS_WORDS
    text = []
    for i in range(lines):
        start = (i * 7) % len(words)
        sentence = " ".join(words[start:] + words[:start])[: 40 + (i % 60)]
        text.append(sentence.capitalize() if i % 3 else sentence.upper())
    text += ["<|im_start|>user\nWhat is the capital of France?<|im_end|>"] * 5
    text += ["0123456789 () [] {} : ; ! ? ' \" - + * / = _ #"] * 5
    return text


def train_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def build_tokenizer(vocab_size: int):
    from transformers import AddedToken, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(vocab_size),
                                        eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.model_max_length = 4096
    return tokenizer


def build_config(variant: str, vocab_size: int, eos_id: int, pad_id: int):
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=2, linear_conv_kernel_dim=4,
        max_position_embeddings=4096, tie_word_embeddings=False,
        eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None,
        architectures=["Qwen3_5ForCausalLM"], dtype="bfloat16", **SHAPES[variant])


def transcript(tokenizer: Any, rng: Any) -> tuple[list[int], list[int]]:
    """One training example: (input ids, labels), the prompt's labels masked (-100)."""
    question = " ".join(rng.choice(CORPUS_WORDS) for _ in range(rng.randint(2, 12)))
    thinking = rng.random() < 0.7
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                           tokenize=False, add_generation_prompt=True,
                                           enable_thinking=thinking)
    pick = rng.randrange(len(ANSWERS))
    body = (REASONING[pick] + "\n</think>\n\n" if thinking else "") + ANSWERS[pick] + \
        "<|im_end|>"
    head = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    tail = tokenizer(body, add_special_tokens=False)["input_ids"]
    return head + tail, [-100] * len(head) + tail


def train_shape(model: Any, tokenizer: Any, pad_id: int, seed: int) -> dict[str, Any]:
    """Teach the random model the job's answer shape (reasoning, </think>, answer, end)."""
    import random

    import torch

    rng = random.Random(seed)
    model.float().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=TRAIN_LR)
    schedule = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.1, total_iters=TRAIN_STEPS)
    loss = None
    started = time.monotonic()
    for _ in range(TRAIN_STEPS):
        batch = [transcript(tokenizer, rng) for _ in range(TRAIN_BATCH)]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([i + [pad_id] * (width - len(i)) for i, _ in batch])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in batch])
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    return {"train_steps": TRAIN_STEPS, "train_loss": round(float(loss), 4) if loss is not None
            else None, "train_s": round(time.monotonic() - started, 1)}


def make_fixture(out: Path, variant: str = "normal", seed: int = 0) -> dict[str, Any]:
    import torch
    import transformers
    from transformers import GenerationConfig, Qwen3_5ForCausalLM

    torch.manual_seed(seed)
    tokenizer = build_tokenizer(vocab_size=1000)
    vocab_size = -(-len(tokenizer) // 64) * 64  # padded like real checkpoints
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = build_config(variant, vocab_size, eos_id, pad_id)
    model = Qwen3_5ForCausalLM(config)
    trained = train_shape(model, tokenizer, pad_id, seed) if variant == "trained" else {}
    model = model.to(torch.bfloat16).eval()
    sampling = TRAINED_SAMPLING if variant == "trained" else {"do_sample": False}
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id,
                                               **sampling)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    facts = {"fixture": True, "variant": variant, "seed": seed, "model_type": config.model_type,
             "architecture": "Qwen3_5ForCausalLM", "layer_types": config.layer_types,
             "parameters": sum(p.numel() for p in model.parameters()),
             "vocab_size": vocab_size, "tokenizer_size": len(tokenizer),
             "transformers": transformers.__version__, "torch": torch.__version__,
             **SHAPES[variant], **trained}
    (out / FIXTURE_FILE).write_text(json.dumps(facts, indent=2) + "\n", encoding="utf-8")
    return facts


def self_check(out: Path, trained: bool = False) -> dict[str, Any]:
    """Reload with transformers and generate a few tokens: the files form a working model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    thinking = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    plain = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                          enable_thinking=False)
    if not thinking.endswith("<think>\n") or not plain.endswith("</think>\n\n"):
        raise RuntimeError("chat template does not open/close <think> as expected")
    ids = tokenizer(thinking, return_tensors="pt")
    with torch.no_grad():
        generated = model.generate(**ids, max_new_tokens=48 if trained else 4, do_sample=False)
    text = tokenizer.decode(generated[0][ids["input_ids"].shape[1]:])
    if trained and not ("</think>" in text and text.endswith("<|im_end|>")):
        raise RuntimeError(f"the trained fixture did not learn the answer shape: {text!r}")
    return {"generated_tokens": int(generated.shape[1] - ids["input_ids"].shape[1]),
            **({"generated": text} if trained else {})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="directory to write the model to")
    parser.add_argument("--broken", action="store_true",
                        help="shapes the CPU kernels reject (linear head dims 16)")
    parser.add_argument("--trained", action="store_true",
                        help="train the model on the answer shape so generations end on their "
                        "own (the workload level's fixture)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-self-check", action="store_true",
                        help="skip reloading the model with transformers")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        variant = "broken" if args.broken else "trained" if args.trained else "normal"
        facts = make_fixture(args.out, variant, args.seed)
        if not args.no_self_check:
            facts["self_check"] = self_check(args.out, trained=variant == "trained")
    except Exception as exc:  # noqa: BLE001 - reported as the result
        return emit({"check": "fixture", "status": "fail", "reason": f"{type(exc).__name__}: {exc}"})
    return emit({"check": "fixture", "status": "pass", "out": str(args.out), **facts,
                 "duration_s": round(time.monotonic() - started, 3)})


if __name__ == "__main__":
    sys.exit(main())
