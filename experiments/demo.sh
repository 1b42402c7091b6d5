#!/usr/bin/env bash
# The main job on the built-in defaults, as a user would type it. `make demo` runs this.
set -euo pipefail
OUT=${OUT:-out/demo}
mkdir -p "$OUT"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1. Generate a 16-device cloud/edge/end cluster"
spantrain topo generate --devices 16 --seed 0 --profile cee -o "$OUT/cluster.yaml"

step "2. Show it and plot it"
spantrain topo show "$OUT/cluster.yaml" --plot "$OUT/topology.png"

step "3. Plan GPT-2 medium on it (auto: the learned policy and the heuristic, best of both)"
spantrain plan --cluster "$OUT/cluster.yaml" --model gpt2-medium -o "$OUT/plan.json"

step "4. Simulate the plan and draw its timeline"
spantrain simulate --cluster "$OUT/cluster.yaml" --model gpt2-medium --plan "$OUT/plan.json" \
  --timeline "$OUT/timeline.png"

step "5. The cloud region's network degrades (150 -> 1 Gbit/s): adapt the running plan to it"
python - "$OUT/cluster.yaml" "$OUT/cluster-degraded.yaml" <<'EOF'
import sys, yaml
spec = yaml.safe_load(open(sys.argv[1]))
spec["network"]["regions"]["cloud-0"]["gbps"] = 1
yaml.safe_dump(spec, open(sys.argv[2], "w"), sort_keys=False)
EOF
spantrain plan --cluster "$OUT/cluster-degraded.yaml" --model gpt2-medium --from "$OUT/plan.json" \
  --remaining-steps 2000 -o "$OUT/plan-adapted.json"

step "6. Every planner side by side"
spantrain compare --cluster "$OUT/cluster.yaml" --model gpt2-medium --planners ddp,gpipe,megatron,heuristic,auto

step "7. Train tiny-gpt for real on the DESIGN.md cluster (one process per planned device)"
rm -rf "$OUT/ckpt" "$OUT/run"  # a fresh run refuses directories holding a run's checkpoints or metrics (an earlier demo's)
spantrain run --cluster examples/cee-demo.yaml --model tiny-gpt --planner heuristic --steps 20 \
  --checkpoint-dir "$OUT/ckpt" --run-dir "$OUT/run"

step "8. Train the scheduling policy for about a minute (the shipped one: see README, 'The learned planner')"
rm -rf "$OUT/policy"  # a fresh run refuses an --out-dir holding a run (an earlier demo's)
spantrain train-policy --timesteps 2048 --pool-size 16 --eval-every 1024 --eval-scenarios 4 \
  --imitation-episodes 8 --imitation-rounds 2 --out-dir "$OUT/policy"

echo
echo "demo outputs are in $OUT/ (W&B runs are offline; 'wandb sync' uploads them)"
