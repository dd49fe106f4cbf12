"""Text -> cached token ids: the two tokenizers of `data=text` (data.tokenizer).

- `gpt2`: tiktoken's GPT-2 BPE. We call `encode_ordinary`, which treats special-token text such
  as "<|endoftext|>" as plain text, and we append no end-of-text token: the file is one document,
  and EOT only matters as a separator between documents.
- `char`: one id per character, as nanoGPT's data/shakespeare_char/prepare.py does: the
  vocabulary is the sorted set of the text's characters (65 for tinyshakespeare), and a
  character's id is its position in it. A 4-layer model learns it in seconds on a CPU.

Either way the ids are written once as a nanoGPT-format uint16 .bin named by the tokenizer and
the sha256 of the file's bytes, and from then on the text is a token file (nanogpt/train/data.py).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import tiktoken

from nanogpt.config.errors import ConfigError
from nanogpt.record.files import user_cache_dir, write_atomic

# nanoGPT's on-disk format: token ids as uint16, little-endian ("<"), no header.
# uint16 holds ids up to 65535, enough for GPT-2's 50257-token vocabulary.
TOKEN_DTYPE = np.dtype("<u2")
ENCODING = "gpt2"
GPT2_VOCAB = 50257  # ids 0..50256, 50256 being <|endoftext|>


def tokenize_text(
    path: str | os.PathLike, cache_dir: str | os.PathLike | None = None, tokenizer: str = "gpt2"
) -> Path:
    """Tokenize a UTF-8 text file once; return the cached uint16 .bin.

    The cache file is named by the tokenizer and the sha256 of the text file's bytes, so editing
    the file (not touching it) re-tokenizes it, and a second call with the same bytes is a cache
    hit that only hashes the file. `cache_dir` defaults to $XDG_CACHE_HOME/nanogpt-sweep/tokens,
    falling back to ~/.cache/nanogpt-sweep/tokens. Raises ConfigError (data.path) for empty or
    non-UTF-8 files. Reads the whole file into memory: meant for corpora of up to a few hundred
    MB; tokenize bigger ones ahead of time and use data.kind=tokens.
    """
    path = Path(path).expanduser()
    raw = path.read_bytes()
    if not raw:
        raise ConfigError("data.path", f"{path} is empty", "point it at a non-empty text file")
    folder = Path(cache_dir).expanduser() if cache_dir else user_cache_dir() / "tokens"
    name = ENCODING if tokenizer == "gpt2" else tokenizer
    cached = folder / f"{name}-{hashlib.sha256(raw).hexdigest()}.bin"
    if cached.is_file():
        return cached  # written atomically, so if it exists it is complete
    text = _decode_utf8(raw, path)  # before loading the encoding, which may need the network
    if tokenizer == "char":
        ids = char_ids(text)
    else:
        ids = np.asarray(_gpt2_encoding().encode_ordinary(text), dtype=TOKEN_DTYPE)
    # Atomic (temp file + rename): a parallel reader sees no file or the whole file.
    write_atomic(cached, ids.tobytes())
    return cached


def char_vocab(text: str) -> list[str]:
    """The character vocabulary: the sorted set of the text's characters (nanoGPT's stoi)."""
    return sorted(set(text))


def char_ids(text: str) -> np.ndarray:
    """Each character's position in char_vocab(text), as uint16."""
    vocab = char_vocab(text)
    if len(vocab) > np.iinfo(TOKEN_DTYPE).max + 1:
        raise ConfigError(
            "data.tokenizer",
            f"is char but the text has {len(vocab)} distinct characters, more than uint16 holds",
            "use data.tokenizer=gpt2",
        )
    stoi = {ch: i for i, ch in enumerate(vocab)}
    return np.fromiter((stoi[ch] for ch in text), dtype=TOKEN_DTYPE, count=len(text))


def _gpt2_encoding():
    """tiktoken's GPT-2 encoding. tiktoken downloads its BPE files once into its cache
    (TIKTOKEN_CACHE_DIR); with no network and no cache that fails, which we say in one line."""
    try:
        return tiktoken.get_encoding(ENCODING)
    except Exception as err:
        raise ConfigError(
            "TIKTOKEN_CACHE_DIR",
            f"tiktoken could not load the {ENCODING} encoding ({type(err).__name__})",
            "set it to a directory holding tiktoken's cached BPE files, or allow network access",
        ) from None


def _decode_utf8(raw: bytes, path: Path) -> str:
    try:
        return raw.decode("utf-8")  # strict: a bad byte raises instead of becoming U+FFFD
    except UnicodeDecodeError as err:
        raise ConfigError(
            "data.path",
            f"{path} is not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start})",
            "convert it to UTF-8, or set data.kind=tokens if it is a token .bin",
        ) from None
