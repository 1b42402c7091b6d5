"""One error hierarchy for everything a user can get wrong or the system can refuse.

The CLI turns any `SpantrainError` into a one-line message on stderr and its `exit_code`:
2 for bad input or a refusal, 1 for a run that failed on its own (`RunFailed`: a worker
died, hung or lost contact), so a script can retry the one and not the other. Anything else
is a bug and keeps its traceback.
"""

from __future__ import annotations

__all__ = [
    "SpantrainError",
    "SpecError",
    "WorkloadError",
    "PlanError",
    "InfeasibleError",
    "PlannerError",
    "ExecutionError",
    "RunFailed",
    "DiskFull",
    "EmulationError",
    "PolicyError",
    "join_problems",
    "MAX_PROBLEMS_SHOWN",
]

MAX_PROBLEMS_SHOWN = 20
"""Problems one error line lists (a spec of 100,000 bad devices made a 20 MB line)."""


def join_problems(problems: list[str]) -> str:
    """Every problem, up to `MAX_PROBLEMS_SHOWN`, and how many more there are."""
    more = len(problems) - MAX_PROBLEMS_SHOWN
    return "; ".join(problems[:MAX_PROBLEMS_SHOWN]) + (f"; ... and {more} more" if more > 0 else "")


class SpantrainError(Exception):
    """Root of every error spantrain raises on purpose."""

    exit_code = 2
    """The command's exit code for it: bad input or a refusal."""


class SpecError(SpantrainError):
    """A cluster spec file is missing, malformed or inconsistent."""


class WorkloadError(SpantrainError):
    """A model preset or workload file is unknown or malformed."""


class PlanError(SpantrainError):
    """A plan file is malformed or does not fit the cluster and workload."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__(join_problems(self.problems))


class InfeasibleError(SpantrainError):
    """A plan is valid but cannot run (for example, it does not fit in memory)."""


class PlannerError(SpantrainError):
    """A planner could not produce a plan (unknown planner, nothing feasible)."""


class ExecutionError(SpantrainError):
    """A training run failed (dead worker, timeout, bad checkpoint)."""


class RunFailed(ExecutionError):
    """A run failed on its own, not on its input: a worker died, hung or lost contact."""

    exit_code = 1


class DiskFull(RunFailed):
    """A file could not be written because its disk is full (the run's own failure: exit code 1)."""


class EmulationError(SpantrainError):
    """The local emulated cluster could not be set up or torn down."""


class PolicyError(SpantrainError):
    """A learned policy is missing, corrupt or incompatible."""
