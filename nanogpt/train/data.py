"""Batch sources: where the (x, y) token batches of a training step come from.

Three kinds, chosen by `data.kind`:

- `synthetic`: random token ids made on the device. No I/O at all, so a run measures the model
  alone. A small pool is generated once and cycled, so a batch costs nothing in the timed loop.
- `tokens`: a nanoGPT-format `.bin` file, i.e. a flat array of little-endian uint16 token ids.
  It is memory-mapped, and every batch reads `batch_size` windows at random offsets.
- `text`: any UTF-8 text file. It is tokenized once (GPT-2's BPE, or one id per character with
  data.tokenizer=char: nanogpt/train/tokenize.py), the ids are cached as a `.bin` keyed by the
  sha256 of the file's bytes, and from then on it is `tokens`.

Held out for the validation loss (bench.target_loss, scenarios/time_to_loss/run.py): `text`
keeps the last data.val_fraction of its tokens apart (nanoGPT's shakespeare_char split: the first
90 % train, the last 10 % validate); `tokens` reads nanoGPT's pair, train.bin at data.path and
val.bin beside it. A source opened with split="val" reads only those tokens; "train" never does.

A batch is `(x, y)`: two int64 tensors of shape (batch_size, block_size) on the target device,
where `y` is `x` shifted left by one token: the model at position t predicts token t + 1.

`check_data` validates a DataConfig without building anything heavy (validate/ runs it before
any model exists, in the sweep's own process, which does without torch: torch is imported where
a source is built); `open_source` runs it too, then builds the source.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from nanogpt.config.errors import ConfigError
from nanogpt.config.spec import DataConfig, DataKind, Tokenizer
from nanogpt.train.splits import check_val_length, split_range, text_cut, val_file
from nanogpt.train.tokenize import GPT2_VOCAB, TOKEN_DTYPE, tokenize_text

if TYPE_CHECKING:
    import torch


# How many synthetic batches to pre-generate. Cycling a few distinct batches (rather than one)
# keeps the inputs changing from step to step, at a memory cost of a few batches of int64.
SYNTHETIC_POOL = 4


@runtime_checkable
class BatchSource(Protocol):
    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y), each (batch_size, block_size) int64 on the device; y is x shifted by one."""
        ...


# ---------------------------------------------------------------------------------------------
# The one constructor
# ---------------------------------------------------------------------------------------------


def open_source(
    data: DataConfig,
    *,
    vocab_size: int,
    block_size: int,
    batch_size: int,
    device: torch.device,
    seed: int,
    split: str = "train",
) -> BatchSource:
    """Validate `data` (see check_data) and open the batch source it describes: its training
    tokens, or with split="val" its held-out ones."""
    val = split == "val"
    token_file = _checked_token_file(data, vocab_size=vocab_size, block_size=block_size, val=val)
    if token_file is None:  # synthetic
        return SyntheticSource(
            vocab_size=vocab_size,
            block_size=block_size,
            batch_size=batch_size,
            device=device,
            seed=seed,
        )
    path, start, end = split_range(data, token_file, split)
    return TokenFileSource(
        path,
        block_size=block_size,
        batch_size=batch_size,
        device=device,
        seed=seed,
        start=start,
        end=end,
    )


# ---------------------------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------------------------


class SyntheticSource:
    """Uniformly random token ids, generated on the device once, then cycled."""

    def __init__(
        self, *, vocab_size: int, block_size: int, batch_size: int, device: torch.device, seed: int
    ):
        import torch

        # A generator on the device itself: the ids never exist on the host, and the same seed
        # gives the same ids on the same kind of device (CPU and CUDA streams differ).
        generator = torch.Generator(device=device).manual_seed(seed)
        shape = (SYNTHETIC_POOL, batch_size, block_size + 1)
        pool = torch.randint(
            vocab_size, shape, generator=generator, device=device, dtype=torch.int64
        )
        # Split each window of block_size + 1 ids into input and target now, and make both
        # contiguous, so next_batch only indexes (the model calls .view(-1) on the targets).
        self._x = pool[:, :, :-1].contiguous()
        self._y = pool[:, :, 1:].contiguous()
        self._next = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        i = self._next
        self._next = (i + 1) % SYNTHETIC_POOL
        return self._x[i], self._y[i]


class TokenFileSource:
    """Random windows of a memory-mapped uint16 token file."""

    def __init__(
        self,
        path: Path,
        *,
        block_size: int,
        batch_size: int,
        device: torch.device,
        seed: int,
        start: int = 0,
        end: int | None = None,
    ):
        import torch

        self._from_numpy = torch.from_numpy
        # mode "r": read-only. Only the pages a batch touches are read from disk, and they
        # stay in the OS page cache, so a file far larger than RAM is fine. [start:end] is the
        # split's share (a view: nothing is read).
        self._tokens = np.memmap(path, dtype=TOKEN_DTYPE, mode="r")[start:end]
        self._block_size = block_size
        self._batch_size = batch_size
        self._device = device
        self._rng = np.random.default_rng(seed)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        t = self._block_size
        # A window is t + 1 ids (t inputs, plus one more for the last target), so the last
        # valid start is len - t - 1; `integers` excludes its upper bound.
        starts = self._rng.integers(0, len(self._tokens) - t, size=self._batch_size)
        # x and y side by side in one (2, batch, t) array: one host buffer, one copy to the
        # device, and x = pair[0], y = pair[1] come out contiguous. Assigning the uint16
        # windows into an int64 array widens them (embedding lookups want int64).
        pair = np.empty((2, self._batch_size, t), dtype=np.int64)
        for row, start in enumerate(starts):
            window = self._tokens[start : start + t + 1]
            pair[0, row] = window[:-1]
            pair[1, row] = window[1:]
        host = self._from_numpy(pair)
        if self._device.type == "cuda":
            # Page-locked memory lets the copy run asynchronously (non_blocking), overlapping
            # the GPU's work. PyTorch caches pinned blocks, so pinning each batch is cheap, and
            # it will not hand this block out again until the copy has finished.
            on_device = host.pin_memory().to(self._device, non_blocking=True)
        else:
            on_device = host.to(self._device)  # a no-op on CPU
        return on_device[0], on_device[1]


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


def check_data(data: DataConfig, *, vocab_size: int, block_size: int, val: bool = False) -> None:
    """Raise ConfigError if `data` cannot feed a model of this vocab_size and block_size (and
    with val=True, a validation loss too).

    For `text`, this tokenizes the file if it is not cached yet (a second or so per MB).
    """
    _checked_token_file(data, vocab_size=vocab_size, block_size=block_size, val=val)


def _checked_token_file(
    data: DataConfig, *, vocab_size: int, block_size: int, val: bool = False
) -> Path | None:
    """The checks of check_data; returns the token file to read, or None for synthetic."""
    kind = _kind(data)
    if kind is DataKind.synthetic:
        return None  # synthetic ignores data.path, so a sweep may vary data.kind alone
    if not 0 <= data.val_fraction < 1:
        raise ConfigError(
            "data.val_fraction", f"is {data.val_fraction}, outside [0, 1)", "use e.g. 0.1"
        )
    path = _existing_file(data.path, kind)
    tokenizer = Tokenizer(data.tokenizer).value
    token_file = tokenize_text(path, data.cache_dir, tokenizer) if kind is DataKind.text else path
    tokens = _open_tokens(token_file)
    # How the error messages below describe the data, in the user's terms (their file).
    if kind is DataKind.text:
        named = "GPT-2" if tokenizer == "gpt2" else "character"
        what = f"{path} encodes to {len(tokens)} {named} tokens"
        # GPT-2 text can encode to any GPT-2 id, so ask for the whole vocabulary, not just the
        # max seen; a character vocabulary is what the text holds.
        _check_vocab(tokens, vocab_size, what, at_least=GPT2_VOCAB if named == "GPT-2" else 0)
        cut = text_cut(len(tokens), data.val_fraction)
        _check_length(cut, block_size, f"{what}, {cut} of them for training")
        if val:
            check_val_length(len(tokens) - cut, block_size, what)
    else:
        what = f"{path} holds {len(tokens)} tokens"
        _check_vocab(tokens, vocab_size, what, at_least=0)
        _check_length(len(tokens), block_size, what)
        if val:
            held_out = val_file(path)
            val_tokens = _open_tokens(held_out)
            val_what = f"{held_out} holds {len(val_tokens)} tokens"
            _check_length(len(val_tokens), block_size, val_what)
            _check_vocab(val_tokens, vocab_size, val_what, at_least=0)
    return token_file


def _kind(data: DataConfig) -> DataKind:
    # Hydra hands us an Enum; a DataConfig built by hand may carry the plain string.
    try:
        return DataKind(data.kind)
    except ValueError:
        choices = " | ".join(k.value for k in DataKind)
        raise ConfigError("data.kind", f"is {data.kind!r}", f"use one of {choices}") from None


def _existing_file(path: str | None, kind: DataKind) -> Path:
    example = "train.bin" if kind is DataKind.tokens else "input.txt"
    if not path:
        raise ConfigError(
            "data.path",
            f"is not set but data.kind={kind.value} reads a file",
            f"set data.path=/path/to/{example}",
        )
    file = Path(path).expanduser()
    if not file.exists():
        where = "" if file.is_absolute() else f" (relative to {Path.cwd()})"
        raise ConfigError("data.path", f"{file} does not exist{where}", "check the path")
    if not file.is_file():
        raise ConfigError("data.path", f"{file} is not a file", f"point it at a {example}")
    return file


def _open_tokens(path: Path) -> np.memmap:
    """Memory-map a token file after checking its size is a whole, non-zero number of ids."""
    size = path.stat().st_size
    if size == 0:
        raise ConfigError("data.path", f"{path} is empty", "point it at a non-empty token file")
    if size % TOKEN_DTYPE.itemsize:
        raise ConfigError(
            "data.path",
            f"{path} has {size} bytes, not a whole number of uint16 tokens",
            "use a nanoGPT-format .bin, or set data.kind=text if it is a text file",
        )
    return np.memmap(path, dtype=TOKEN_DTYPE, mode="r")


def _check_length(n_tokens: int, block_size: int, what: str) -> None:
    # One training window is block_size inputs plus the target after the last one.
    if n_tokens >= block_size + 1:
        return
    fix = "use a longer file"
    if n_tokens >= 2:
        fix = f"lower model.block_size to at most {n_tokens - 1} or {fix}"
    raise ConfigError(
        "model.block_size",
        f"is {block_size}, so a window needs {block_size + 1} tokens, but {what}",
        fix,
    )


def _check_vocab(tokens: np.ndarray, vocab_size: int, what: str, at_least: int) -> None:
    # One full pass over the file (numpy streams through the memmap); an id >= vocab_size
    # would otherwise surface mid-run as an index error inside the embedding on the device.
    max_id = int(tokens.max())
    if max_id < vocab_size:
        return
    raise ConfigError(
        "model.vocab_size",
        f"is {vocab_size}, but {what} and the largest id is {max_id}",
        f"set model.vocab_size={max(max_id + 1, at_least)} or more (GPT-2's padded size is 50304)",
    )
