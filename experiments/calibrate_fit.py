"""Fitting calibration constants to measured runs, and checking the fit on unseen clusters.

`fit` adjusts the named non-negative constants of a `Calibration` to minimize the mean
absolute percentage error of `calibrate.evaluate` over stored measurements: a coordinate
search in log space (each constant in turn tries being multiplied by a ladder of factors
and set to zero; the step shrinks when nothing improves), deterministic and dependency-free
for the two or three constants it is meant for. `cross_validate` refits on all clusters but
one and scores the held-out one: the error to expect on a cluster the constants never saw.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from spantrain.errors import SpecError

__all__ = ["fit", "cross_validate"]

_LADDERS = ((4.0, 2.0, 1.4, 1.15), (1.07, 1.03), (1.01,))
"""Factors tried in turn; the next, finer ladder once a whole round found nothing better."""


def _mape(measured: dict[str, Any], calibration, evaluate: Callable) -> float:
    return evaluate(measured, calibration, with_default=False)["mape"]


def fit(measured: dict[str, Any], base, names: Sequence[str], evaluate: Callable, rounds: int = 40
        ) -> tuple[Any, float]:
    """(calibration with `names` refitted, its MAPE on `measured`), starting from `base`."""
    cal = base
    best = _mape(measured, cal, evaluate)
    level = 0
    for _ in range(rounds):
        improved = False
        for name in names:
            cur = float(getattr(cal, name))
            if cur > 0:
                candidates = [0.0, *(cur * f for f in _LADDERS[level]), *(cur / f for f in _LADDERS[level])]
            else:
                candidates = [1e-3 if name.endswith("_s") else 1e6]
            for value in candidates:
                try:
                    trial = dataclasses.replace(cal, **{name: value})
                except SpecError:  # a value the constant may not take (0 for a rate the model divides by)
                    continue
                err = _mape(measured, trial, evaluate)
                if err < best - 1e-7:
                    cal, best, improved = trial, err, True
        if not improved:
            if level == len(_LADDERS) - 1:
                break
            level += 1
    return cal, best


def cross_validate(measured: dict[str, Any], base, names: Sequence[str], evaluate: Callable
                   ) -> list[dict[str, Any]]:
    """For each cluster: refit on the others, then the held-out cluster's MAPE and largest error."""
    out = []
    clusters = measured["clusters"]
    for k, held in enumerate(clusters):
        train = {**measured, "clusters": [c for i, c in enumerate(clusters) if i != k]}
        cal, train_mape = fit(train, base, names, evaluate)
        test = evaluate({**measured, "clusters": [held]}, cal, with_default=False)
        out.append({"held_out": held["spec_data"]["name"], "train_mape": train_mape, "mape": test["mape"],
                    "max_abs_error": test["max_abs_error"], **{n: getattr(cal, n) for n in names}})
    return out


if __name__ == "__main__":  # run as a script it printed nothing and exited 0, even for --help
    print("calibrate_fit: error: a module of experiments/calibrate.py, not a script: run python "
          "experiments/calibrate.py --help", file=__import__("sys").stderr)
    raise SystemExit(2)
