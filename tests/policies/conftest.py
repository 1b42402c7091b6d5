"""Small clusters for the planner tests (specs built in code, so each test says what it needs)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from spantrain.cluster import Cluster

sys.path.insert(0, str(Path(__file__).resolve().parent))

from policy_helpers import region_cluster  # after the path insert above


@pytest.fixture
def slow_link_cluster() -> Cluster:
    """Two regions of four A100s on 100 Gbit/s LANs, joined by a 100 Mbit/s link."""
    return region_cluster({"west": (4, 140, 40, 100), "east": (4, 140, 40, 100)}, 0.1, name="slow-link")


@pytest.fixture
def uniform_cluster() -> Cluster:
    """Four identical H100s on one 1.6 Tbit/s fabric: plain data parallelism is right."""
    return region_cluster({"node": (4, 400, 80, 1600)}, 1.0, name="uniform")
