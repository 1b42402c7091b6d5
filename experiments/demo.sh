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

echo
echo "demo outputs are in $OUT/"
