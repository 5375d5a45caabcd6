"""What a model recommends for generation: sampling per thinking mode and the output length.

Sources, most specific first (each answer says which one it came from):
  1. the model directory's own `generation_config.json` (the checkpoint's defaults; Qwen3
     checkpoints carry the thinking-mode values there);
  2. data/model_cards.yaml: the card's recommendation per thinking mode, matched by the
     model's `model_type` (config.json, or its text_config);
  3. nothing: the server's own default (said so, never a silent temperature 0).
Pure: reads files it is given, no network.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..datafiles import DATA_DIR, read_data

DATA = DATA_DIR / "model_cards.yaml"
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                 "repetition_penalty")


def load_cards() -> dict[str, Any]:
    return read_data(DATA)


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters for one thinking mode, and where they came from."""

    params: dict[str, float | int]
    source: str

    def describe(self) -> str:
        if not self.params:
            return f"the server's default ({self.source})"
        shown = " ".join(f"{k} {v}" for k, v in self.params.items())
        return f"{shown} ({self.source})"


@dataclass(frozen=True)
class ModelDefaults:
    """A model's generation defaults per thinking mode ("thinking" / "plain")."""

    sampling: dict[str, Sampling] = field(default_factory=dict)
    max_output_tokens: dict[str, int] = field(default_factory=dict)
    thinking_default: bool | None = None
    card: str | None = None  # the model_cards.yaml entry used, if any

    def mode(self, thinking: bool | None) -> str:
        wanted = self.thinking_default if thinking is None else thinking
        return "thinking" if wanted else "plain"

    def sampling_for(self, thinking: bool | None) -> Sampling:
        return self.sampling.get(self.mode(thinking)) or Sampling({}, "no model defaults known")

    def output_cap(self, thinking: bool | None) -> int | None:
        return self.max_output_tokens.get(self.mode(thinking))


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def model_types(config: dict[str, Any] | None) -> list[str]:
    if not config:
        return []
    text = config.get("text_config")
    text = text if isinstance(text, dict) else {}
    return [t for t in (config.get("model_type"), text.get("model_type")) if isinstance(t, str)]


def card_for(types: list[str], cards: dict[str, Any] | None = None) -> tuple[str, dict] | None:
    cards = load_cards() if cards is None else cards
    for name, card in cards.items():
        if set(types) & set(card.get("model_types") or []):
            return name, card
    return None


def generation_config_sampling(config: dict[str, Any] | None) -> dict[str, float | int]:
    """The sampling keys of a generation_config.json. `do_sample: false` (greedy) with no
    temperature says nothing we should copy: greedy is what the cards warn against."""
    if not config:
        return {}
    params = {k: config[k] for k in SAMPLING_KEYS if isinstance(config.get(k), (int, float))
              and not isinstance(config.get(k), bool)}
    if config.get("do_sample") is False and "temperature" not in params:
        return {}
    return params


def model_defaults(model_dir: Path | None, cards: dict[str, Any] | None = None) -> ModelDefaults:
    """The defaults for the model in `model_dir` (None: no directory known)."""
    config = read_json(model_dir / "config.json") if model_dir else None
    generation = read_json(model_dir / "generation_config.json") if model_dir else None
    found = card_for(model_types(config), cards)
    sampling: dict[str, Sampling] = {}
    caps: dict[str, int] = {}
    thinking_default = None
    card_name = None
    if found:
        card_name, card = found
        thinking_default = card.get("thinking_default")
        for mode, params in (card.get("sampling") or {}).items():
            sampling[mode] = Sampling(dict(params), f"model card ({card_name} in "
                                                    "data/model_cards.yaml)")
        caps = {mode: int(v) for mode, v in (card.get("max_output_tokens") or {}).items()}
    own = generation_config_sampling(generation)
    if own:
        # The checkpoint's own values win for the mode it ships for: thinking where the model
        # thinks by default (Qwen3's generation_config holds its thinking values).
        mode = "plain" if thinking_default is False else "thinking"
        sampling[mode] = Sampling({**(sampling[mode].params if mode in sampling else {}),
                                   **own}, f"{model_dir}/generation_config.json")
    return ModelDefaults(sampling, caps, thinking_default, card_name)
