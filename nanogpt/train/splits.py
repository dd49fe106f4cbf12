"""Where a data source's training and validation tokens lie (nanogpt/train/data.py opens them).

A validation loss (bench.target_loss, docs/time_to_loss.md) needs tokens training never reads:
- `text` keeps the last data.val_fraction of its tokens apart, as nanoGPT's
  shakespeare_char/prepare.py does (n = len(ids); train = ids[:int(n * 0.9)], val the rest);
- `tokens` is nanoGPT's pair: train.bin at data.path, val.bin beside it.
"""

from __future__ import annotations

from pathlib import Path

from nanogpt.config.errors import ConfigError
from nanogpt.config.spec import DataConfig, DataKind
from nanogpt.train.tokenize import TOKEN_DTYPE

VAL_FILE = "val.bin"  # data=tokens: the validation tokens, beside data.path (nanoGPT's pair)


def text_cut(n_tokens: int, val_fraction: float) -> int:
    """Where text's training tokens end and its validation tokens begin (nanoGPT: n * 0.9)."""
    return int(n_tokens * (1 - val_fraction))


def split_range(data: DataConfig, token_file: Path, split: str) -> tuple[Path, int, int | None]:
    """The file and [start, end) of a split's tokens."""
    if DataKind(data.kind) is DataKind.tokens:
        return (val_file(token_file), 0, None) if split == "val" else (token_file, 0, None)
    cut = text_cut(token_file.stat().st_size // TOKEN_DTYPE.itemsize, data.val_fraction)
    return (token_file, cut, None) if split == "val" else (token_file, 0, cut)


def val_file(train: Path) -> Path:
    """data=tokens: the val.bin beside train.bin, which must exist."""
    val = train.parent / VAL_FILE
    if not val.is_file():
        raise ConfigError(
            "data.path",
            f"a validation loss reads {VAL_FILE} beside {train.name}, and {val} does not exist",
            f"put nanoGPT's {VAL_FILE} in {train.parent}, or unset bench.target_loss",
        )
    return val


def check_val_length(n_val: int, block_size: int, what: str) -> None:
    """data=text: the held-out share must hold at least one window."""
    if n_val >= block_size + 1:
        return
    raise ConfigError(
        "data.val_fraction",
        f"holds out {n_val} tokens but a validation window needs {block_size + 1} ({what})",
        "raise data.val_fraction (e.g. 0.1) or use a longer file",
    )
