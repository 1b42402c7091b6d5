"""What the cost model predicts for a run's plan, set beside what the run measures.

A run reports the planner's estimate of one iteration (`predicted_step_s`) next to its
measured median, in its result, its closing lines and W&B, so a user sees whether the plan
trains as fast as it was chosen for. The constants: ``--calibration FILE``, else, for
``--emulate`` runs, the profile fitted to this runtime on the emulated cluster
(`EMULATED_CPU`), else the built-in ones (GPUs whose executor overlaps sync).

An emulated cluster scales every device's compute to a share of this machine's cores, so
the spec's TFLOP/s say nothing of an emulated device's speed; the prediction is then
comparable only when the spec carries the devices' measured layer times (`spantrain
profile --cluster C --cpus N -o FILE` writes them); a plain local run's workers share one
machine. `comparable` says when the two can be compared.
"""

from __future__ import annotations

from pathlib import Path

from spantrain.cluster import Cluster
from spantrain.env.calibration import EMULATED_CPU, Calibration
from spantrain.plan import Plan
from spantrain.workload import Workload

__all__ = ["default_calibration", "predicted_step_s", "comparable", "profiled", "calibration_name"]


def default_calibration(emulated: bool) -> Calibration | None:
    """The constants a run plans and predicts with unless ``--calibration`` names others: the
    profile fitted to this runtime on the emulated cluster, or None (the built-in ones)."""
    return Calibration.from_file(EMULATED_CPU) if emulated else None


def predicted_step_s(cluster: Cluster, workload: Workload, plan: Plan, calibration: Calibration | None) -> float:
    """The cost model's seconds for one iteration of `plan` on `cluster`."""
    from spantrain.env.costmodel import estimate

    return float(estimate(cluster, workload, plan, calibration).iteration_s)


def comparable(cluster: Cluster, workload: Workload, plan: Plan, *, where: str) -> bool:
    """Whether the prediction can be held against the measured time of a run `where` it runs
    (``torchrun``, ``emulated`` or ``local``): on a real cluster always; emulated, when every
    device of the plan carries measured layer times for `workload`; a plain local run's workers
    share this machine's cores and loopback, never."""
    if where == "torchrun":
        return True
    if where == "emulated":
        return profiled(cluster, workload, plan)
    return False


def profiled(cluster: Cluster, workload: Workload, plan: Plan) -> bool:
    """Whether every device of `plan` carries measured layer times for `workload` (`spantrain
    profile` wrote them): the prediction then rests on measurements, not on the spec's TFLOP/s."""
    return all(workload.name in cluster.device(d).layer_times for d in plan.devices)


def calibration_name(path: str | None, *, emulated: bool) -> str:
    """How the report names the constants used."""
    if path is not None:
        return Path(path).name
    return EMULATED_CPU.name if emulated else "built-in constants"
