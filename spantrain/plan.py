"""The plan: which devices form which pipeline, which layers each stage holds, how the
batch is cut into micro-batches, which schedule runs them and how replicas sync.

JSON form (DESIGN.md):

    {"schedule": "zb-h1",
     "sync": {"mode": "hierarchical", "period": 1},
     "pipelines": [
       {"micro_batch_size": 2, "num_micro_batches": 8,
        "stages": [{"devices": ["cloud-0"], "layers": [0, 14]},
                   {"devices": ["edge-0"], "layers": [14, 26]}]}],
     "predicted": {"iteration_s": 1.9, "samples_per_s": 16.8}}

Extension: `"model": "gpt2-medium"`, the workload the plan was made for (written by every
planner; optional when read).

A stage's `devices` is a list so that the format can grow (tensor-parallel stages); this
version runs exactly one device per stage and `validate` says so otherwise.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spantrain._spec import (
    check_keys,
    got,
    other_kind,
    parse_json,
    read_structured,
    save_text,
    shown,
)
from spantrain.cluster import MAX_DEVICES, Cluster
from spantrain.errors import MAX_PROBLEMS_SHOWN, PlanError
from spantrain.workload import MAX_GLOBAL_BATCH, PRESETS, Workload

__all__ = ["SCHEDULES", "SYNC_MODES", "MAX_SYNC_PERIOD", "Stage", "Pipeline", "Sync", "Plan"]

SCHEDULES = ("gpipe", "1f1b", "zb-h1", "zb-h2")
"""Pipeline schedules: GPipe, 1F1B, and the zero-bubble ZB-H1 / ZB-H2 (Qi et al. 2023)."""
SYNC_MODES = ("allreduce", "hierarchical", "local-sgd")
"""Data-parallel sync: flat ring, region-first hierarchical, or periodic parameter averaging."""
MAX_SYNC_PERIOD = 10**6
"""Most iterations between local-SGD averages: beyond any run's length, and within the 64-bit
integers the cost model's compiled kernel takes (a larger one failed inside it)."""


@dataclass(frozen=True, kw_only=True)
class Stage:
    """A contiguous range of layers on one device."""

    devices: tuple[str, ...]
    """Device ids holding the stage (exactly one in this version)."""
    layers: tuple[int, int]
    """Half-open layer range [start, end) over the workload's layers."""

    @property
    def device(self) -> str:
        return self.devices[0]

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]

    def to_dict(self) -> dict[str, Any]:
        return {"devices": list(self.devices), "layers": list(self.layers)}


@dataclass(frozen=True, kw_only=True)
class Pipeline:
    """A data-parallel replica of the model, cut into stages."""

    stages: tuple[Stage, ...]
    """Stages in pipeline order: the first holds the embedding, the last the head."""
    micro_batch_size: int
    """Samples per micro-batch."""
    num_micro_batches: int
    """Micro-batches per iteration."""

    @property
    def batch(self) -> int:
        """Samples this replica processes per iteration."""
        return self.micro_batch_size * self.num_micro_batches

    @property
    def devices(self) -> list[str]:
        return [d for s in self.stages for d in s.devices]

    def to_dict(self) -> dict[str, Any]:
        return {"micro_batch_size": self.micro_batch_size, "num_micro_batches": self.num_micro_batches,
                "stages": [s.to_dict() for s in self.stages]}


@dataclass(frozen=True, kw_only=True)
class Sync:
    """How replicas of a layer agree on its parameters."""

    mode: str = "allreduce"
    """One of `SYNC_MODES`."""
    period: int = 1
    """Iterations between parameter averages (``local-sgd`` only; 1 otherwise)."""

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "period": self.period}


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A complete parallel strategy for one cluster and workload."""

    pipelines: tuple[Pipeline, ...]
    """Data-parallel replicas."""
    schedule: str = "1f1b"
    """One of `SCHEDULES`, used by every pipeline."""
    sync: Sync = field(default_factory=Sync)
    """Data-parallel sync mode and period."""
    predicted: dict[str, float] | None = None
    """What the cost model predicted when the plan was made (informational)."""
    model: str | None = None
    """Name of the workload the plan was made for (None: a plan file written by hand or before
    the key existed). A plan read for another model is named as made for this one."""

    # ---- views ------------------------------------------------------------------------

    @property
    def batch(self) -> int:
        """The iteration batch: sum over pipelines of micro-batch size x count."""
        return sum(p.batch for p in self.pipelines)

    @property
    def layers_covered(self) -> int:
        """The end of the last layer range: the model's layer count, in a valid plan."""
        return max((s.layers[1] for p in self.pipelines for s in p.stages), default=0)

    @property
    def devices(self) -> list[str]:
        """Devices the plan uses, pipeline by pipeline, stage by stage."""
        return [d for p in self.pipelines for d in p.devices]

    def stage_of(self, device_id: str) -> tuple[int, int] | None:
        """(pipeline index, stage index) of a device, or None if it is idle."""
        for i, p in enumerate(self.pipelines):
            for j, s in enumerate(p.stages):
                if device_id in s.devices:
                    return i, j
        return None

    # ---- validation --------------------------------------------------------------------

    def _setting_problems(self) -> list[str]:
        """The problems of the schedule and the sync settings."""
        out: list[str] = []
        if not isinstance(self.sync, Sync):  # Plan(sync="allreduce") in code: an AttributeError below
            out.append(f"sync must be a Sync(mode=..., period=...), {got(self.sync)}")
            return out
        if self.schedule not in SCHEDULES:
            out.append(f"schedule {shown(self.schedule)} is unknown (choose from {', '.join(SCHEDULES)})")
        if self.sync.mode not in SYNC_MODES:
            out.append(f"sync mode {shown(self.sync.mode)} is unknown (choose from {', '.join(SYNC_MODES)})")
        if not _pos_int(self.sync.period):
            out.append(f"sync period must be a positive integer, {got(self.sync.period, whole=True)}")
        elif too_long := _period_too_long(self.sync.period):
            out.append(too_long)
        elif self.sync.period != 1 and self.sync.mode != "local-sgd":
            out.append(f"sync period {self.sync.period} needs mode local-sgd (allreduce and hierarchical sync "
                       "every iteration)")
        return out

    def problems(self, cluster: Cluster | None = None, workload: Workload | None = None) -> list[str]:
        """Every problem with the plan (empty when valid); cluster/workload checks are optional."""
        # a spec path or a model name here was an AttributeError (or, as cluster, a substring test)
        if cluster is not None and not isinstance(cluster, Cluster):
            raise PlanError(f"cluster must be a Cluster or None (Cluster.from_file(path) reads a spec), {got(cluster)}")
        if workload is not None and not isinstance(workload, Workload):
            raise PlanError(f"workload must be a Workload or None (load_workload(name or path) gives one), "
                            f"{got(workload)}")
        out = self._setting_problems()
        if shape := _shape_problems(self.pipelines):  # built in code with wrong types: nothing else to check
            return out + shape
        if not self.pipelines:
            out.append("plan has no pipelines")
        elif all(_pos_int(p.micro_batch_size) and _pos_int(p.num_micro_batches) for p in self.pipelines) \
                and self.batch > MAX_GLOBAL_BATCH:
            out.append(f"the plan's batch is {self.batch} samples, more than the {MAX_GLOBAL_BATCH} a plan may have")
        n_layers = len(workload.layers) if workload is not None else None
        seen: dict[str, str] = {}
        for i, p in enumerate(self.pipelines):
            where = f"pipeline {i}"
            if not _pos_int(p.micro_batch_size):
                out.append(f"{where}: micro_batch_size must be a positive integer, "
                           f"{got(p.micro_batch_size, whole=True)}")
            if not _pos_int(p.num_micro_batches):
                out.append(f"{where}: num_micro_batches must be a positive integer, "
                           f"{got(p.num_micro_batches, whole=True)}")
            if not p.stages:
                out.append(f"{where}: has no stages")
                continue
            expected_start = 0
            shuffled = _out_of_order(p.stages)
            if shuffled:  # every layer once, in the wrong stage order: not "covered twice" and "not covered"
                out.append(f"{where}: stages are out of order: the layer ranges must follow each other from stage 0 "
                           f"to the last (a stage's place is its place in the pipeline); in order: {shuffled}")
            for j, s in enumerate(p.stages):
                sw = f"{where} stage {j}"
                if len(s.devices) != 1:
                    out.append(f"{sw}: needs exactly one device, got {len(s.devices)} "
                               "(multi-device stages are not supported yet)")
                for d in dict.fromkeys(s.devices):  # a device twice in one stage is the count's problem, above
                    if cluster is not None and d not in cluster:
                        out.append(f"{sw}: unknown device {shown(d)}")
                    if d in seen:
                        out.append(f"{sw}: device {shown(d)} is already used by {seen[d]}")
                    else:
                        seen[d] = sw
                a, b = s.layers
                if not (_int(a) and _int(b)) or a >= b:
                    out.append(f"{sw}: layer range [{a}, {b}) is empty or malformed")
                    expected_start = b if isinstance(b, int) else expected_start
                    continue
                if a < 0:
                    out.append(f"{sw}: layer range [{a}, {b}) starts below 0 (layers are numbered from 0)")
                elif a != expected_start and not shuffled:
                    if a > expected_start:
                        out.append(f"{sw}: layers [{expected_start}, {a}) are not covered")
                    else:
                        out.append(f"{sw}: layers [{a}, {min(b, expected_start)}) are covered twice")
                if n_layers is not None and b > n_layers:
                    out.append(f"{sw}: layer range [{a}, {b}) goes past the model's {n_layers} layers")
                expected_start = max(b, 0)  # a range starting below 0 is reported above
            if shuffled:
                expected_start = max(s.layers[1] for s in p.stages)
            if n_layers is not None and expected_start < n_layers:
                out.append(f"{where}: layers [{expected_start}, {n_layers}) are not covered "
                           f"(the model has {n_layers} layers)")
        return out

    def made_for_other(self, workload: Workload) -> str | None:
        """The model the plan names when it is not `workload`'s, else None."""
        return self.model if self.model is not None and self.model != workload.name else None

    def model_to_pass(self) -> str:
        """How to give this plan's model as --model: a preset by name; a model from a workload file by
        its file ('--model my-gpt' was refused as an unknown model)."""
        if self.model in PRESETS:
            return f"--model {self.model}"
        return f"the workload file of {shown(self.model)} as --model"

    def other_models_layers(self, workload: Workload) -> str | None:
        """'was made for model gpt2-medium (26 layers), not gpt2-small (14)' when the plan names
        another model and its layers do not fit `workload`'s (the layer problems' cause), else None."""
        other = self.made_for_other(workload)
        if other is None or not self.problems(workload=workload):
            return None
        return (f"was made for model {other} ({self.layers_covered} layers), not {workload.name} "
                f"({len(workload.layers)})")

    def validate(self, cluster: Cluster | None = None, workload: Workload | None = None) -> Plan:
        """Raise `PlanError` listing every problem; return the plan when it is valid."""
        problems = self.problems(cluster, workload)
        if problems:
            raise PlanError(problems)
        return self

    # ---- JSON --------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schedule": self.schedule, "sync": self.sync.to_dict(),
                               "pipelines": [p.to_dict() for p in self.pipelines]}
        if self.predicted is not None:
            out["predicted"] = dict(self.predicted)
        if self.model is not None:
            out["model"] = self.model
        return out

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path: str | Path) -> None:
        """Write the plan as JSON; a path it cannot write is a `PlanError` naming it."""
        save_text(path, self.to_json() + "\n", PlanError, "plan", "plan.json")

    @classmethod
    def from_dict(cls, obj: Any, source: str = "plan") -> Plan:
        """Parse the JSON form; malformed structure raises `PlanError` listing every problem (up to
        what an error shows), and then the plan's own rules' problems as well."""
        problems: list[str] = []
        if not isinstance(obj, dict):
            raise PlanError(f"{source}: expected a JSON object with schedule, sync and pipelines")
        if wrong := other_kind(obj, "plan"):
            raise PlanError(f"{source}: {wrong}")
        check_keys(obj, {"schedule", "sync", "pipelines", "predicted", "model"}, {"pipelines"}, source, problems)
        model = obj.get("model")
        if model is not None and (not isinstance(model, str) or not model.strip()):
            problems.append(f"{source}: model must be the name of the workload the plan was made for, {got(model)}")
        schedule = obj.get("schedule", "1f1b")
        if not isinstance(schedule, str):
            problems.append(f"{source}: schedule must be a string")
        sync = Sync()
        raw_sync = obj.get("sync", {})
        if isinstance(raw_sync, str):
            sync = Sync(mode=raw_sync)
        elif isinstance(raw_sync, dict):
            check_keys(raw_sync, {"mode", "period"}, set(), f"{source}: sync", problems)
            sync = Sync(mode=raw_sync.get("mode", "allreduce"), period=raw_sync.get("period", 1))
        else:
            problems.append(f"{source}: sync must be an object with mode and period")
        pipelines = []
        raw_pipes = obj.get("pipelines", [])
        if not isinstance(raw_pipes, list):
            problems.append(f"{source}: pipelines must be a list")
            raw_pipes = []
        # counted before any is built: 16 KB of YAML aliases made 4 million stages (2 GB, 32 s)
        if too_many := _too_many(raw_pipes):
            raise PlanError(f"{source}: {too_many}")
        before = len(problems)
        full = False  # stopped reading at more problems than an error shows
        for i, rp in enumerate(raw_pipes):
            if full := len(problems) > MAX_PROBLEMS_SHOWN:
                break
            where = f"{source}: pipelines[{i}]"
            if not isinstance(rp, dict):
                problems.append(f"{where}: expected an object")
                continue
            check_keys(rp, {"micro_batch_size", "num_micro_batches", "stages"},
                       {"micro_batch_size", "num_micro_batches", "stages"}, where, problems)
            stages = []
            raw_stages = rp.get("stages", [])
            if not isinstance(raw_stages, list):
                problems.append(f"{where}: stages must be a list")
                raw_stages = []
            for j, rs in enumerate(raw_stages):
                if full := len(problems) > MAX_PROBLEMS_SHOWN:
                    break
                sw = f"{where}.stages[{j}]"
                if not isinstance(rs, dict):
                    problems.append(f"{sw}: expected an object")
                    continue
                check_keys(rs, {"devices", "layers"}, {"devices", "layers"}, sw, problems)
                devs = rs.get("devices", [])
                if isinstance(devs, str):
                    devs = [devs]
                if not (isinstance(devs, list) and all(isinstance(d, str) for d in devs)):
                    problems.append(f"{sw}: devices must be a list of device ids")
                    devs = []
                layers = rs.get("layers", [0, 0])
                if not (isinstance(layers, list) and len(layers) == 2
                        and all(isinstance(x, int) and not isinstance(x, bool) for x in layers)):
                    problems.append(f"{sw}: layers must be [start, end] integers")
                    layers = [0, 0]
                stages.append(Stage(devices=tuple(devs), layers=(layers[0], layers[1])))
            pipelines.append(Pipeline(stages=tuple(stages), micro_batch_size=rp.get("micro_batch_size", 0),
                                      num_micro_batches=rp.get("num_micro_batches", 0)))
        # read whole, so the plan's own rules apply to them
        pipes_parsed = isinstance(obj.get("pipelines"), list) and len(problems) == before
        predicted = obj.get("predicted")
        if predicted is not None and not isinstance(predicted, dict):
            problems.append(f"{source}: predicted must be an object of figures (iteration_s, samples_per_s)")
            predicted = None
        elif predicted is not None:
            # the cost model's figures, copied into a run's JSON files: NaN and Infinity are no JSON
            # (no upper bound: a plan for a spec's slowest devices may predict 1e45 s, and is read back)
            for key, value in predicted.items():
                if not isinstance(key, str) or not _finite_figure(value):
                    problems.append(f"{source}: predicted.{shown(key) if not isinstance(key, str) else key} must be "
                                    f"a finite number >= 0, {got(value)}")
        if full:  # the rest were not read, so not counted
            problems = problems[:MAX_PROBLEMS_SHOWN]
            problems[-1] += "; ... and more"
        elif problems:  # the plan's own rules too, so one run names every problem (an unknown key hid the rest)
            partial = cls(pipelines=tuple(pipelines) if pipes_parsed else (),
                          schedule=schedule if isinstance(schedule, str) else "1f1b", sync=sync)
            rules = partial.problems() if pipes_parsed else partial._setting_problems()
            problems.extend(f"{source}: {p}" for p in rules[:MAX_PROBLEMS_SHOWN])
        # named here too, as a file is read: the cost model's fast path takes any positive int
        elif _pos_int(sync.period) and (too_long := _period_too_long(sync.period)):
            problems.append(f"{source}: {too_long}")
        if problems:
            raise PlanError(problems)
        return cls(pipelines=tuple(pipelines), schedule=schedule, sync=sync, predicted=predicted, model=model)

    @classmethod
    def from_json(cls, text: str, source: str = "plan") -> Plan:
        # as a plan file is read: 5,000 digits were a ValueError, a key given twice silently the last one
        return cls.from_dict(parse_json(text, source, PlanError), source)

    @classmethod
    def from_file(cls, path: str | Path) -> Plan:
        return cls.from_dict(read_structured(path, PlanError), str(path))

    load = from_file


def _shape_problems(pipelines: Any) -> list[str]:
    """The problems of a plan built in code whose parts are of the wrong types (a list of dicts
    for stages, a None layer range, a device id that is no string), which `problems` names
    instead of failing on them."""
    if not isinstance(pipelines, (tuple, list)):
        return [f"pipelines must be a tuple of Pipeline, {got(pipelines)}"]
    out: list[str] = []
    for i, p in enumerate(pipelines):
        if not isinstance(p, Pipeline):
            out.append(f"pipeline {i} must be a Pipeline, {got(p)}")
            continue
        if not isinstance(p.stages, (tuple, list)):
            if p.stages is not None:  # None: "has no stages", below
                out.append(f"pipeline {i}: stages must be a tuple of Stage, {got(p.stages)}")
            continue
        for j, st in enumerate(p.stages):
            sw = f"pipeline {i} stage {j}"
            if not isinstance(st, Stage):
                out.append(f"{sw} must be a Stage, {got(st)}")
                continue
            if not (isinstance(st.layers, (tuple, list)) and len(st.layers) == 2):
                out.append(f"{sw}: layers must be a (start, end) pair, {got(st.layers)}")
            if not (isinstance(st.devices, (tuple, list)) and all(isinstance(d, str) for d in st.devices)):
                out.append(f"{sw}: devices must be a tuple of device ids (strings), {got(st.devices)}")
    return out


def _out_of_order(stages) -> str:
    """The stages' ranges in order ("stage 2 [0, 3), stage 0 [3, 8)") when they cover their
    layers exactly once from 0 but not in stage order; else ""."""
    ranges = [s.layers for s in stages]
    if not all(isinstance(a, int) and isinstance(b, int) and 0 <= a < b for a, b in ranges):
        return ""
    order = sorted(range(len(ranges)), key=lambda j: ranges[j])
    tiles = ranges[order[0]][0] == 0 and all(ranges[x][1] == ranges[y][0] for x, y in itertools.pairwise(order))
    if not tiles or order == list(range(len(ranges))):
        return ""
    return ", ".join(f"stage {j} [{ranges[j][0]}, {ranges[j][1]})" for j in order)


def _int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _pos_int(x: Any) -> bool:
    return _int(x) and x > 0


def _finite_figure(x: Any) -> bool:
    # an int is finite (math.isfinite raises on one past the floats)
    return isinstance(x, (int, float)) and not isinstance(x, bool) and (isinstance(x, int) or math.isfinite(x)) \
        and x >= 0


def _too_many(raw_pipes: list[Any]) -> str | None:
    """The problem with a plan of more pipelines, stages or device entries than a cluster has
    devices (each stage needs a device of its own), counted without building any."""
    why = f"at most {MAX_DEVICES}, the most devices a cluster may have: each stage needs a device of its own"
    if len(raw_pipes) > MAX_DEVICES:
        return f"{len(raw_pipes)} pipelines, {why}"
    raw_stages = [rp["stages"] for rp in raw_pipes if isinstance(rp, dict) and isinstance(rp.get("stages"), list)]
    n = sum(map(len, raw_stages))
    if n > MAX_DEVICES:
        return f"{n} stages in all, {why}"
    n = sum(len(rs["devices"]) for stages in raw_stages for rs in stages
            if isinstance(rs, dict) and isinstance(rs.get("devices"), list))
    if n > MAX_DEVICES:
        return f"{n} device entries in its stages, {why}"
    return None


def _period_too_long(period: int) -> str | None:
    """The problem with a positive sync period beyond `MAX_SYNC_PERIOD`, if it is."""
    if period > MAX_SYNC_PERIOD:
        return f"sync period must be at most {MAX_SYNC_PERIOD} iterations, got {shown(period)}"
    return None
