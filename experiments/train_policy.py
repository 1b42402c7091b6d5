"""Train the scheduling policy: `python -m spantrain.experiments.train_policy [flags]`.

The same flags as `spantrain train-policy` (every `TrainConfig` field); this thin entry
point exists so the experiment that produced the shipped policy can be rerun as a script.
"""

from __future__ import annotations

import sys

from spantrain.cli import main

__all__: list[str] = []  # a script: its public face is the command line

if __name__ == "__main__":
    raise SystemExit(main(["train-policy", *sys.argv[1:]]))
