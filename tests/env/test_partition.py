"""The partition DP's building blocks against brute force on small inputs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from partition_helpers import dp_terms

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


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_one_micro_batch_gets_the_least_fill_of_every_partition_that_fits(seed):
    """With M = 1 the DP's objective is the fill alone, so its pruned scans must find the
    least fill over every partition that fits."""
    arch = {"family": "gpt2", "vocab_size": 5000, "d_model": 512, "n_layers": 8, "n_heads": 8, "d_ff": 2048,
            "max_seq_len": 1024}
    workload = Workload.from_spec({"name": "w", "global_batch": 8, "seq_len": 1024, "architecture": arch}, "m")
    model = CostModel(generate(6, seed, ("cee", "geo", "datacenter", "cee")[seed]), workload)
    part = partition.Partitioner(model)
    L = workload.num_layers
    rng = np.random.default_rng(seed)
    for S in (2, 3, 4, 6):
        devs = tuple(int(x) for x in rng.permutation(6)[:S])
        for m, schedule in ((1, "1f1b"), (4, "zb-h1")):
            n_ops = 2.0 if schedule == "1f1b" else 3.0
            infl = part.in_flight(schedule, S, 1)
            fills = [dp_terms(part, devs, (0, *cuts), m, n_ops)[1]
                     for cuts in itertools.combinations(range(1, L), S - 1)
                     if all(model.stage_memory(a, b, m, infl[s]) <= model.memory_capacity(d)
                            for s, (d, a, b) in enumerate(zip(devs, (0, *cuts), (*cuts, L))))]
            got = part.split(devs, m, 1, schedule)
            assert (got is None) == (not fills), (devs, m)
            if fills:
                assert dp_terms(part, devs, got, m, n_ops)[1] == pytest.approx(min(fills), rel=1e-12), (devs, m)
