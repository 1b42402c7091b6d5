"""Planners: the heuristic fallback, baselines, exhaustive search and the learned PPO policy.

- `spantrain.policies.registry`: planners by name (`get_planner`);
- `spantrain.policies.heuristic`: the fallback planner (grouping, chain search, tuning);
- `spantrain.policies.baselines`: ddp, gpipe and megatron as users configure them;
- `spantrain.policies.genetic`: ga, a DT-FM-style genetic search;
- `spantrain.policies.exhaustive`: the optimum under the cost model for up to 8 devices;
- `spantrain.env.evaluator`: layouts, knobs and batch shares scored with the cost model;
- `spantrain.env.partition`: layer partition of a pipeline by dynamic programming;
- `spantrain.policies.grouping`: network groups, compute units, interchangeable devices;
- `spantrain.policies.feasibility`: memory floors and the "fits nowhere" error;
- `spantrain.policies.compare`: planners side by side (`spantrain compare`, benchmarks).
"""
