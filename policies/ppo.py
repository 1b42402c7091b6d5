"""Deploying the learned policy: the `ppo` and `auto` planners, and policy files.

`ppo` starts from the heuristic's plan (or, when adapting, from the plan that is
running) and lets the policy improve it by moves in `PlanEnv`: one deterministic
rollout plus a few sampled ones (`default_samples`), run as one batch through the
network; the cost model scores every plan visited and the best one wins, so the result
is never worse than the start. When the policy moved devices, the winner's layer cuts
get the heuristic's cut step (`spantrain.policies.cuts`). The network is
size-agnostic, so the environment is padded to the cluster's own size: a policy trained
on 4-32 devices plans 128.

`auto` (the default of `spantrain plan`) is the best of `ppo` and `heuristic`; when the
shipped policy cannot be loaded it says so in one line and returns the heuristic's plan,
the documented fallback (a policy file named in the options must load).

A policy file is a `torch.save`d dict: ``{"format": 1, "net": {...config}, "env": {...},
"state_dict": {...}, "meta": {...}}`` (weights only, loadable with `weights_only=True`);
files written by training also carry ``"value_state_dict"``, the critic's value head.
The shipped one lives in `spantrain/policies/assets/ppo-policy.pt`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import math
import os
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from spantrain._say import note, warn
from spantrain._spec import shown
from spantrain.cluster import Cluster
from spantrain.env.calibration import Calibration
from spantrain.env.evaluator import Candidate, Evaluator
from spantrain.errors import PlannerError, PolicyError, SpantrainError
from spantrain.plan import Plan
from spantrain.planner import gc_paused
from spantrain.policies.cuts import refine_cuts
from spantrain.policies.train_config import MAX_SEED
from spantrain.workload import Workload

__all__ = ["PPOConfig", "PPOPlanner", "AutoPlanner", "SHIPPED_POLICY", "MAX_POLICY_DEVICES", "load_policy",
           "save_policy", "load_value_head", "load_failure", "improve", "default_samples", "check_policy_size",
           "past_policy_size"]

SHIPPED_POLICY = Path(__file__).resolve().parent / "assets" / "ppo-policy.pt"
_FORMAT = 1


def _weights(weights) -> dict:
    """A module's (or a state dict's) tensors, detached CPU copies."""
    state = weights.state_dict() if hasattr(weights, "state_dict") else weights
    return {k: v.detach().cpu().clone() for k, v in state.items()}


def save_policy(net, path: str | Path, *, env: Any = None, meta: dict[str, Any] | None = None,
                value=None) -> Path:
    """Write a policy file (module docstring). `net`: a GraphPolicyNet, or a MaskablePPO model
    (or its MaskableGraphPolicy), whose value head is kept too; `env`: the settings it was
    trained with (a dict or an EnvConfig; deployment reads max_steps and horizon); `value`:
    the critic's value head (module or state dict), kept so training can continue from the
    file (`TrainConfig.init_policy`)."""
    import torch

    from spantrain.policies.extractor import MaskableGraphPolicy

    policy = getattr(net, "policy", net)
    if value is None and isinstance(policy, MaskableGraphPolicy):
        value = policy.value_net
    net = _graph_net(net)  # a model or its policy had no attribute 'config'
    if dataclasses.is_dataclass(env) and not isinstance(env, type):
        env = dataclasses.asdict(env)
    elif env is None:
        env = {}
    elif not isinstance(env, Mapping):  # an EnvConfig was "'EnvConfig' object is not iterable"
        raise PolicyError(f"env must be a dict of the policy's environment settings (or an EnvConfig), got {env!r:.60}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = {"format": _FORMAT, "net": dict(net.config), "env": dict(env), "state_dict": _weights(net),
            "meta": dict(meta or {})}
    if value is not None:
        blob["value_state_dict"] = _weights(value)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(blob, tmp)
    tmp.replace(path)
    return path


def load_policy(path: str | Path | None = None, *, option: str = "--policy", resume_fix: str | None = None):
    """(GraphPolicyNet in eval mode, env settings, meta) from a policy file (the shipped one
    when `path` is None); `PolicyError` in one line if it is missing or unusable, naming the
    file as `option` (the flag that named it) and what to pass instead. `resume_fix`: what to
    say besides when the file is a training run's resume state (``resume.pt``)."""
    if path is not None and not isinstance(path, str | os.PathLike):  # 5 was a TypeError from Path()
        raise PolicyError(f"{option} must be the path of a policy file, got {path!r:.80}")
    shipped = not path
    path = SHIPPED_POLICY if shipped else Path(path)
    # without the shipped policy the heuristic remains; a file the user named is theirs to fix
    heuristic = " or use --planner heuristic" if shipped else ""
    if not path.exists():
        fix = "pass a policy file written by `spantrain train-policy`" if not shipped else \
            f"train one with `spantrain train-policy`{heuristic}"
        raise PolicyError(f"policy file {path} not found: {fix}")
    who = f"the shipped policy {path}" if shipped else f"{option} {path}"
    fix = (f"reinstall spantrain{heuristic}" if shipped else
           "pass a policy file written by `spantrain train-policy` (a run's best-policy.pt, ppo-policy.pt or a "
           "checkpoint)")
    if path.is_dir():
        # a training run's --out-dir: name the file in it to pass
        inside = _run_policy(path) if any((path / n).is_file() for n in _RUN_POLICIES) else fix
        raise PolicyError(f"{who} is a directory, not a policy file: {inside}")
    with contextlib.suppress(OSError):  # unreadable: torch.load says so below
        if not stat.S_ISREG(path.stat().st_mode):  # torch.load waited on a FIFO for a writer, for ever
            raise PolicyError(f"{who} is not a regular file (a pipe or a device): {fix}")
    import torch

    from spantrain.policies.extractor import GraphPolicyNet

    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # text, a foreign pickle, an empty or truncated file
        if _damaged(e, path):
            raise PolicyError(f"{who} is damaged or truncated: {fix}") from None
        if isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EPERM, errno.EIO):  # may well be a policy
            raise PolicyError(f"{who} cannot be read ({e.strerror})") from None
        if _sb3_model(path):  # what MaskablePPO.save writes, with the graph policy inside
            raise PolicyError(f"{who} is a stable-baselines3 model file (MaskablePPO.save), not a policy file: "
                              "write one from the model with spantrain.policies.ppo.save_policy(model, PATH)") from None
        # torch's reasons (an unpickler's KeyError: 105 for a text file) say nothing to a user
        raise PolicyError(f"{who} is not a spantrain policy file (not a torch file of tensors): {fix}") from None
    if isinstance(blob, dict) and {"optimizer", "num_timesteps", "config"} <= blob.keys():
        raise PolicyError(f"{who} is a training run's resume state, not a policy file: "
                          + "; or ".join(filter(None, [resume_fix, _run_policy(path.parent)])))
    if not isinstance(blob, dict) or "format" not in blob:
        what = "a dict without a 'format' key" if isinstance(blob, dict) else f"a {type(blob).__name__}"
        raise PolicyError(f"{who} is not a spantrain policy file (it holds {what}): {fix}")
    # another spantrain version's file: its writer, or this version's training, can make one that loads
    again = (f"reinstall spantrain{heuristic}" if shipped else
             "retrain it with this version's `spantrain train-policy`, or use the spantrain version that wrote it")
    if blob["format"] != _FORMAT:
        raise PolicyError(f"{who} has format {shown(blob['format'])}, this spantrain version reads format "
                          f"{_FORMAT}: {again}")
    # the rollout length and migration horizon deployment reads: a bad one failed mid-plan with a traceback
    env = blob.get("env", {})
    bad = ([f"env {shown(env)}"] if not isinstance(env, dict) else
           [f"{k} {shown(env[k])}" for k in ("max_steps", "horizon", "max_devices") if k in env
            and (isinstance(env[k], bool) or not isinstance(env[k], int) or env[k] < 1)])
    if bad:
        raise PolicyError(f"{who} has unusable settings ({', '.join(bad)}; each must be a positive integer): {again}")
    try:
        net = GraphPolicyNet(**blob["net"])
        net.load_state_dict(blob["state_dict"])
    except Exception as e:  # a policy file whose network does not build: say which and how to fix it
        raise PolicyError(f"policy file {path} is unusable ({load_failure(e)}); retrain it with "
                          f"`spantrain train-policy`{heuristic}") from None
    # bytes overwritten inside the zip still load: the weights hold NaN, and so did every rollout
    if not all(torch.isfinite(t).all() for t in net.state_dict().values() if t.is_floating_point()):
        raise PolicyError(f"{who} is damaged (its weights hold NaN or infinite values): {fix}")
    net.eval()
    return net, blob.get("env", {}), blob.get("meta", {})


_RUN_POLICIES = ("best-policy.pt", "ppo-policy.pt", "interrupted-policy.pt")
"""A training run's policy files in its output directory, the one to deploy first."""


def _run_policy(run_dir: Path) -> str:
    """Which policy file of a training run to pass instead of its resume state (or its directory)."""
    for name in _RUN_POLICIES:
        if (run_dir / name).is_file():
            return f"pass its policy file {run_dir / name}"
    return "pass the run's best-policy.pt or ppo-policy.pt from the same directory (written when it ends)"


def _damaged(e: Exception, path: Path | None = None) -> bool:
    """Whether torch.load failed on a torch file (`path`, if known) cut short: a full disk, a copy cut off."""
    return isinstance(e, EOFError) or "PytorchStreamReader" in str(e) or (path is not None and _cut_zip(path))


def _sb3_model(path: Path) -> bool:
    """Whether `path` is a stable-baselines3 model zip (`model.save`)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            return {"data", "policy.pth"} <= set(z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def _cut_zip(path: Path) -> bool:
    """Whether `path` starts like a zip (torch's format) but lost its end record: a file cut short.
    torch's own errors for that vary with where the cut falls (an OSError EINVAL near the end)."""
    import zipfile

    try:
        with open(path, "rb") as f:
            head = f.read(4)
        return head == b"PK\x03\x04" and not zipfile.is_zipfile(path)
    except OSError:
        return False


def load_failure(e: Exception, path: Path | None = None) -> str:
    """A short reason a file (`path`, if given) did not load: torch's messages run to many lines of advice."""
    import pickle

    if isinstance(e, pickle.UnpicklingError):
        return "not a torch file of tensors and plain data"
    if _damaged(e, path):
        return "empty or truncated"
    text = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
    text = text if len(text) <= 120 else text[:117] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def load_value_head(path: str | Path) -> dict | None:
    """The critic's value-head weights a policy file carries (files written by training
    do), or None; call after `load_policy` accepted the file."""
    import torch

    return torch.load(Path(path), map_location="cpu", weights_only=True).get("value_state_dict")


@dataclass(frozen=True, kw_only=True)
class PPOConfig:
    """Options of the `ppo` planner."""

    policy: str | None = None
    """Policy file; the shipped policy when None."""
    samples: int | None = None
    """Sampled rollouts besides the deterministic one; None: `default_samples` of the
    cluster's size (4 up to 32 devices, 1 beyond, to keep plan latency within budget)."""
    steps: int | None = None
    """Moves per rollout; the policy's training episode length when None."""
    seed: int = 0
    """Seed of the sampled rollouts."""

    def __post_init__(self) -> None:
        # every problem at once; a seed of nan or "x" failed in torch.manual_seed, a policy of 5 in Path()
        problems = []
        if self.policy is not None and not isinstance(self.policy, str | os.PathLike):
            problems.append(f"policy must be the path of a policy file, got {self.policy!r}")
        if self.samples is not None and (isinstance(self.samples, bool) or not isinstance(self.samples, int)
                                         or self.samples < 0):
            problems.append(f"samples must be an integer >= 0, got {self.samples!r}")
        if self.steps is not None and (isinstance(self.steps, bool) or not isinstance(self.steps, int)
                                       or self.steps < 1):
            problems.append(f"steps must be a positive integer, got {self.steps!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED:
            # 2**70 was torch's "Overflow when unpacking long long" mid-plan
            problems.append(f"seed must be an integer from 0 to {MAX_SEED}, got {self.seed!r}")
        if problems:
            raise SpantrainError("ppo: " + "; ".join(problems))


MAX_POLICY_DEVICES = 1024
"""The largest cluster the policy plans. Its pair moves grow with the square of the devices: at
1,024 a plan took 13 s and 1.9 GB (the heuristic 1.5 s), at 4,096 the policy ran out of what
torch can sample from after 44 s and 18 GB. Beyond it `ppo` refuses and `auto` plans with the
heuristic, saying so."""


def check_policy_size(devices: int) -> None:
    """`PolicyError` for a cluster larger than the policy plans (`MAX_POLICY_DEVICES`)."""
    if devices > MAX_POLICY_DEVICES:
        raise PolicyError(f"the policy plans clusters of up to {MAX_POLICY_DEVICES:,} devices, this one has "
                          f"{devices:,} (its moves grow with the square of the devices): use --planner heuristic")


def past_policy_size(devices: int, doing: str) -> bool:
    """Whether `auto` goes without the policy on a cluster this large (`MAX_POLICY_DEVICES`),
    saying so: a note, not the warning of a policy that failed."""
    if devices <= MAX_POLICY_DEVICES:
        return False
    note(f"{devices:,} devices, more than the policy plans ({MAX_POLICY_DEVICES:,}): {doing}")
    return True


def default_samples(devices: int) -> int:
    """Sampled rollouts for a cluster: 4 at training sizes (up to 32 devices), 1 beyond.
    A rollout's steps cost about linearly in devices, and beyond 32 the heuristic start
    already takes most of the 1 s budget: at 64 devices each sampled rollout costs
    0.06-0.12 s, and on the 9 held-out 64-device cases two of them found nothing."""
    return 4 if devices <= 32 else 1


def improve(net, scenario, *, steps: int, samples: int, seed: int, horizon: int = 500) -> Candidate:
    """The best plan the policy reaches from `scenario.start` (deterministic + sampled rollouts)."""
    import torch

    from spantrain.env.plan_env import EnvConfig, PlanEnv

    net = _graph_net(net)
    n = max(len(scenario.cluster), 2)
    cfg = EnvConfig(max_devices=n, min_devices=2, max_steps=steps, horizon=horizon)
    envs = [PlanEnv(cfg) for _ in range(samples + 1)]
    for e in envs:
        e.load(scenario)
    gen = torch.Generator().manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small graphs: one thread is faster than two contending ones
    alive = list(range(len(envs)))
    obs = [e._obs() for e in envs]
    try:
        _rollouts(net, envs, obs, alive, steps, gen)
    finally:
        torch.set_num_threads(threads)
    return max((e.best for e in envs), key=envs[0]._effective)


def _graph_net(net):
    """The GraphPolicyNet of `net`: itself, or that of a MaskablePPO model or its policy
    (which were a TypeError, 'not callable', or a shape error from inside torch)."""
    from spantrain.policies.extractor import GraphPolicyNet, MaskableGraphPolicy

    policy = getattr(net, "policy", net)
    # only MaskableGraphPolicy acts on the graph net's logits: another policy's extractor feeds an MLP
    net = policy.graph_net if isinstance(policy, MaskableGraphPolicy) else net
    if not isinstance(net, GraphPolicyNet):
        raise PolicyError(f"the policy must be a GraphPolicyNet (load_policy(path)[0]) or a MaskablePPO model with "
                          f"the graph policy (MaskableGraphPolicy), got {type(net).__name__}")
    return net


def _rollouts(net, envs, obs, alive, steps, gen) -> None:
    import torch

    with torch.no_grad():
        for _ in range(steps):
            if not alive:
                break
            batch = {k: torch.as_tensor(np.stack([obs[i][k] for i in alive])) for k in obs[0]}
            logits, _ = net(batch)
            masks = torch.as_tensor(np.stack([envs[i].action_masks() for i in alive]))
            if not torch.isfinite(logits).all():  # finite weights can still overflow: say so, not multinomial's error
                raise PolicyError("the policy's outputs are not finite numbers on this cluster: its weights are "
                                  "unusable; retrain it with `spantrain train-policy` or use --planner heuristic")
            logits = logits.masked_fill(~masks, -math.inf)
            greedy = logits.argmax(dim=-1)
            sampled = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=gen).squeeze(-1)
            still = []
            for row, i in enumerate(alive):
                action = int(greedy[row] if i == 0 else sampled[row])
                obs[i], _, term, trunc, _ = envs[i].step(action)
                if not (term or trunc):
                    still.append(i)
            alive = still


def heuristic_start(heuristic, ev: Evaluator, planner: str) -> Candidate:
    """The heuristic's candidate `planner` starts from; its errors named as `planner`'s (the user
    asked for ppo, and read "heuristic: model ... fits nowhere")."""
    try:
        return heuristic.best_candidate(ev)
    except PlannerError as e:
        raise PlannerError(f"{planner}: {str(e).removeprefix('heuristic: ')}") from None


class PPOPlanner:
    """The learned policy improving the heuristic's plan (module docstring)."""

    name = "ppo"

    def __init__(self, config: PPOConfig | None = None, **options: Any):
        self.config = config or PPOConfig(**options)
        self._net = None
        self._env_settings: dict[str, Any] = {}
        self.stats: dict[str, float] = {}

    def _load(self):
        if self._net is None:
            self._net, self._env_settings, _ = load_policy(self.config.policy)
        return self._net

    def prepare(self) -> None:
        """Load the policy now (imports torch); `PolicyError` if it cannot be loaded."""
        self._load()

    def plan(self, cluster: Cluster, workload: Workload, calibration: Calibration | None = None) -> Plan:
        ev = Evaluator(cluster, workload, calibration=calibration)
        return ev.to_plan(self.best_candidate(ev))

    def best_candidate(self, ev: Evaluator, start: Candidate | None = None) -> Candidate:
        from spantrain.env.plan_env import Scenario
        from spantrain.policies.heuristic import HeuristicPlanner

        check_policy_size(len(ev.cluster))
        self._load()
        t0 = time.perf_counter()
        with gc_paused():
            if start is None:
                start = heuristic_start(HeuristicPlanner(), ev, "ppo")
            t1 = time.perf_counter()
            scenario = Scenario(key=("given",), cluster=ev.cluster, workload=ev.workload, evaluator=ev, start=start)
            best = self.improve(scenario)
            if best is not start:  # the policy moved devices: its layout gets the heuristic's cut step
                best = refine_cuts(ev, best)
        self.stats = {"plan_s": time.perf_counter() - t0, "start_s": t1 - t0, "policy_s": time.perf_counter() - t1,
                      "gain": start.time / best.time}
        return best

    def improve(self, scenario, *, horizon: int | None = None) -> Candidate:
        """The best plan the policy reaches from `scenario.start`; `horizon`: iterations
        over which a migration is amortized (the policy's training horizon when None)."""
        check_policy_size(len(scenario.cluster))
        net = self._load()
        steps = self.config.steps or int(self._env_settings.get("max_steps", 12))
        samples = self.config.samples
        if samples is None:
            samples = default_samples(len(scenario.cluster))
        return improve(net, scenario, steps=steps, samples=samples, seed=self.config.seed,
                       horizon=horizon or int(self._env_settings.get("horizon", 500)))


class AutoPlanner:
    """Best of `ppo` and `heuristic`; the heuristic alone when the shipped policy does not load."""

    name = "auto"

    def __init__(self, *, allow_local_sgd: bool = False, **options: Any):
        """`allow_local_sgd` goes to the heuristic (whose plan the policy starts from; the
        policy's own moves pick among all-reduce and hierarchical sync), the rest to `ppo`."""
        from spantrain.policies.heuristic import HeuristicConfig

        self.heuristic = HeuristicConfig(allow_local_sgd=allow_local_sgd)
        self.ppo = PPOPlanner(**options)
        self.stats: dict[str, Any] = {}

    def prepare(self) -> None:
        """Load the policy now when it can be; when the shipped one cannot, `plan` says so and
        falls back. A policy file named in the options must load (`PolicyError`)."""
        if self.ppo.config.policy:
            self.ppo.prepare()
            return
        with contextlib.suppress(PolicyError):
            self.ppo.prepare()

    def plan(self, cluster: Cluster, workload: Workload, calibration: Calibration | None = None) -> Plan:
        ev = Evaluator(cluster, workload, calibration=calibration)
        return ev.to_plan(self.best_candidate(ev))

    def best_candidate(self, ev: Evaluator) -> Candidate:
        from spantrain.policies.heuristic import HeuristicPlanner

        heuristic = heuristic_start(HeuristicPlanner(self.heuristic), ev, "auto")
        if past_policy_size(len(ev.cluster), "using the heuristic plan"):  # not an error: auto is the default
            self.stats = {"chosen": "heuristic", "fallback": "too many devices for the policy"}
            return heuristic
        try:
            self.ppo.prepare()
            learned = self.ppo.best_candidate(ev, start=heuristic)
        except PolicyError as e:
            if self.ppo.config.policy:  # the fallback is for the shipped policy, not a file the user named
                raise
            warn(f"{e}; using the heuristic plan")
            self.stats = {"chosen": "heuristic", "fallback": str(e)}
            return heuristic
        chosen = learned if learned.time < heuristic.time else heuristic
        self.stats = {"chosen": "ppo" if chosen is learned and learned.time < heuristic.time else "heuristic",
                      **self.ppo.stats}
        return chosen
