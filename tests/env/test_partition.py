"""The partition DP's building blocks against brute force on small inputs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from spantrain.env import partition
from spantrain.env.costmodel import CostModel
from spantrain.profiler.topology import generate
from spantrain.workload import Workload


def test_range_maxima_from_the_sparse_table_match_numpy():
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 7, 8, 9, 100):
        act = rng.random(n) * 1e9
        table = partition._max_table(act)
        for lo in range(n):
            for hi in range(lo + 1, n + 1):
                assert partition._range_max(table, lo, hi) == act[lo:hi].max(), (n, lo, hi)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_memory_ratio_is_the_least_largest_stage_share_over_every_partition(seed):
    arch = {"family": "gpt2", "vocab_size": 5000, "d_model": 512, "n_layers": 7, "n_heads": 8, "d_ff": 2048,
            "max_seq_len": 1024}
    workload = Workload.from_spec({"name": "w", "global_batch": 8, "seq_len": 1024, "architecture": arch}, "m")
    model = CostModel(generate(5, seed, "cee"), workload)
    part = partition.Partitioner(model)
    L = workload.num_layers
    rng = np.random.default_rng(seed)
    for S in (1, 2, 3, 5):
        devs = tuple(int(x) for x in rng.permutation(5)[:S])
        for m, M, schedule in ((1, 4, "1f1b"), (4, 8, "gpipe")):
            infl = part.in_flight(schedule, S, M)
            brute = min(max(model.stage_memory(a, b, m, infl[s]) / model.memory_capacity(d)
                            for s, (d, a, b) in enumerate(zip(devs, (0, *cuts), (*cuts, L))))
                        for cuts in itertools.combinations(range(1, L), S - 1))
            got = part.memory_ratio(devs, m, M, schedule)
            assert got == pytest.approx(brute, rel=1e-12), (devs, m, M, schedule)
