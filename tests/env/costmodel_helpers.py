"""Clusters, workloads and random plans for the cost-model tests (no topology generator)."""

from __future__ import annotations

import random

from spantrain.cluster import Cluster
from spantrain.plan import SCHEDULES, SYNC_MODES, Pipeline, Plan, Stage, Sync
from spantrain.workload import Workload

__all__ = ["flat_cluster", "regional_cluster", "toy_workload", "random_plan", "single_pipeline"]


def flat_cluster(n: int, *, tflops: float = 10.0, memory_gb: float = 80.0, gbps: float = 100.0,
                 latency_ms: float = 0.0) -> Cluster:
    """n identical devices in one region."""
    return Cluster.from_spec({
        "name": "flat",
        "devices": [{"id": "d", "count": n, "region": "r", "tflops": tflops, "memory_gb": memory_gb}],
        "network": {"regions": {"r": {"gbps": gbps, "latency_ms": latency_ms}}},
    })


def regional_cluster() -> Cluster:
    """Three regions of unequal devices and links (7 devices)."""
    return Cluster.from_spec({
        "name": "regional",
        "devices": [
            {"id": "a", "count": 3, "region": "ra", "tflops": 40, "memory_gb": 24},
            {"id": "b", "count": 2, "region": "rb", "tflops": 15, "memory_gb": 16},
            {"id": "c", "count": 2, "region": "rc", "tflops": 6, "memory_gb": 8},
        ],
        "network": {
            "regions": {"ra": {"gbps": 50, "latency_ms": 0.05}, "rb": {"gbps": 5, "latency_ms": 0.2},
                        "rc": {"gbps": 1, "latency_ms": 1}},
            "links": [{"between": ["ra", "rb"], "gbps": 0.5, "latency_ms": 20}],
            "default": {"gbps": 0.2, "latency_ms": 40},
            "overrides": [{"from": "a-0", "to": "b-1", "gbps": 0.05, "latency_ms": 60}],
        },
    })


def toy_workload(n_layers: int = 8, *, flops: float = 1e9, params: int = 1_000_000,
                 boundary: float = 1e6, activation: float = 4e6, global_batch: int = 16) -> Workload:
    """Identical layers; B = W = F FLOPs (the YAML form's default)."""
    return Workload.from_spec({
        "name": "toy", "global_batch": global_batch, "seq_len": 16, "precision": "bf16",
        "layers": [{"name": "layer", "count": n_layers, "forward_flops": flops, "params": params,
                    "boundary_bytes": boundary, "activation_bytes": activation}],
    })


def single_pipeline(devices: list[str], cuts: list[int], m: int, M: int, schedule: str,
                    sync: str = "allreduce") -> Plan:
    stages = tuple(Stage(devices=(d,), layers=(cuts[i], cuts[i + 1])) for i, d in enumerate(devices))
    return Plan(pipelines=(Pipeline(stages=stages, micro_batch_size=m, num_micro_batches=M),),
                schedule=schedule, sync=Sync(mode=sync))


def random_plan(rng: random.Random, cluster: Cluster, n_layers: int) -> Plan:
    """A valid plan: 1-3 pipelines of 1-4 stages on distinct devices, random cuts and knobs."""
    ids = list(cluster.ids)
    rng.shuffle(ids)
    P = rng.randint(1, min(3, len(ids)))
    pipes = []
    for _ in range(P):
        S = rng.randint(1, min(4, len(ids) - (P - len(pipes) - 1), n_layers))
        devs = [ids.pop() for _ in range(S)]
        cuts = sorted(rng.sample(range(1, n_layers), S - 1))
        cuts = [0, *cuts, n_layers]
        pipes.append(Pipeline(stages=tuple(Stage(devices=(d,), layers=(cuts[i], cuts[i + 1]))
                                           for i, d in enumerate(devs)),
                              micro_batch_size=rng.randint(1, 4), num_micro_batches=rng.randint(1, 12)))
    mode = rng.choice(SYNC_MODES)
    return Plan(pipelines=tuple(pipes), schedule=rng.choice(SCHEDULES),
                sync=Sync(mode=mode, period=rng.randint(1, 4) if mode == "local-sgd" else 1))
