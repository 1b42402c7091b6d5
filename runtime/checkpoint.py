"""Checkpoints with torch.distributed.checkpoint (DCP), keyed by layer, never by rank.

Layout of a checkpoint directory ``ROOT``::

    ROOT/latest                  name of the newest complete checkpoint ("step-00000040")
    ROOT/step-00000040/          one complete checkpoint
        .metadata, *.distcp      DCP: "layers.{i}.{param}" and "optim.layers.{i}.{param}.{step|exp_avg|exp_avg_sq}"
        train_state.json         step, samples consumed, RNG state, plan, hyper-parameters
        meta.json                model architecture and per-layer parameter counts (checked on resume)
        plan.json                the plan to continue on, as a plan file (``--plan`` to resume on it): the
                                 one it was trained on, or at an ``--adapt`` switch the one switched to
    ROOT/.tmp-step-00000042/     a checkpoint being written (ignored; one a crash left goes when the
                                 run ends, or at the next save)

Because keys name layers, any plan can load any checkpoint of the same model: each rank
asks for the layers it holds now. Replicas of a layer hold identical values at checkpoint
time and DCP writes one copy.

Nothing is lost on a crash mid-write: all ranks write into a temporary directory, and only
when every rank is done does rank 0 add the JSON files, rename the directory into place and
then replace ``latest`` (write + rename, both atomic on POSIX). A reader therefore sees the
previous checkpoint or the new one, never half of one. Multi-node runs need ``ROOT`` on a
file system every node shares.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

from spantrain._spec import shown
from spantrain.errors import ExecutionError, RunFailed

__all__ = ["FORMAT", "PLAN_FILE", "latest_checkpoint", "damaged", "read_json", "model_meta", "check_meta",
           "restore_rng", "Checkpointer", "read_tensors", "remove_partial_saves"]

FORMAT = 1
_LATEST = "latest"
PLAN_FILE = "plan.json"
"""A plan file: in each checkpoint, the plan to continue on (the one it was trained on; at an
`--adapt` switch, the one switched to); in the run directory, the plan the run trains on now
(rank 0 writes it as each plan starts)."""


def _step_dir(step: int) -> str:
    return f"step-{step:08d}"


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under `root`, or None (pure Python: the CLI calls it before launching)."""
    root = Path(root)
    pointer = root / _LATEST
    if pointer.is_file():
        candidate = root / pointer.read_text().strip()
        if (candidate / "train_state.json").is_file():
            return candidate
    # `latest` is written last; if it is missing or stale, fall back to the newest complete directory.
    complete = sorted(p for p in root.glob("step-*") if (p / "train_state.json").is_file())
    return complete[-1] if complete else None


def incomplete_after(checkpoint: Path) -> list[str]:
    """Names of the checkpoint directories newer than `checkpoint` that `latest_checkpoint` passed
    over for want of a train_state.json (damaged from outside: a save is renamed into place whole)."""
    return sorted(p.name for p in checkpoint.parent.glob("step-*")
                  if p.name > checkpoint.name and p.is_dir() and not (p / "train_state.json").is_file())


def damaged(path: Path) -> str:
    """What to do about checkpoint `path` when it cannot be read (a clause for an error line): resuming
    from it again would only fail again."""
    earlier = sorted(p for p in path.parent.glob("step-*") if p.name < path.name and (p / "train_state.json").is_file())
    if earlier:
        return f"delete {path} to --resume from {earlier[-1].name}, the checkpoint before it"
    return f"delete {path.parent} to start over"


def read_json(path: Path) -> dict[str, Any]:
    """A checkpoint's JSON file, or one clear line why not."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError) as e:  # ValueError: malformed JSON or not UTF-8
        reason = str(e)
    else:
        if isinstance(obj, dict):
            return obj
        reason = f"a JSON {type(obj).__name__}, not an object"
    raise ExecutionError(f"checkpoint file {path} is unreadable ({reason}); {damaged(path.parent)}")


def model_meta(workload: Any) -> dict[str, Any]:
    """What must match between a checkpoint and the model that loads it."""
    arch = workload.arch
    return {"format": FORMAT, "model": workload.name,
            "arch": None if arch is None else {k: getattr(arch, k) for k in
                                               ("family", "vocab_size", "d_model", "n_layers", "n_heads", "d_ff",
                                                "max_seq_len")},
            "layer_params": [layer.params for layer in workload.layers]}


def check_meta(path: Path, workload: Any) -> dict[str, Any]:
    """Refuse a checkpoint written for another model (one clear line); return its train state."""
    meta = read_json(path / "meta.json")
    want = model_meta(workload)
    if not isinstance(meta.get("format"), int) or isinstance(meta.get("format"), bool):  # no version wrote that
        raise ExecutionError(f"checkpoint file {path / 'meta.json'} is damaged (its format is "
                             f"{shown(meta.get('format'))}); {damaged(path)}")
    if meta.get("format") != FORMAT:
        raise ExecutionError(f"checkpoint {path} has format {shown(meta.get('format'))}, this version reads {FORMAT}")
    if meta.get("arch") != want["arch"] or meta.get("layer_params") != want["layer_params"]:
        from spantrain.workload import PRESETS

        # the checkpoint knows the workload's name, which is a --model value only for a preset
        model = meta.get("model")
        use = (f"--model {model}" if model in PRESETS and model != workload.name
               else "the workload file it was trained with")
        raise ExecutionError(f"checkpoint {path} was written for model {shown(model)} with a different "
                             f"architecture than {shown(workload.name)}: resume with {use}, or pass another "
                             "--checkpoint-dir to train this model anew")
    state = read_json(path / "train_state.json")
    for key, kind in (("step", int), ("samples_seen", int), ("seed", int), ("rng_state", str)):
        value = state.get(key)
        # counters below zero: the workers would fail on them with a bare numpy or torch error
        if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and value < 0):
            raise ExecutionError(f"checkpoint file {path / 'train_state.json'} has no valid {shown(key)}; "
                                 f"{damaged(path)}")
    scaler = state.get("loss_scale", {"scale": 1.0, "growth_interval": 1, "clean": 0, "skipped": 0})  # fp16 runs'
    if not (isinstance(scaler, dict) and all(isinstance(scaler.get(k), (int, float)) and scaler[k] >= 0
                                             and math.isfinite(scaler[k])
                                             for k in ("scale", "growth_interval", "clean", "skipped"))
            and scaler["scale"] > 0 and scaler["growth_interval"] >= 1
            # older checkpoints lack in_row; a present one must be a count like the others
            and (isinstance(scaler.get("in_row", 0), int) and scaler.get("in_row", 0) >= 0)):
        raise ExecutionError(f"checkpoint file {path / 'train_state.json'} has no valid 'loss_scale'; {damaged(path)}")
    return state


def restore_rng(path: Path, state: dict[str, Any]) -> None:
    """Set torch's RNG from checkpoint `path`'s train state, or one clear line why not: a worker
    failing on it with torch's own error was reported with "continue with --resume", from the
    checkpoint that had just failed."""
    import base64

    import torch

    try:
        raw = base64.b64decode(state["rng_state"], validate=True)
        torch.set_rng_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
    except (ValueError, RuntimeError) as e:  # binascii.Error is a ValueError
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ExecutionError(f"checkpoint file {path / 'train_state.json'} has no valid 'rng_state' ({reason}); "
                             f"{damaged(path)}") from None


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_partial_saves(root: str | Path) -> None:
    """Remove the checkpoints a crash or a kill left half-written in `root` (``.tmp-step-N``, a
    model's size each), once no worker is left writing: the next save removed them, but a run
    never resumed kept them for good. A swapped-out ``.old-step-N`` may be the only copy of its
    step (killed between the two renames): it stays for the next save."""
    for partial in Path(root).glob(".tmp-step-*"):
        shutil.rmtree(partial, ignore_errors=True)


class Checkpointer:
    """Collective save/load of one rank's layers; every rank calls the same methods in step."""

    def __init__(self, root: str | Path, *, rank: int, barrier, keep: int = 2):
        self.root = Path(root)
        self.rank = rank
        self.barrier = barrier
        self.keep = max(1, keep)

    def save(self, step: int, tensors: dict[str, Any], train_state: dict[str, Any], meta: dict[str, Any]) -> Path:
        """Write checkpoint `step` atomically; returns its final directory."""
        import torch.distributed.checkpoint as dcp

        final = self.root / _step_dir(step)
        tmp = self.root / f".tmp-{_step_dir(step)}"
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            # Left over by a crash during an earlier save, of any step: a run resumed from an
            # earlier checkpoint may never save that step again, and each one is a model's size.
            for stale in [*self.root.glob(".tmp-step-*"), *self.root.glob(".old-step-*")]:
                shutil.rmtree(stale, ignore_errors=True)
        self.barrier()
        from torch.distributed.checkpoint.api import CheckpointException

        try:
            dcp.save({k: v.detach() if hasattr(v, "detach") else v for k, v in tensors.items()},
                     storage_writer=dcp.FileSystemWriter(str(tmp)))
        except (Exception, CheckpointException) as e:
            reason = _full_disk(tensors, self.root) or _dcp_reason(e)  # first: removing the parts frees space
            self.barrier()  # DCP failed on every rank: each has judged the disk before any part goes
            if self.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)  # a part-written one is only in the way (of the space, too)
            # the run failed (a full disk), not its input: exit 1, worth a --resume once there is room
            raise RunFailed(f"cannot write checkpoint {tmp}: {reason}") from e
        self.barrier()  # every rank's shard is on disk
        if self.rank == 0:
            _write_json(tmp / "meta.json", meta)
            _write_json(tmp / "train_state.json", train_state)
            if "plan" in train_state:  # a plan file: to resume on the plan it trained on (--plan)
                _write_json(tmp / PLAN_FILE, train_state["plan"])
            _fsync_dir(tmp)
            if final.exists():  # the same step saved again (a resumed run): swap it out, then drop it
                old = self.root / f".old-{_step_dir(step)}"
                shutil.rmtree(old, ignore_errors=True)
                os.replace(final, old)
                os.replace(tmp, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, final)
            _fsync_dir(self.root)
            pointer = self.root / _LATEST
            tmp_pointer = self.root / f".{_LATEST}.tmp"
            tmp_pointer.write_text(final.name + "\n")
            os.replace(tmp_pointer, pointer)
            self._prune(keep_name=final.name)
        self.barrier()
        return final

    def _prune(self, keep_name: str) -> None:
        # complete ones only: a newer directory damaged from outside (its train_state.json gone)
        # counted as kept, and the good one a resume had fallen back to was deleted
        complete = sorted(p for p in self.root.glob("step-*") if (p / "train_state.json").is_file())
        for p in complete[:-self.keep]:
            if p.name != keep_name:
                shutil.rmtree(p, ignore_errors=True)

    @staticmethod
    def load(path: Path, tensors: dict[str, Any]) -> None:
        """Fill `tensors` (this rank's keys, allocated) in place from checkpoint `path`."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        try:
            dcp.load(tensors, storage_reader=dcp.FileSystemReader(str(path)))
        except (Exception, CheckpointException) as e:  # the latter is a BaseException
            raise ExecutionError(f"cannot load checkpoint {path}: {_dcp_reason(e)}; {damaged(path)}") from e


def _full_disk(tensors: dict[str, Any], root: Path) -> str | None:
    """The reason a checkpoint write failed when the disk is full, which torch reports as
    "unexpected pos 704 vs 598" or the like; None when there is room for this rank's part."""
    need = sum(v.numel() * v.element_size() for v in tensors.values() if hasattr(v, "element_size"))
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return None
    if free >= need:
        return None
    older = sorted(p.name for p in root.glob("step-*") if p.is_dir())[:-1]
    hint = f" (older checkpoints here: {', '.join(older)}; --resume needs only the newest)" if older else ""
    return (f"no space left on the device ({free / 2**20:.1f} MB free, this rank's part alone is "
            f"{need / 2**20:.1f} MB): free some space{hint}, or pass a --checkpoint-dir on another disk")


def _dcp_reason(e: BaseException) -> str:
    """One line for a DCP failure: the first rank's own exception, not DCP's multi-line wrapper."""
    failures = getattr(e, "failures", None)
    if failures:
        rank = min(failures)
        inner = failures[rank][0]
        # an EOFError says nothing ("EOFError:  (raised on rank 0)"): a shard cut short
        what = str(inner).strip() or ("a file of the checkpoint ends too early (cut short or empty)"
                                      if isinstance(inner, EOFError) else "no message")
        return f"{type(inner).__name__}: {what} (raised on rank {rank})"
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def read_tensors(path: str | Path) -> dict[str, Any]:
    """Every tensor of a checkpoint, in this process alone (tools and tests; no process group)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = dcp.FileSystemReader(str(path))
    meta = reader.read_metadata()
    out: dict[str, Any] = {}
    for key, md in meta.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            out[key] = torch.empty(md.size, dtype=md.properties.dtype)
    with warnings.catch_warnings():  # "loading in a single process": exactly the intent here
        warnings.filterwarnings("ignore", message=".*single process.*")
        dcp.load(out, storage_reader=reader, no_dist=True)
    return out
