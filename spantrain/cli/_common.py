"""Arguments and loaders shared by several commands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_cluster_arg", "add_model_args", "add_json_arg", "load_cluster", "load_model", "print_json",
           "not_yet"]


def add_cluster_arg(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--cluster", "-c", required=required, metavar="FILE", help="cluster spec (YAML or JSON)")


def add_model_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--model", "-m", required=required, metavar="M",
                   help="model preset (tiny-gpt, gpt2-small, ..., llama2-7b) or workload YAML file")
    p.add_argument("--global-batch", type=int, metavar="N", help="override the workload's global batch")


def add_json_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout and nothing else there")


def load_cluster(path: str):
    from spantrain.cluster import Cluster

    return Cluster.from_file(path)


def load_model(args: argparse.Namespace):
    from spantrain.errors import WorkloadError
    from spantrain.workload import load_workload

    gb = getattr(args, "global_batch", None)
    if gb is not None and gb <= 0:
        raise WorkloadError(f"--global-batch must be a positive integer, got {gb}")
    return load_workload(args.model, global_batch=gb)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=None, default=_default) + "\n")


def _default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def not_yet(command: str, issue: int):
    """A command body for work a later issue fills: says so plainly, exit 1."""

    def run(args: argparse.Namespace) -> int:
        print(f"spantrain {command}: not available yet (tracked in issue #{issue})", file=sys.stderr)
        return 1

    return run
