"""One rank of a training run: build its stage from the plan, train, report, checkpoint.

Started once per plan device, either by the local launcher (`spantrain.runtime.launcher`)
or by torchrun (then `spantrain run` itself calls `run_worker` in every process).

An iteration on every rank: take this pipeline's share of the next samples (first and last
stage only), run the stage's schedule, weight and sum gradients with the layer's other
holders (fp16: unscale them, and skip the step on every rank if any rank found an overflow,
`spantrain.runtime.loss_scale`), AdamW step, then meet all ranks in one small all-gather that carries the loss,
the per-rank timings and the stop vote (so a SIGTERM on any rank stops all of them at the
same iteration, after which they checkpoint and exit cleanly).

Exit codes: 0 done, 1 unexpected error, 2 a refusal (`SpantrainError`), 3 the launcher
went away. Each failing rank writes one line to ``RUN_DIR/errors/rank{r}.txt`` (the
launcher reports it) and its traceback to its log.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

# Imported here so the launcher's fork server loads them once for all workers.
import torch.distributed.checkpoint
import torch.distributed.pipelining

from spantrain._say import say
from spantrain._spec import write_text_atomic
from spantrain.errors import ExecutionError, RunFailed, SpantrainError
from spantrain.runtime import zb_order
from spantrain.runtime.checkpoint import (
    PLAN_FILE,
    Checkpointer,
    check_meta,
    latest_checkpoint,
    model_meta,
    restore_rng,
)
from spantrain.runtime.config import RunConfig
from spantrain.runtime.data import SampleStream, batch_slices, load_tokens
from spantrain.runtime.entry import EXIT_ERROR, EXIT_OK, EXIT_REFUSED, error_file
from spantrain.runtime.linkprobe import (
    link_figures,
    links_message,
    measure_links,
    measured_cluster,
    plan_pairs,
    sync_rings,
)
from spantrain.runtime.loss_scale import LossScaler
from spantrain.runtime.metrics import MetricsLog, iteration_totals, run_summary, summarize
from spantrain.runtime.models import build_stage_module, loss_fn, require_arch
from spantrain.runtime.optim import ensure_state, make_optimizer, optimizer_tensors
from spantrain.runtime.pipeline import build_stage_runner
from spantrain.runtime.prediction import profiled
from spantrain.runtime.preflight import threads_per_rank
from spantrain.runtime.rankmap import Layout, host_record, resolve_ranks
from spantrain.runtime.sync import Synchronizer, build_holder_groups
from spantrain.runtime.transport import Transport, visible_gpus

__all__ = ["StopFlag", "run_worker", "guarded", "agreed_precision", "job_fingerprint", "check_same_job",
           "torchrun_job"]

class StopFlag:
    """Set by SIGTERM: finish the current iteration, agree with the others, checkpoint, exit.
    Not `armed` (torchrun's processes until training starts): there is no iteration to finish
    yet, and the signal stops the process at once (KeyboardInterrupt)."""

    def __init__(self, armed: bool = True) -> None:
        self.requested = False
        self.signum = 0
        """The signal that set `requested` (0: none yet)."""
        self.armed = armed
        self._heard = threading.Event()

    def __call__(self, signum: int, frame: Any) -> None:
        self._heard.set()
        if not self.armed:
            raise KeyboardInterrupt
        self.requested = True
        self.signum = self.signum or signum

    @contextlib.contextmanager
    def exit_when_blocked(self, grace_s: float = 1.0) -> Iterator[None]:
        """While the block runs, also end the process at once when a stop signal comes before
        training starts and the main thread cannot take it within `grace_s`: Python runs signal
        handlers only between bytecodes, and a rank waiting in torch's process-group set-up for
        ranks that never come (one failed its checks) sat out torchrun's 30 s before being
        killed. The signal module writes each signal's number to a pipe at once, whatever the
        main thread is doing; a thread reading it does the rest. Main thread only."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        old = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        watcher = threading.Thread(target=self._watch, args=(read_fd, grace_s), daemon=True, name="stop-watch")
        watcher.start()
        try:
            yield
        finally:
            signal.set_wakeup_fd(old)
            os.close(write_fd)  # the watcher reads the end of the pipe and returns
            watcher.join()
            os.close(read_fd)

    def _watch(self, read_fd: int, grace_s: float) -> None:
        while received := os.read(read_fd, 1):
            if self.armed or self._heard.wait(grace_s) or self.armed:
                continue  # training (the flag finishes the iteration) or the main thread unwinds
            name = signal.Signals(received[0]).name
            say(f"spantrain run: stopped by {name} before training started (waiting for the other ranks; "
                "nothing to save)")
            os._exit(128 + received[0])


_NO_SIGNAL = 1000
"""A stop request's code when no signal made it (1 would read as SIGHUP)."""


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:  # not a signal's number: a stop requested otherwise
        return "a stop request"


def torchrun_job() -> str | None:
    """torchrun's id of this job (`--rdzv-id`; None outside torchrun or when it has none):
    a restarted attempt continues only the checkpoints and metrics its own job wrote."""
    job = os.environ.get("TORCHELASTIC_RUN_ID")
    return job if job and job != "none" else None


def job_fingerprint(cfg: RunConfig) -> str:
    """What every torchrun process of one job must agree on (each reads its own files: a stale
    plan file on one node made the others wait out the timeout in a transfer that never came):
    the plan as it runs (not its predicted figures, which another node's planning may round
    apart), the model, the settings, and the checkpoint a resume starts from (a node whose
    filesystem still shows an older one would train from there)."""
    import hashlib

    latest = latest_checkpoint(cfg.checkpoint_dir) if cfg.resume and cfg.checkpoint_dir else None
    what = {"plan": {k: cfg.plan.get(k) for k in ("schedule", "sync", "pipelines")},
            "model": Path(cfg.model).name, "steps": cfg.steps, "seed": cfg.seed, "precision": cfg.precision,
            "resume": latest.name if latest else None}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:12]


def check_same_job(fingerprints: list[str]) -> None:
    """`ExecutionError` naming the ranks whose plan, model or settings differ from rank 0's."""
    odd = [r for r, fp in enumerate(fingerprints) if fp != fingerprints[0]]
    if odd:
        raise ExecutionError(f"rank(s) {', '.join(map(str, odd))} run another plan, model or settings (--steps, "
                             "--seed, --precision, --resume and the checkpoint it finds) than rank 0: give every "
                             "process the same command, plan file and checkpoint directory (a stale copy on one "
                             "node?)")


def agreed_precision(precision: str, transport: Transport) -> str:
    """What every rank trains in: `precision`, except bf16 where any rank's GPU lacks native
    bf16 (pre-Ampere GPUs emulate it, slower than fp32): then fp32 everywhere, since ranks must
    train alike. A collective call when bf16 runs on GPUs."""
    if precision != "bf16" or transport.device.type != "cuda":
        return precision
    native = torch.cuda.is_bf16_supported(including_emulation=False)
    return "bf16" if all(transport.all_gather_object(native)) else "fp32"


def run_worker(cfg: RunConfig, *, rank: int, world_size: int, init_method: str | None, local: bool,
               stop: StopFlag | None = None) -> dict[str, Any] | None:
    """Train this rank's part of the run; rank 0 returns the run summary (others None)."""
    stop = stop or StopFlag()
    cluster, workload, plan = cfg.load()
    arch = require_arch(workload)
    local_world = world_size if local else int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    torch.set_num_threads(cfg.threads or threads_per_rank(local_world))
    torch.manual_seed(cfg.seed)

    transport = Transport.init(rank=rank, world_size=world_size, init_method=init_method, timeout_s=cfg.timeout_s,
                               local_rank=rank if local else int(os.environ.get("LOCAL_RANK", "0")),
                               local_world=local_world, local=local)
    transport.install()
    metrics = tracker = None
    try:
        if local:
            rank_of, how = resolve_ranks(plan, cluster, world_size, None, cfg.rank_map)
        else:
            gathered = transport.all_gather_object((host_record(), job_fingerprint(cfg)))
            check_same_job([fp for _, fp in gathered])
            rank_of, how = resolve_ranks(plan, cluster, world_size, [r for r, _ in gathered], cfg.rank_map)
        layout = Layout(plan, cluster, rank_of)
        me = layout.roles[rank]
        pipeline = plan.pipelines[me.pipeline]

        # Process groups: every rank creates every group, in the same order.
        pipe_groups = [transport.new_group(layout.pipeline_ranks(i)) for i in range(len(plan.pipelines))]
        holder_groups = build_holder_groups(layout, workload.num_layers, plan.sync.mode, transport)

        device = transport.device
        precision = agreed_precision(cfg.precision, transport)
        module = build_stage_module(workload, *me.layers, seed=cfg.seed, device=device, precision=precision)
        optimizer = make_optimizer(module, cfg.optim)
        scaler = LossScaler(scale=cfg.loss_scale) if precision == "fp16" else None
        runner = build_stage_runner(schedule=plan.schedule, module=module, stage_index=me.stage,
                                    stage_ranks=layout.pipeline_ranks(me.pipeline),
                                    num_micro_batches=pipeline.num_micro_batches, group=pipe_groups[me.pipeline],
                                    device=device, loss=scaler.scaled(loss_fn) if scaler else loss_fn,
                                    orders=lambda: _orders(cfg, cluster, workload, plan, me.pipeline))
        share = pipeline.batch / plan.batch
        sync = Synchronizer(mode=plan.sync.mode, period=plan.sync.period, rank=rank, region=me.region, share=share,
                            groups=holder_groups, transport=transport)
        offset, count = batch_slices(plan)[me.pipeline]

        step, samples_seen, seed = 0, 0, cfg.seed
        ckpt = Checkpointer(cfg.checkpoint_dir, rank=rank, barrier=transport.barrier,
                            keep=cfg.keep_checkpoints) if cfg.checkpoint_dir else None
        resumed_from = None
        if cfg.resume:
            path = latest_checkpoint(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
            if path is None:
                raise ExecutionError(f"no checkpoint to resume from in {cfg.checkpoint_dir}")
            state = check_meta(path, workload)
            ensure_state(optimizer)
            Checkpointer.load(path, _checkpoint_tensors(module, optimizer))
            step, samples_seen, seed = int(state["step"]), int(state["samples_seen"]), int(state["seed"])
            restore_rng(path, state)
            if scaler is not None and "loss_scale" in state:  # a checkpoint of an fp16 run
                scaler.load_state_dict(state["loss_scale"])
            resumed_from = str(path)

        stream = None
        if runner.is_first or runner.is_last:
            stream = SampleStream(load_tokens(cfg.data), seq_len=workload.seq_len, seed=seed,
                                  vocab_size=arch.vocab_size, masked_lm=arch.family == "bert")

        if rank == 0:
            from spantrain.tracking import Tracker

            tracker = Tracker(job_type="run", enabled=cfg.track, dir=Path(cfg.run_dir) / "wandb",
                              run_id=cfg.wandb_id, name=f"{workload.name} on {cluster.name}: {Path(cfg.run_dir).name}",
                              config={"model": workload.name, "plan": plan.to_dict(), "steps": cfg.steps,
                                      "seed": seed, "precision": precision, **dataclasses.asdict(cfg.optim),
                                      "cluster": cluster.name, "devices": len(plan.devices),
                                      "global_batch": plan.batch, "emulated": transport.emulation is not None,
                                      "planner": cfg.planner, "schedule": plan.schedule, "sync": plan.sync.mode,
                                      "predicted_step_s": cfg.predicted_step_s,
                                      "prediction_calibration": cfg.prediction_calibration,
                                      "prediction_comparable": cfg.prediction_comparable,
                                      "start_step": step, "resumed_from": resumed_from})
            # local runs: the launcher reads the drift event from the log and tells the user
            announce = None if local else (lambda msg: print(f"spantrain run: note: {msg}", file=sys.stderr))
            metrics = MetricsLog(cfg.metrics_path, tracker, announce=announce, predicted_step_s=cfg.predicted_step_s,
                                 # measured layer times, and constants fitted to the executor: the spec's
                                 # TFLOP/s are peaks, and the built-in constants a GPU executor's (2-4x off)
                                 prediction_holds=cfg.prediction_comparable and cfg.calibration is not None
                                 and profiled(cluster, workload, plan),
                                 sync_period=plan.sync.period if plan.sync.mode == "local-sgd" else 1)
            # the plan as it runs, for `plan --from` and to resume on: a run given --planner, or
            # switched by --adapt, had it nowhere else (a resume on the old plan file went back to it)
            plan.save(Path(cfg.run_dir) / PLAN_FILE)
            if tracker.note and local:  # rank 0's stderr is its log file: the launcher tells the user
                metrics.event("note", text=tracker.note)
            gpus = visible_gpus() if local and transport.backend == "gloo" else 0
            if gpus:
                metrics.event("note", text=f"{world_size} workers and {gpus} GPU(s) on this machine: "
                                           "training on the CPU with gloo (NCCL needs a GPU per worker)")
            metrics.event("start", step=step, world_size=world_size, rank_map=how, resumed_from=resumed_from,
                          job=torchrun_job(),
                          zb_order=runner.order_source, precision=precision,
                          devices={r: role.device for r, role in sorted(layout.roles.items())})
            if cfg.adaptation:  # this plan came from `--adapt`: what it was chosen over, on the W&B chart
                from spantrain.runtime.adapter import adaptation_scalars

                tracker.log(adaptation_scalars(cfg.adaptation), step=step)

        start_step = step
        # in-band link measurement: a plain local run's loopback says nothing of the spec's links
        measuring = cfg.measure_links and (transport.emulation is not None or not local)
        pairs = plan_pairs([layout.pipeline_ranks(i) for i in range(len(plan.pipelines))],
                           sync_rings(holder_groups)) if measuring else []
        measure_reason = "start"  # rank 0's: why the measurement it asks for is made
        if metrics is not None:
            metrics.measuring, metrics.last_step = bool(pairs), cfg.steps
        last_ckpt = None
        ckpt_pending = False
        stopped_by: list[dict[str, Any]] = []
        t_mark = time.perf_counter()
        stop.armed = True  # from here a stop finishes the iteration and checkpoints
        while step < cfg.steps:
            t0, c0 = time.perf_counter(), time.process_time()
            transport.take_stats()
            inputs = targets = None
            if stream is not None:
                x, y = stream.batch(samples_seen + offset, count)
                inputs = x.to(device) if runner.is_first else None
                targets = y.to(device) if runner.is_last else None
            losses = runner.step(inputs, targets)
            sync.reduce_gradients(module, step)
            scale, overflow = 1.0, False
            if scaler is not None:  # fp16: every rank skips this update if any rank overflowed
                scale, overflow = scaler.unscale_and_agree(module.parameters(),
                                                           lambda votes: transport.all_reduce(votes, None), device)
            if not overflow:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync.average_state(module, optimizer, step)
            transport.settle()  # a GPU's queued work is this iteration's compute
            busy, cpu = time.perf_counter() - t0, time.process_time() - c0
            st = transport.take_stats()
            # detached: float() of a tensor that needs grad prints a UserWarning (on the terminal under torchrun)
            loss_part = float(torch.stack(losses).detach().mean()) * share / scale if losses else 0.0
            # rank 0 asks for a measurement: after the first iteration, and after drift
            ask = bool(pairs) and metrics is not None and (step == start_step or metrics.drift_pending)
            if ask:  # `_measure` clears the drift it answers
                measure_reason = "drift" if metrics.drift_pending else "start"
            # column 4: the stop signal's number, so the result can say which rank was stopped
            row = torch.tensor([busy, st.p2p_wait_s, st.collective_s, loss_part,
                                float(stop.signum or _NO_SIGNAL) if stop.requested else 0.0, cpu, float(ask)],
                               dtype=torch.float64, device=device)
            rows = transport.all_gather_rows(row).cpu()
            now = time.perf_counter()
            step_s, t_mark = now - t_mark, now
            stopping = bool(rows[:, 4].max() > 0)
            if stopping:
                stopped_by = [{"rank": r, "device": layout.roles[r].device, "signal": _signal_name(int(rows[r, 4]))}
                              for r in range(world_size) if rows[r, 4] > 0]
            step += 1
            samples_seen += plan.batch
            if metrics is not None:
                metrics.step({
                    "step": step, "step_s": step_s, "samples": plan.batch, "samples_per_s": plan.batch / step_s,
                    "loss": float(rows[:, 3].sum()), "cpu_s": float(rows[:, 5].sum()),
                    "ranks": [{"rank": r, "device": layout.roles[r].device,
                               "compute_s": float(rows[r, 0] - rows[r, 1] - rows[r, 2]),
                               "p2p_wait_s": float(rows[r, 1]), "sync_s": float(rows[r, 2]),
                               "cpu_s": float(rows[r, 5])}
                              for r in range(world_size)],
                    **({"loss_scale": scale, "overflow": overflow} if scaler is not None else {})})
                if metrics.write_error is not None:  # a full disk: all stop at the next iteration, with a checkpoint
                    stop.requested = True
            if not stopping and rows[0, 6] > 0 and step < cfg.steps:
                # a stop request during the measurement cuts it short and stops the run here (checkpointed
                # below), not after one more iteration
                stopping = not _measure(transport, pairs, rank, layout, cluster, metrics, tracker, step,
                                        measure_reason, Path(cfg.run_dir), stop, checkpoints=bool(cfg.checkpoint_dir),
                                        model=cfg.model,
                                        # `plan --from` refuses a plan whose batch is not the workload's
                                        global_batch=plan.batch if plan.batch != workload.global_batch
                                        else cfg.global_batch)
            ckpt_pending = ckpt_pending or bool(cfg.checkpoint_every and step % cfg.checkpoint_every == 0)
            final = stopping or step == cfg.steps
            # Between local-sgd sync points replicas differ: a periodic checkpoint waits for the next sync
            # point; a final one saves their weighted average.
            synced = sync.is_sync_step(step - 1)
            if ckpt is not None and ((ckpt_pending and synced) or final):
                ensure_state(optimizer)  # parameters that never had a gradient still get (zero) state
                if not synced:
                    sync.average_state(module, optimizer, step - 1, force=True)
                ckpt_pending = False
                last_ckpt = ckpt.save(step, _checkpoint_tensors(module, optimizer),
                                      _train_state(step, samples_seen, seed, cfg, plan, scaler),
                                      model_meta(workload))
                if metrics is not None:
                    metrics.event("checkpoint", step=step, path=str(last_ckpt))
            if stopping:
                break
            t_mark = time.perf_counter()  # checkpoint and measuring time are not iteration time

        if step < cfg.steps:
            # A launcher's stop reaches the ranks one by one: those it reached after the iteration's vote
            # were left out of stopped_by (2 of 4 named after a Ctrl-C); by now every signal has landed.
            late = transport.all_gather_rows(torch.tensor([float(stop.signum or _NO_SIGNAL) if stop.requested
                                                           else 0.0], dtype=torch.float64, device=device)).cpu()
            stopped_by = [{"rank": r, "device": layout.roles[r].device, "signal": _signal_name(int(late[r, 0]))}
                          for r in range(world_size) if late[r, 0] > 0]
        if metrics is None:
            return None
        summary = summarize(metrics.records, metrics.sync_period)
        result = {**summary, "start_step": start_step, "final_step": step, "target_steps": cfg.steps,
                  "stopped_early": step < cfg.steps, "stopped_by": stopped_by if step < cfg.steps else [],
                  "losses": [r["loss"] for r in metrics.records],
                  "plan": plan.to_dict(), "world_size": world_size, "rank_map": how,
                  "schedule": plan.schedule, "sync": plan.sync.to_dict(), "zb_order": runner.order_source,
                  "predicted_step_s": cfg.predicted_step_s, "prediction_calibration": cfg.prediction_calibration,
                  "prediction_comparable": cfg.prediction_comparable,
                  "backend": transport.backend, "precision": precision,
                  "loss_scale": scaler.scale if scaler else None,
                  "skipped_steps": sum(1 for r in metrics.records if r.get("overflow")),  # this launch's
                  "checkpoint": str(last_ckpt) if last_ckpt else None, "resumed_from": resumed_from,
                  "metrics": str(cfg.metrics_path), "run_dir": cfg.run_dir,
                  "wandb": tracker.url_or_dir or None if tracker is not None else None}
        metrics.event("end", **{k: result[k] for k in ("final_step", "stopped_early", "checkpoint")})
        metrics.close()
        if metrics.write_error is not None:
            raise RunFailed(f"{metrics.write_error}: the run stopped after iteration {step}")
        if tracker is not None:
            # a run stopped early still ends its W&B run as finished: the summary says it was stopped
            # totals over the whole W&B run: a resumed or re-planned launch continues it, and its
            # chart starts at the run's first iteration, not this launch's
            tracker.summary(run_summary(result, iteration_totals(cfg.metrics_path, step)))
            tracker.finish()
        _write_json(Path(cfg.run_dir) / "result.json", result)
        return result
    except BaseException:
        # a failed run still closes its metrics and ends its W&B run, marked failed: the worker
        # ends by os._exit, which skips wandb's own exit handler
        if metrics is not None:
            with contextlib.suppress(Exception):
                metrics.close()
        if tracker is not None:
            with contextlib.suppress(Exception):
                tracker.finish(exit_code=1)
        raise
    finally:
        transport.close()


def _orders(cfg: RunConfig, cluster, workload, plan, pipeline: int):
    """Zero-bubble op orders of one pipeline: computed once by the launcher when it did, else here."""
    if cfg.zb_orders is not None:
        source = cfg.zb_order_source or "launcher"
        p = plan.pipelines[pipeline]
        return zb_order.check_orders(cfg.zb_orders[pipeline], len(p.stages), p.num_micro_batches, source), source
    return zb_order.all_pipeline_orders(cluster, workload, plan, cfg.cost_constants())[pipeline]


def _checkpoint_tensors(module, optimizer) -> dict[str, torch.Tensor]:
    out = {k: p for ps in module.layer_parameters().values() for k, p in ps}
    out.update(optimizer_tensors(module, optimizer))
    return out


def _train_state(step: int, samples_seen: int, seed: int, cfg: RunConfig, plan,
                 scaler: LossScaler | None) -> dict[str, Any]:
    return {"step": step, "samples_seen": samples_seen, "seed": seed, "data": cfg.data,
            "rng_state": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii"),
            "optim": dataclasses.asdict(cfg.optim), "plan": plan.to_dict(), "time": time.time(),
            "job": torchrun_job(), "precision": cfg.precision, "job_id": cfg.job_id,
            # relative to the checkpoints: a copied project resumes in the copy
            **({"run_dir": os.path.relpath(cfg.run_dir, cfg.checkpoint_dir),
                "metrics_path": os.path.relpath(cfg.metrics_path, cfg.checkpoint_dir)} if cfg.checkpoint_dir else {}),
            **({"loss_scale": scaler.state_dict()} if scaler is not None else {})}


def _measure(transport: Transport, pairs: list[tuple[int, int]], rank: int, layout: Layout, cluster,
             metrics: MetricsLog | None, tracker, step: int, reason: str, run_dir: Path, stop: StopFlag,
             checkpoints: bool = True, model: str | None = None, global_batch: int | None = None) -> bool:
    """Measure the plan's links (every rank); rank 0 reports them against the spec and writes the
    cluster as measured when a link changed (``RUN_DIR/cluster-measured.json``). False when a stop
    request cut the measurement short (nothing is reported; a drift stays pending)."""
    t0 = time.perf_counter()
    measured = measure_links(transport, pairs, rank, stop=lambda: stop.requested)
    if measured is None:
        return False
    if metrics is None:
        return True
    metrics.drift_pending = False  # a drift seen meanwhile is what this measured
    figures = link_figures(measured, {r: role.device for r, role in layout.roles.items()}, cluster,
                           transport.emulation)
    path = None
    if any(f.changed for f in figures):
        path = run_dir / "cluster-measured.json"
        write_text_atomic(path, json.dumps(measured_cluster(cluster, figures).to_spec(), indent=1) + "\n")
    event = {"step": step, "reason": reason, "measure_s": round(time.perf_counter() - t0, 3),
             "links": [f.to_dict() for f in figures], "cluster": str(path) if path else None,
             "checkpoints": checkpoints, "plan": str(run_dir / PLAN_FILE), "model": model,
             "global_batch": global_batch}
    metrics.event("links", **event)
    if metrics.announce is not None:  # torchrun: no launcher reads the log
        metrics.announce(links_message(event))
    if tracker is not None:
        tracker.log({f"links/{f.a}-{f.b}/{k}": v for f in figures
                     for k, v in (("gbps", f.gbps), ("latency_ms", f.latency_ms))}, step=step)
    return True


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)  # a run directory removed mid-run: the training is done
    write_text_atomic(path, json.dumps(obj, indent=1) + "\n")


def guarded(cfg: RunConfig, *, rank: int, world_size: int, init_method: str | None, local: bool,
            stop: StopFlag | None = None) -> tuple[int, dict[str, Any] | None]:
    """`run_worker` with failures turned into an exit code and a one-line error file."""
    try:
        return EXIT_OK, run_worker(cfg, rank=rank, world_size=world_size, init_method=init_method, local=local,
                                   stop=stop)
    except RunFailed as e:  # failed on its own (a full disk), said in one line: not a refusal of its input
        _record_error(cfg, rank, str(e))
        return EXIT_ERROR, None
    except SpantrainError as e:
        _record_error(cfg, rank, str(e))
        return EXIT_REFUSED, None
    except BaseException as e:  # a worker reports whatever ends it (DCP raises BaseExceptions)
        if isinstance(e, KeyboardInterrupt) and stop is not None and not stop.armed:
            raise  # the stop flag's: asked to stop before training started
        traceback.print_exc()
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        _record_error(cfg, rank, f"{type(e).__name__}: {first}" if first else type(e).__name__)
        return EXIT_ERROR, None


def _record_error(cfg: RunConfig, rank: int, message: str) -> None:
    path = error_file(cfg.run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(message.strip() + "\n")
    print(f"rank {rank}: {message}", file=sys.stderr, flush=True)
