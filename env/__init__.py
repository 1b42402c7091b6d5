"""The cost model (pipeline schedules, sync, memory) and the Gymnasium environment.

- `spantrain.env.costmodel`: `CostModel(cluster, workload)` and `estimate(cluster, workload, plan)`;
- `spantrain.env.schedules`: op orders per stage (`stage_orders`, what the runtime executes);
- `spantrain.env.collectives`: data-parallel collectives over the real links;
- `spantrain.env.kernel`: the compiled estimate over flat arrays;
- `spantrain.env.reference`: the pure-Python reference and trace; `spantrain.env.timeline`: its Gantt chart;
- `spantrain.env.calibration`: every assumed constant, in one place;
- `spantrain.env.partition` / `spantrain.env.evaluator` / `spantrain.env.symmetry`: the plan space
  searches work in (layer partition DP, layouts + knobs -> scored candidates, interchangeable devices);
- `spantrain.env.plan_env`: the Gymnasium environment `spantrain/PlanImprove-v0` (moves in
  `spantrain.env.moves`, observation/action layout in `spantrain.env.spaces`).
"""
