"""Batch sources: synthetic, tokens (.bin) and text (tiktoken GPT-2, cached), and their checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tiktoken
import torch

from nanogpt.config.errors import ConfigError
from nanogpt.config.spec import DataConfig, DataKind
from nanogpt.train.data import SYNTHETIC_POOL, BatchSource, check_data, open_source, tokenize_text

from .conftest import SHAKESPEARE, TIKTOKEN_CACHE, needs_shared

needs_tiktoken = pytest.mark.skipif(
    not TIKTOKEN_CACHE.is_dir(), reason="../shared/tiktoken_cache is not beside the repo"
)

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _offline_and_contained(monkeypatch, tmp_path):
    """tiktoken reads its BPE files from ../shared (no network); no cache escapes tmp_path."""
    if TIKTOKEN_CACHE.is_dir():
        monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(TIKTOKEN_CACHE))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture(scope="module")
def shakespeare_bin(tmp_path_factory) -> Path:
    """tinyshakespeare tokenized once for the whole module (about a second)."""
    if not (TIKTOKEN_CACHE.is_dir() and SHAKESPEARE.is_file()):
        pytest.skip("../shared is not beside the repo")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TIKTOKEN_CACHE_DIR", str(TIKTOKEN_CACHE))
        return tokenize_text(SHAKESPEARE, tmp_path_factory.mktemp("tokens"))


def write_tokens(path: Path, ids) -> Path:
    np.asarray(ids, dtype="<u2").tofile(path)
    return path


def take(source: BatchSource, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [source.next_batch() for _ in range(n)]


def assert_batch(x: torch.Tensor, y: torch.Tensor, batch_size: int, block_size: int) -> None:
    for t in (x, y):
        assert t.shape == (batch_size, block_size)
        assert t.dtype == torch.int64
        assert t.device.type == "cpu"
        assert t.is_contiguous()  # the model calls targets.view(-1)
    assert torch.equal(y[:, :-1], x[:, 1:])


# ---------------------------------------------------------------------------------------------
# synthetic
# ---------------------------------------------------------------------------------------------


def synthetic(seed: int = 0, vocab_size: int = 7, batch_size: int = 3, block_size: int = 5):
    return open_source(
        DataConfig(),
        vocab_size=vocab_size,
        block_size=block_size,
        batch_size=batch_size,
        device=CPU,
        seed=seed,
    )


def test_synthetic_batches_have_shape_dtype_range_and_shift():
    source = synthetic(vocab_size=7, batch_size=3, block_size=5)
    assert isinstance(source, BatchSource)
    seen = torch.cat([torch.cat(pair) for pair in take(source, SYNTHETIC_POOL)])
    for x, y in take(source, SYNTHETIC_POOL):
        assert_batch(x, y, batch_size=3, block_size=5)
    assert seen.min() >= 0 and seen.max() < 7
    assert set(seen.unique().tolist()) == set(range(7))  # 120 draws cover all 7 ids


def test_synthetic_is_seeded_and_cycles_a_pregenerated_pool():
    a, b, other = synthetic(seed=1), synthetic(seed=1), synthetic(seed=2)
    first = take(a, SYNTHETIC_POOL + 1)
    assert all(
        torch.equal(p[0], q[0]) for p, q in zip(first, take(b, SYNTHETIC_POOL + 1), strict=True)
    )
    assert not torch.equal(first[0][0], other.next_batch()[0])
    assert not torch.equal(first[0][0], first[1][0])  # consecutive batches differ ...
    assert first[SYNTHETIC_POOL][0].data_ptr() == first[0][0].data_ptr()  # ... and then repeat


def test_synthetic_ignores_data_path():
    # A sweep may vary data.kind alone (synthetic vs tokens) with one data.path for both.
    data = DataConfig(kind=DataKind.synthetic, path="/does/not/exist.bin")
    check_data(data, vocab_size=7, block_size=5)


# ---------------------------------------------------------------------------------------------
# tokens
# ---------------------------------------------------------------------------------------------


def tokens_source(path: Path, seed: int = 0, batch_size: int = 4, block_size: int = 8):
    return open_source(
        DataConfig(kind=DataKind.tokens, path=str(path)),
        vocab_size=5000,
        block_size=block_size,
        batch_size=batch_size,
        device=CPU,
        seed=seed,
    )


def test_tokens_batches_are_real_slices_of_the_file(tmp_path):
    # Ids 0..4999 in order, so a window's first id is its offset in the file.
    ids = np.arange(5000)
    source = tokens_source(write_tokens(tmp_path / "train.bin", ids), batch_size=4, block_size=8)
    starts = set()
    for x, y in take(source, 10):
        assert_batch(x, y, batch_size=4, block_size=8)
        for row_x, row_y in zip(x.numpy(), y.numpy(), strict=True):
            start = row_x[0]
            assert np.array_equal(row_x, ids[start : start + 8])
            assert np.array_equal(row_y, ids[start + 1 : start + 9])
            starts.add(int(start))
    assert len(starts) > 30  # random offsets, not the same few windows


def test_tokens_reads_little_endian_uint16_up_to_the_last_token(tmp_path):
    # Exactly block_size + 1 tokens: the only window is the whole file.
    ids = [1, 258, 65535 - 1, 7, 4096]
    path = tmp_path / "train.bin"
    path.write_bytes(b"".join(i.to_bytes(2, "little") for i in ids))
    source = open_source(
        DataConfig(kind=DataKind.tokens, path=str(path)),
        vocab_size=65535,
        block_size=4,
        batch_size=2,
        device=CPU,
        seed=0,
    )
    x, y = source.next_batch()
    assert x.tolist() == [ids[:-1]] * 2 and y.tolist() == [ids[1:]] * 2


def test_tokens_same_seed_same_batches(tmp_path):
    path = write_tokens(tmp_path / "train.bin", np.arange(5000))
    a, b, other = (tokens_source(path, seed=s) for s in (3, 3, 4))
    for (xa, ya), (xb, yb) in zip(take(a, 3), take(b, 3), strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.equal(tokens_source(path, seed=3).next_batch()[0], other.next_batch()[0])


# ---------------------------------------------------------------------------------------------
# text
# ---------------------------------------------------------------------------------------------


@needs_shared
def test_text_tokenizes_tinyshakespeare_with_gpt2(shakespeare_bin):
    ids = np.fromfile(shakespeare_bin, dtype="<u2")
    assert 300_000 < len(ids) < 400_000  # ~1.1 MB of English at ~3.3 bytes per token
    assert ids.max() < 50257
    text = SHAKESPEARE.read_text(encoding="utf-8")
    assert text.startswith(tiktoken.get_encoding("gpt2").decode(ids[:200].tolist()))
    assert shakespeare_bin.name.startswith("gpt2-") and shakespeare_bin.suffix == ".bin"
    assert not list(shakespeare_bin.parent.glob("*.tmp"))  # the atomic write left nothing


@needs_shared
def test_text_second_tokenize_is_a_cache_hit(shakespeare_bin):
    before = shakespeare_bin.stat().st_mtime_ns
    again = tokenize_text(SHAKESPEARE, shakespeare_bin.parent)
    assert again == shakespeare_bin
    assert again.stat().st_mtime_ns == before  # not rewritten
    assert [p.name for p in shakespeare_bin.parent.iterdir()] == [shakespeare_bin.name]


@needs_shared
def test_text_source_batches_come_from_the_cache(shakespeare_bin):
    data = DataConfig(
        kind=DataKind.text, path=str(SHAKESPEARE), cache_dir=str(shakespeare_bin.parent)
    )
    mtime = shakespeare_bin.stat().st_mtime_ns
    source = open_source(data, vocab_size=50304, block_size=32, batch_size=4, device=CPU, seed=0)
    ids = np.fromfile(shakespeare_bin, dtype="<u2")
    x, y = source.next_batch()
    assert_batch(x, y, batch_size=4, block_size=32)
    assert x.max() < 50257
    assert shakespeare_bin.stat().st_mtime_ns == mtime
    # Each row is a window of the tokenized file (find it by searching for its first 32 ids).
    windows = np.lib.stride_tricks.sliding_window_view(ids, 32)
    for row in x.numpy():
        assert (windows == row).all(axis=1).any()


@needs_tiktoken
def test_text_changed_file_retokenizes_and_default_cache_is_xdg(tmp_path):
    text = tmp_path / "input.txt"
    text.write_text("To be, or not to be, that is the question.\n", encoding="utf-8")
    first = tokenize_text(text)  # cache_dir None: $XDG_CACHE_HOME (set by the autouse fixture)
    assert first.parent == tmp_path / "xdg-cache" / "nanogpt-sweep" / "tokens"
    text.write_text("Whether 'tis nobler in the mind to suffer\n", encoding="utf-8")
    second = tokenize_text(text)
    assert second != first and first.is_file() and second.is_file()
    enc = tiktoken.get_encoding("gpt2")
    assert np.fromfile(second, dtype="<u2").tolist() == enc.encode_ordinary(text.read_text())


@needs_tiktoken
def test_text_keeps_special_token_text_ordinary_and_appends_no_eot(tmp_path):
    text = tmp_path / "input.txt"
    text.write_text("a<|endoftext|>b", encoding="utf-8")
    ids = np.fromfile(tokenize_text(text, tmp_path / "cache"), dtype="<u2").tolist()
    eot = tiktoken.get_encoding("gpt2").eot_token
    assert eot not in ids
    assert tiktoken.get_encoding("gpt2").decode(ids) == "a<|endoftext|>b"


# ---------------------------------------------------------------------------------------------
# check_data: every error names the config key to fix
# ---------------------------------------------------------------------------------------------


def _tokens(tmp_path: Path, ids) -> DataConfig:
    return DataConfig(kind=DataKind.tokens, path=str(write_tokens(tmp_path / "t.bin", ids)))


def _text(tmp_path: Path, raw: bytes) -> DataConfig:
    (tmp_path / "in.txt").write_bytes(raw)
    return DataConfig(kind=DataKind.text, path=str(tmp_path / "in.txt"), cache_dir=str(tmp_path))


def _odd_bytes(tmp_path: Path) -> DataConfig:
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02")
    return DataConfig(kind=DataKind.tokens, path=str(tmp_path / "odd.bin"))


def _missing(tmp_path: Path) -> DataConfig:
    return DataConfig(kind=DataKind.tokens, path=str(tmp_path / "nope.bin"))


def _directory(tmp_path: Path) -> DataConfig:
    return DataConfig(kind=DataKind.tokens, path=str(tmp_path))


# name: (make the DataConfig, block_size, vocab_size, key of the error, a phrase of its message)
ERRORS = {
    "tokens-path-unset": (lambda p: DataConfig(kind=DataKind.tokens), 8, 100, "data.path", "set "),
    "text-path-unset": (lambda p: DataConfig(kind="text", path=""), 8, 100, "data.path", "set "),
    "missing-file": (_missing, 8, 100, "data.path", "does not exist"),
    "directory": (_directory, 8, 100, "data.path", "not a file"),
    "odd-byte-size": (_odd_bytes, 1, 100, "data.path", "3 bytes"),
    "empty-bin": (lambda p: _tokens(p, []), 8, 100, "data.path", "empty"),
    "too-short": (lambda p: _tokens(p, range(10)), 16, 100, "model.block_size", "10 tokens"),
    "token-over-vocab": (lambda p: _tokens(p, [1, 300, 4] * 9), 8, 100, "model.vocab_size", "300"),
    "text-empty": (lambda p: _text(p, b""), 8, 50304, "data.path", "empty"),
    "text-not-utf8": (lambda p: _text(p, b"hello \xff world"), 2, 50304, "data.path", "offset 6"),
    "bad-kind": (lambda p: DataConfig(kind="csv", path="x"), 8, 100, "data.kind", "'csv'"),
}


# These tokenize, so they need tiktoken's BPE files: "hello world" is [31373, 995] in GPT-2.
def _hello(tmp_path: Path) -> DataConfig:
    return _text(tmp_path, b"hello world")


TIKTOKEN_ERRORS = {
    "text-too-short": (_hello, 16, 50304, "model.block_size", "2 GPT-2 tokens"),
    "text-over-vocab": (_hello, 1, 256, "model.vocab_size", "31373; set model.vocab_size=50257"),
}
CASES = [pytest.param(*case, id=name) for name, case in ERRORS.items()] + [
    pytest.param(*case, id=name, marks=needs_tiktoken) for name, case in TIKTOKEN_ERRORS.items()
]


@pytest.mark.parametrize("make, block_size, vocab_size, key, phrase", CASES)
def test_check_data_errors_name_the_key(tmp_path, make, block_size, vocab_size, key, phrase):
    data = make(tmp_path)
    with pytest.raises(ConfigError) as err:
        check_data(data, vocab_size=vocab_size, block_size=block_size)
    message = str(err.value)
    assert err.value.key == key and message.startswith(f"{key}: ")
    assert phrase in message, message
    assert message.endswith(".") and "\n" not in message
    # open_source runs the same checks before building anything.
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        open_source(
            data, vocab_size=vocab_size, block_size=block_size, batch_size=1, device=CPU, seed=0
        )


def test_check_data_accepts_a_file_of_exactly_one_window(tmp_path):
    check_data(_tokens(tmp_path, range(9)), vocab_size=9, block_size=8)
