"""Prompts as token ids: a folder's tokenizer.json (the ``tokenizers`` library, local file only),
else bytes (UTF-8), which every vocabulary of 256 or more can hold. A seeded prompt of N tokens
draws ids from the portable generator, so every machine builds the same one."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import UsageError


class ByteTokenizer:
    """Token i is byte i; ids past 255 (a larger vocabulary's) decode as ``<i>``."""

    name = "bytes"

    def chat(self, text: str) -> str:
        raise UsageError("--chat needs the model's chat template; this model has no tokenizer (give --model-dir with "
                         "tokenizer_config.json or chat_template.jinja, a .gguf file, or a named real model)")

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) if 32 <= i < 127 or i in (9, 10) else f"<{i}>" for i in ids)


class FileTokenizer:
    """A tokenizer.json, read by Hugging Face's ``tokenizers``."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer  # lazy for start-up: tokenizers

        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises its own Exception type for a malformed file
            raise UsageError(f"{path}: not a tokenizer.json the tokenizers library can read ({exc})")
        self.name = str(path)
        self.folder = path.parent

    def chat(self, text: str) -> str:
        """``text`` as a user's turn in the folder's chat template, with the assistant's turn opened
        (transformers renders the template as ``from_pretrained`` would)."""
        from transformers import AutoTokenizer  # lazy for start-up: transformers

        tokenizer = AutoTokenizer.from_pretrained(str(self.folder), local_files_only=True)
        if not getattr(tokenizer, "chat_template", None):
            raise UsageError(f"--chat: {self.folder} has no chat template (tokenizer_config.json or chat_template.jinja)")
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)


def tokenizer_for(model_dir: str | Path | None) -> ByteTokenizer | FileTokenizer:
    path = Path(model_dir) / "tokenizer.json" if model_dir is not None else None
    return FileTokenizer(path) if path is not None and path.is_file() else ByteTokenizer()


def seeded_prompt(length: int, vocab_size: int, seed: int, stream: int = 0) -> list[int]:
    """``length`` ids in 0 .. min(vocab, 256)-1, from PCG64 (the same on every machine)."""
    bits = np.random.PCG64(np.random.SeedSequence([seed, stream, length]))
    raw = bits.random_raw(length) if length else np.zeros(0, dtype=np.uint64)
    return [int(v) for v in raw % np.uint64(min(vocab_size, 256))]


def prompt_ids(prompt: str | None, prompt_len: int | None, vocab_size: int, max_positions: int, gen_tokens: int,
               tokenizer: ByteTokenizer | FileTokenizer, seed: int, stream: int, chat: bool = False) -> list[int]:
    """Stream ``stream``'s prompt: the text (every stream the same, in the chat template with
    ``chat``) or a seeded one of N tokens (each stream its own); refused when prompt and generated
    tokens exceed the model's positions."""
    if prompt is not None and prompt_len is not None:
        raise UsageError("give --prompt TEXT or --prompt-len N, not both")
    if chat and prompt is not None:
        prompt = tokenizer.chat(prompt)
    ids = tokenizer.encode(prompt) if prompt is not None else seeded_prompt(prompt_len or 16, vocab_size, seed, stream)
    if not ids:
        raise UsageError("the prompt is empty: give a --prompt with text or a --prompt-len of 1 or more")
    if any(not 0 <= i < vocab_size for i in ids):
        raise UsageError(f"the prompt has token ids outside the vocabulary of {vocab_size}")
    if len(ids) + gen_tokens > max_positions:
        raise UsageError(f"the prompt ({len(ids)} tokens) and --gen-tokens {gen_tokens} need {len(ids) + gen_tokens} "
                         f"positions; the model has {max_positions}")
    return ids
