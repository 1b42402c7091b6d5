"""Executing plans with torch.distributed: models, executor, checkpoints, emulated cluster.

Modules, one job each:

- `models`: transformer layers matching `Workload.layers` one for one, deterministic init.
- `data`: byte-level samples; global sample index -> replica, the same on every rank.
- `rankmap`: plan devices -> global ranks (plan order, mapping file, host/local_rank records).
- `transport`: every transfer and collective (timed; where latency emulation hooks in).
- `linkprobe`: point-to-point link measurement (the profiler's pairs, a run's own links in-band).
- `pipeline` + `zb_order`: a rank's stage and its torch.distributed.pipelining schedule.
- `sync`: per-layer data-parallel sync among the layer's holders (allreduce, hierarchical, local-sgd).
- `optim`, `checkpoint`, `metrics`: AdamW, layer-keyed DCP checkpoints, per-step metrics.
- `loss_scale`: fp16's dynamic loss scale, one decision for all ranks.
- `worker` (one rank), `launcher` + `entry` (local processes and their supervisor),
  `emulated_worker` (one rank on the emulated cluster),
  `stop_signals` (SIGTERM/SIGHUP unwind a launcher, an emulated cluster or `train-policy` like Ctrl-C),
  `preflight` (refusals before any process starts), `config` (what a worker is told),
  `reference` (single-process training on the same samples).
"""
