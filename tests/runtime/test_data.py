"""Samples depend on their global index only; replicas get contiguous shares of each iteration."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spantrain.errors import ExecutionError
from spantrain.plan import Plan
from spantrain.runtime.data import SampleStream, batch_slices, load_tokens, synthetic_corpus
from spantrain.runtime.models import IGNORE_INDEX


def test_synthetic_corpus_is_fixed_ascii_text():
    a, b = synthetic_corpus(4096), synthetic_corpus(4096)
    assert a.size == 4096 and np.array_equal(a, b)
    text = bytes(a).decode("ascii")
    assert "the " in text and "=" in text and "\n" in text


def test_a_sample_is_the_same_however_it_is_asked_for():
    stream = SampleStream(synthetic_corpus(1 << 14), seq_len=16, seed=3, vocab_size=256)
    x, y = stream.batch(5, 7)
    parts = [stream.batch(5 + i, 1) for i in range(7)]
    assert torch.equal(x, torch.cat([p[0] for p in parts])) and torch.equal(y, torch.cat([p[1] for p in parts]))
    # targets are the inputs shifted by one byte
    assert torch.equal(x[:, 1:], y[:, :-1])
    # another stream with the same seed agrees; another seed does not
    assert torch.equal(SampleStream(synthetic_corpus(1 << 14), seq_len=16, seed=3, vocab_size=256).batch(5, 7)[0], x)
    assert not torch.equal(SampleStream(synthetic_corpus(1 << 14), seq_len=16, seed=4, vocab_size=256).batch(5, 7)[0],
                           x)


def test_each_epoch_visits_every_window_once():
    stream = SampleStream(np.arange(161, dtype=np.uint8), seq_len=16, seed=0, vocab_size=256)
    assert stream.num_windows == 10
    firsts = sorted(int(x[0]) for x in stream.batch(10, 10)[0])  # the whole second epoch
    assert firsts == [16 * w for w in range(10)]


def test_masked_lm_masks_some_positions_and_targets_only_those():
    stream = SampleStream(synthetic_corpus(1 << 14), seq_len=32, seed=0, vocab_size=300, masked_lm=True)
    x, y = stream.batch(0, 8)
    masked = x == 299
    assert masked.any(dim=1).all()
    assert torch.equal(y != IGNORE_INDEX, masked)
    plain = SampleStream(synthetic_corpus(1 << 14), seq_len=32, seed=0, vocab_size=300).batch(0, 8)[0]
    assert torch.equal(y[masked], plain[masked])


def test_replicas_take_contiguous_shares_in_plan_order():
    plan = Plan.from_dict({"pipelines": [
        {"micro_batch_size": 1, "num_micro_batches": 4, "stages": [{"devices": ["a"], "layers": [0, 2]}]},
        {"micro_batch_size": 3, "num_micro_batches": 2, "stages": [{"devices": ["b"], "layers": [0, 2]}]}]})
    assert batch_slices(plan) == [(0, 4), (4, 6)]


def test_data_errors(tmp_path):
    with pytest.raises(ExecutionError, match="file not found"):
        load_tokens(tmp_path / "nope.txt")
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(ExecutionError, match="empty"):
        load_tokens(tmp_path / "empty.txt")
    with pytest.raises(ExecutionError, match="one sample needs 17"):
        SampleStream(np.zeros(10, dtype=np.uint8), seq_len=16, seed=0, vocab_size=256)
    with pytest.raises(ExecutionError, match="at least 256"):
        SampleStream(np.zeros(100, dtype=np.uint8), seq_len=16, seed=0, vocab_size=100)
    (tmp_path / "t.txt").write_bytes(b"hello world")
    assert bytes(load_tokens(tmp_path / "t.txt")) == b"hello world"


def test_a_data_file_is_mapped_read_only_not_read_into_memory(tmp_path):
    """Every worker maps the file (shared pages, no copy per process); samples are unchanged."""
    path = tmp_path / "corpus.txt"
    path.write_bytes(bytes(synthetic_corpus(1 << 13)) + bytes(range(256)))  # every byte value, 0 and 255 too
    tokens = load_tokens(path)
    assert isinstance(tokens, np.memmap) and tokens.dtype == np.uint8 and not tokens.flags.writeable
    read = np.fromfile(path, dtype=np.uint8)
    assert np.array_equal(tokens, read)
    for masked_lm in (False, True):
        mapped = SampleStream(tokens, seq_len=16, seed=5, vocab_size=300, masked_lm=masked_lm)
        assert np.shares_memory(mapped.tokens, tokens)  # the stream keeps the mapping, no copy
        copied = SampleStream(read, seq_len=16, seed=5, vocab_size=300, masked_lm=masked_lm)
        n = mapped.num_windows
        for start, count in ((0, 7), (n - 3, 6), (5 * n + 1, 2)):  # across an epoch boundary, a later epoch
            x, y = mapped.batch(start, count)
            assert x.dtype == y.dtype == torch.int64
            ex, ey = copied.batch(start, count)
            assert torch.equal(x, ex) and torch.equal(y, ey)
