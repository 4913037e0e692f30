"""Tokenization for the simulated engine: the model's own tokenizer, or a documented fallback.

The router hashes the same token ids the engine caches, so a simulated engine serving a model
must tokenize exactly as vLLM does for that model:

- completions: `tokenizer(prompt, add_special_tokens=True)` (BOS added by the tokenizer);
- chat: the chat template rendered to text with `add_generation_prompt=True`, then tokenized
  with `add_special_tokens=False` (the template itself writes BOS), as vLLM's renderer does.

`--tokenizer DIR` loads a Hugging Face tokenizer from a local directory (for example the tiny
model built by `pdorch dev tiny-model`); `--tokenizer builtin:words` is the readable demo mode
(`pools/sim/words.py`: English words, and sentences as output). Without it, `ByteTokenizer` is used:

- ids: `BOS = 1`, `EOS = 2`, byte `b` of the UTF-8 text is id `b + 3` (vocabulary 259);
- completions: `[BOS] + bytes`;
- chat: `[BOS]` + bytes of `"<|{role}|>\\n{content}\\n"` per message, plus `"<|assistant|>\\n"`
  for the generation prompt.

Generated text is the concatenation of each generated token's own text (`token_text`, cached
per id; special tokens give ""), so streaming never re-decodes the whole output. With a
byte-level BPE this equals decoding the whole sequence except where a token holds a partial
UTF-8 character (then the replacement character shows, the same way on every engine).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Protocol


class SimTokenizer(Protocol):
    """What the simulated server needs from a tokenizer."""

    name: str
    vocab_size: int
    eos_token_id: int | None

    def encode_prompt(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def encode_chat(
        self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]: ...

    def token_text(self, token_id: int) -> str: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """The deterministic fallback (see the module docstring for the exact mapping)."""

    BOS = 1
    EOS = 2
    OFFSET = 3

    def __init__(self) -> None:
        self.name = "byte-fallback"
        self.vocab_size = 256 + self.OFFSET
        self.eos_token_id: int | None = self.EOS

    def encode_prompt(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [b + self.OFFSET for b in text.encode()]
        return [self.BOS, *ids] if add_special_tokens else ids

    def encode_chat(
        self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        parts = [
            f"<|{m.get('role', 'user')}|>\n{_content_text(m.get('content'))}\n" for m in messages
        ]
        if add_generation_prompt:
            parts.append("<|assistant|>\n")
        return self.encode_prompt("".join(parts), add_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        if token_id < self.OFFSET:
            return ""
        return bytes([token_id - self.OFFSET]).decode("utf-8", errors="replace")

    def decode(self, token_ids: Sequence[int]) -> str:
        data = bytes(t - self.OFFSET for t in token_ids if t >= self.OFFSET)
        return data.decode("utf-8", errors="replace")


class HfTokenizer:
    """A Hugging Face tokenizer loaded from a local directory (no downloads)."""

    def __init__(self, path: str) -> None:
        from transformers import AutoTokenizer

        self.name = path
        self._tok: Any = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.vocab_size = len(self._tok)
        eos = self._tok.eos_token_id
        self.eos_token_id = int(eos) if eos is not None else None
        self._texts: dict[int, str] = {}

    def encode_prompt(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = self._tok(text, add_special_tokens=add_special_tokens)["input_ids"]
        return list(ids)

    def encode_chat(
        self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        rendered = self._tok.apply_chat_template(
            [dict(m) for m in messages], tokenize=False, add_generation_prompt=add_generation_prompt
        )
        return self.encode_prompt(str(rendered), add_special_tokens=False)

    def token_text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = str(self._tok.decode([token_id], skip_special_tokens=True))
            self._texts[token_id] = text
        return text

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(token_ids), skip_special_tokens=True))


def _content_text(content: Any) -> str:
    """OpenAI message content: a string or a list of `{"type": "text", "text": ...}` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))


@functools.lru_cache(maxsize=16)
def load_tokenizer(path: str | None) -> SimTokenizer:
    """The tokenizer for `path` (shared by every simulated engine in the process)."""
    if path is None:
        return ByteTokenizer()
    from pools.sim.words import WORDS_TOKENIZER, WordTokenizer

    if path == WORDS_TOKENIZER:
        return WordTokenizer()  # the readable demo mode (pools/sim/words.py)
    return HfTokenizer(path)
