"""A tiny random-weight Llama with its own tokenizer, built locally for CPU tests.

No model can be downloaded on development machines or in CI, yet the real-engine tests need a
model that vLLM loads like any other. This module builds one from nothing: a `LlamaForCausalLM`
with random weights drawn from a fixed seed (bf16 safetensors, ~7 MB) and a byte-level BPE
tokenizer trained on text shipped with pdorch (`pools/data/tiny_corpus.txt`, extended with
sentences generated from a fixed seed), saved as a Hugging Face fast tokenizer with a
Llama-3-style chat template.

The same seed gives byte-identical files, so a test fixture or a cache keyed by the seed can
trust the directory without comparing weights.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
START_HEADER = "<|start_header_id|>"
END_HEADER = "<|end_header_id|>"
EOT = "<|eot_id|>"
SPECIAL_TOKENS = (BOS, EOS, START_HEADER, END_HEADER, EOT)

# Llama-3-shaped: every message is `header(role) + content + <|eot_id|>`; the generation prompt
# opens an assistant header. Kept in one line per block so the rendered prompt has no stray
# whitespace that would change the token ids between tokenizer and engine.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{ message['content'] | trim }}{{ '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)

# The corpus text is our own; the generated part only widens the BPE merge statistics so the
# trainer reaches the target vocabulary. Its seed is fixed (independent of the model seed) so
# every tiny model shares one tokenizer.
_CORPUS_SEED = 20240601
_GENERATED_SENTENCES = 6000
_SYLLABLES = (
    "ka",
    "ro",
    "mi",
    "ten",
    "sa",
    "lu",
    "per",
    "vo",
    "ni",
    "da",
    "gre",
    "sto",
    "lin",
    "mar",
    "qua",
    "bel",
    "zo",
    "fi",
    "tra",
    "cen",
    "dor",
    "ex",
    "ul",
    "pa",
    "ri",
    "mo",
    "an",
    "te",
    "or",
    "is",
    "ca",
    "ve",
    "na",
    "po",
    "el",
    "sul",
    "tor",
    "gen",
    "har",
    "wi",
)


class TinyModelSpec(BaseModel):
    """Shape of the tiny model. Defaults match docs/RUNTIME-FACTS.md (vLLM serves this on CPU)."""

    seed: int = Field(default=0, ge=0, description="Seed of the random weights.")
    vocab_size: int = Field(
        default=4096, ge=512, description="Target BPE vocabulary (incl. specials)."
    )
    hidden_size: int = Field(default=256, ge=32)
    intermediate_size: int = Field(default=512, ge=32)
    num_hidden_layers: int = Field(default=2, ge=1)
    num_attention_heads: int = Field(default=4, ge=1)
    num_key_value_heads: int = Field(default=4, ge=1)
    max_position_embeddings: int = Field(default=2048, ge=128)
    # Wider than Llama's 0.02: peaked logits make greedy decoding robust to the tiny numeric
    # differences between a disaggregated and a colocated run (fewer argmax ties).
    initializer_range: float = Field(default=0.08, gt=0)


def corpus_lines() -> Iterator[str]:
    """The tokenizer training text: the shipped corpus, then seeded generated sentences."""
    text = resources.files("pools").joinpath("data/tiny_corpus.txt").read_text(encoding="utf-8")
    yield from text.splitlines()
    words = sorted(set(text.replace(",", " ").replace(".", " ").split()))
    rng = random.Random(_CORPUS_SEED)
    for _ in range(_GENERATED_SENTENCES):
        parts: list[str] = []
        for _ in range(rng.randint(6, 16)):
            kind = rng.random()
            if kind < 0.55:
                parts.append(rng.choice(words))
            elif kind < 0.9:
                parts.append("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))))
            else:
                parts.append(str(rng.randint(0, 99999)))
        sentence = " ".join(parts)
        yield sentence[0].upper() + sentence[1:] + rng.choice((".", "?", "!", ":", ";"))


def _train_tokenizer(vocab_size: int) -> object:
    """Train a byte-level BPE (as GPT-2/Llama-3 use) and wire BOS insertion for prompts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines(), trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, bos_id)],
    )
    return tokenizer


def build_tiny_model(out_dir: Path, spec: TinyModelSpec | None = None) -> list[Path]:
    """Write the tiny model into `out_dir` (created if missing); return the files written.

    Deterministic: weights come from `spec.seed` on CPU, the tokenizer from fixed text and
    settings, and every JSON file is written with sorted keys.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    spec = spec or TinyModelSpec()
    out_dir.mkdir(parents=True, exist_ok=True)

    tokenizer_obj = _train_tokenizer(spec.vocab_size)
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer_obj,
        bos_token=BOS,
        eos_token=EOT,
        pad_token=EOS,
        additional_special_tokens=[START_HEADER, END_HEADER, EOS],
        model_max_length=spec.max_position_embeddings,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(out_dir))

    vocab = len(tokenizer)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    bos_id, eot_id, eos_id = (_single_id(ids[t], t) for t in (BOS, EOT, EOS))
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.initializer_range,
        bos_token_id=bos_id,
        eos_token_id=[eot_id, eos_id],
        pad_token_id=eos_id,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
        model.bfloat16()
    finally:
        torch.random.set_rng_state(generator_state)
    model.save_pretrained(str(out_dir), safe_serialization=True)

    for path in out_dir.glob("*.json"):
        # Re-serialise with sorted keys: some writers iterate sets or dicts in insertion order
        # that may depend on call history; sorted keys make the bytes a function of content.
        data = json.loads(path.read_text(encoding="utf-8"))
        if path.name == "tokenizer_config.json":
            data = _portable_tokenizer_config(data)
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return sorted(p for p in out_dir.iterdir() if p.is_file())


def _portable_tokenizer_config(data: dict[str, Any]) -> dict[str, Any]:
    """Name the tokenizer the way transformers 4 and 5 both load it.

    transformers 5 writes `TokenizersBackend` and a list under `extra_special_tokens`; GPU
    machines may run a vLLM on transformers 4, which knows `PreTrainedTokenizerFast` and
    `additional_special_tokens` (transformers 5 reads both too).
    """
    data = dict(data)
    data["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = data.get("extra_special_tokens")
    if isinstance(extra, list):
        data["additional_special_tokens"] = data.pop("extra_special_tokens")
    return data


def _single_id(value: int | list[int], token: str) -> int:
    """A special token's id; the tokenizer API also types lists (for batches of tokens)."""
    if not isinstance(value, int):
        raise TypeError(f"special token {token!r} maps to {value!r}, expected one id")
    return value
