"""Training samples: byte-level tokens, and which replica sees which sample.

Tokens are the bytes of a text file (``--data PATH``) or of a built-in synthetic corpus.
The corpus is cut into windows of ``seq_len + 1`` bytes (inputs and next-byte targets);
global sample ``k`` is window ``perm_e[k mod n]`` of epoch ``e = k div n``, where ``perm_e``
is a permutation drawn from ``(seed, e)``. So a sample depends only on its global index,
never on the rank asking for it.

An iteration consumes the next ``plan.batch`` global samples; pipeline ``i`` takes its
contiguous share in plan order (`batch_slices`), cut into its micro-batches in order. Every
rank computes the same split, and the union is exactly the batch single-process training
would use, which is what makes distributed and single-process results comparable. The
position (samples consumed so far) is part of the checkpoint, so a run resumed onto a
plan with a different split continues with the very next sample.

For BERT (masked language modelling) each sample additionally masks 15% of its positions
(at least one), drawn from ``(seed, k)``; the targets hold the original byte there and
`IGNORE_INDEX` elsewhere.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from spantrain.errors import ExecutionError
from spantrain.plan import Plan
from spantrain.runtime.models import IGNORE_INDEX
from spantrain.runtime.preflight import SYNTHETIC_CORPUS_BYTES

__all__ = ["synthetic_corpus", "load_tokens", "SampleStream", "batch_slices"]

_WORDS = ("the", "a", "small", "red", "blue", "quick", "old", "cat", "dog", "bird", "fox", "tree", "river",
          "stone", "sees", "likes", "finds", "jumps over", "walks to", "sits by")
_NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
            "twelve")


def synthetic_corpus(num_bytes: int = SYNTHETIC_CORPUS_BYTES, seed: int = 1234) -> np.ndarray:
    """A deterministic text with structure a small model learns quickly.

    Three kinds of lines, mixed at random: sentences from a tiny grammar (article,
    adjective, noun, verb, article, noun), counting runs ("four five six seven"), and sums
    with their correct result ("17+25=42"). Grammar, sequence and arithmetic give the loss
    somewhere to go well below the 5.5 nats of uniform bytes.
    """
    rng = np.random.default_rng(seed)
    nouns, adjs, verbs = _WORDS[7:14], _WORDS[2:7], _WORDS[14:]
    parts: list[str] = []
    size = 0
    while size < num_bytes:
        kind = rng.integers(3)
        if kind == 0:
            line = (f"{_WORDS[rng.integers(2)]} {adjs[rng.integers(len(adjs))]} {nouns[rng.integers(len(nouns))]} "
                    f"{verbs[rng.integers(len(verbs))]} the {nouns[rng.integers(len(nouns))]}.\n")
        elif kind == 1:
            start = int(rng.integers(len(_NUMBERS) - 3))
            stop = int(rng.integers(start + 3, len(_NUMBERS) + 1))
            line = " ".join(_NUMBERS[start:stop]) + ".\n"
        else:
            a, b = (int(x) for x in rng.integers(0, 50, size=2))
            line = f"{a}+{b}={a + b}\n"
        parts.append(line)
        size += len(line)
    return np.frombuffer("".join(parts).encode("ascii"), dtype=np.uint8)[:num_bytes].copy()


def load_tokens(path: str | Path | None) -> np.ndarray:
    """Bytes of the file at `path` as tokens, or the synthetic corpus when `path` is None.

    The file is mapped read-only (`np.memmap`), not read: the workers of a run share its
    pages through the page cache, and a corpus larger than memory trains too (a sample
    touches only its own window). The file must not change while the run reads it.
    """
    if path is None:
        return synthetic_corpus()
    p = Path(path)
    if not p.is_file():
        raise ExecutionError(f"--data {p}: file not found")
    if p.stat().st_size == 0:  # mmap refuses an empty file
        raise ExecutionError(f"--data {p}: file is empty")
    return np.memmap(p, dtype=np.uint8, mode="r")


class SampleStream:
    """Global sample index -> (input ids, targets), the same on every rank."""

    def __init__(self, tokens: np.ndarray, *, seq_len: int, seed: int, vocab_size: int, masked_lm: bool = False):
        if vocab_size < 256:
            raise ExecutionError(f"byte-level data needs a vocabulary of at least 256 tokens, "
                                 f"the model has {vocab_size}")
        self.tokens = np.asarray(tokens, dtype=np.uint8)
        self.seq_len = seq_len
        self.seed = int(seed)
        self.num_windows = (self.tokens.size - 1) // seq_len
        if self.num_windows < 1:
            raise ExecutionError(f"the data has {self.tokens.size} bytes; one sample needs {seq_len + 1}")
        self.masked_lm = masked_lm
        self.mask_id = vocab_size - 1
        self._perms: dict[int, np.ndarray] = {}

    def _window(self, k: int) -> int:
        epoch, j = divmod(k, self.num_windows)
        perm = self._perms.get(epoch)
        if perm is None:
            if len(self._perms) > 2:  # keep memory flat over long runs
                self._perms.clear()
            perm = self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.num_windows)
        return int(perm[j])

    def batch(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples ``start .. start + count - 1`` as (inputs, targets), each (count, seq_len) int64."""
        s = self.seq_len
        rows = np.stack([self.tokens[w * s: w * s + s + 1] for w in map(self._window, range(start, start + count))])
        rows = rows.astype(np.int64)
        inputs, targets = rows[:, :-1].copy(), rows[:, 1:].copy()
        if self.masked_lm:
            inputs, targets = rows[:, :-1].copy(), rows[:, :-1].copy()
            for i, k in enumerate(range(start, start + count)):
                mask = np.random.default_rng([self.seed, 7, k]).random(s) < 0.15
                if not mask.any():
                    mask[k % s] = True
                inputs[i, mask] = self.mask_id
                targets[i, ~mask] = IGNORE_INDEX
        return torch.from_numpy(inputs), torch.from_numpy(targets)


def batch_slices(plan: Plan) -> list[tuple[int, int]]:
    """(offset, count) of each pipeline's share of an iteration's samples, in plan order."""
    out, offset = [], 0
    for p in plan.pipelines:
        out.append((offset, p.batch))
        offset += p.batch
    return out
