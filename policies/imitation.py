"""A warm start for PPO: imitate a one-step lookahead expert (behaviour cloning + DAgger).

Trained from scratch, PPO in `PlanEnv` learned to stop at once: from the heuristic's
plan almost every move loses throughput, so the first thing a random policy learns is
that stopping is never punished, before it finds the few move sequences that pay. The
expert here needs no learning: it tries every valid move of the current plan with the
cost model and takes the one that raises effective throughput (migration included) the
most, or stops when none raises it by `MIN_GAIN`. Its decisions are cheap (the cost
model scores a few hundred to a few thousand moves a second), so its labels are
plentiful; the policy learns to predict them from the graph alone, which is what makes
it fast at deployment and applicable to clusters the expert would be slow on.

`clone` runs rounds of DAgger (Ross et al., 2011): round 0 follows the expert, later
rounds follow the current policy (sampled) and label every state it visits with the
expert's move, so the policy also learns to recover from its own mistakes; each round
trains on all labels so far with a masked cross-entropy for the actor and the
discounted return-to-go of the expert's episodes for the critic (a value head that
matches the actor, so PPO does not start by unlearning it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from spantrain.env.evaluator import Candidate
from spantrain.env.moves import canonical
from spantrain.env.plan_env import PlanEnv

__all__ = ["MIN_GAIN", "ImitationStats", "expert_action", "expert_rollout", "beam_search", "anneal", "collect",
           "clone"]

MIN_GAIN = 1e-3
"""Relative gain in effective throughput below which the expert stops."""


def expert_action(env: PlanEnv) -> int:
    """The valid move that raises effective throughput most, or stop when none gains `MIN_GAIN`."""
    stop = env.actions.stop
    best_eff = env._effective(env.current) * (1 + MIN_GAIN)
    best = stop
    for a in np.flatnonzero(env.valid_action_mask()):
        if a == stop:
            continue
        cand = env.preview(int(a))
        if cand.feasible:
            eff = env._effective(cand)
            if eff > best_eff:
                best_eff, best = eff, int(a)
    return best


def expert_rollout(env: PlanEnv) -> Candidate:
    """Follow the expert from the loaded scenario's start until it stops or the episode
    ends; the best plan visited (the headroom a perfect imitator of it would reach)."""
    stop = env.actions.stop
    done = False
    while not done:
        action = expert_action(env)
        if action == stop:
            break
        _, _, term, trunc, _ = env.step(action)
        done = term or trunc
    return env.best


def beam_search(env: PlanEnv, width: int = 8, depth: int | None = None) -> Candidate:
    """The best plan within `depth` moves (the episode length when None) of the current
    one, by beam search: every valid move of each of the `width` best plans of a level
    (plans seen before skipped), the `width` best feasible results form the next level.
    Unlike the lookahead expert it passes through worse plans, so it finds improvements
    that need several moves; a bound on what a policy over these moves can reach from
    here, at `width` x depth x (valid moves) cost-model calls."""
    if width < 1:
        raise ValueError(f"beam_search: width must be >= 1, got {width}")
    stop = env.actions.stop
    depth = env.config.max_steps if depth is None else depth
    seen = {(canonical(env.current.layout), env.current.knobs)}
    level = [env.current]
    best = env.current
    for _ in range(depth):
        children = []
        for cand in level:
            mask = env.valid_action_mask(cand)
            mask[stop] = False
            for a in np.flatnonzero(mask):
                layout, knobs = env.moved(cand, int(a))
                key = (canonical(layout), knobs)
                if key in seen:
                    continue
                seen.add(key)  # skipped before scoring: many move orders reach the same plan
                child = env.scenario.evaluator.balance(layout, knobs)
                if child.feasible:
                    children.append((env._effective(child), len(children), child))
        if not children:
            break
        children.sort(key=lambda x: (-x[0], x[1]))
        level = [c for _, _, c in children[:width]]
        if children[0][0] > env._effective(best):
            best = level[0]
    return best


def anneal(env: PlanEnv, steps: int, chains: int = 4, *, t_start: float = 0.3, t_end: float = 3e-4,
           seed: int = 0) -> Candidate:
    """The fastest plan simulated annealing finds from the current one: `chains` walks of
    `steps` uniformly drawn valid moves each, a move to a plan of time t' from one of
    time t accepted with probability min(1, (t / t')^(1 / T)), T cooling geometrically
    from `t_start` to `t_end`. Unlike the beam it is not bounded by an episode's length
    and escapes local optima by design; a wider bound on what these moves can reach.
    Judged by iteration time (it serves planning from scratch, where nothing migrates)."""
    if steps < 1 or chains < 1:
        raise ValueError(f"anneal: steps and chains must be >= 1, got {steps} and {chains}")
    rng = np.random.default_rng(seed)
    stop = env.actions.stop
    start = best = env.current
    for _ in range(chains):
        cur = start
        for k in range(steps):
            temp = t_start * (t_end / t_start) ** (k / steps)
            mask = env.valid_action_mask(cur)
            mask[stop] = False
            moves = np.flatnonzero(mask)
            if len(moves) == 0:
                break
            cand = env.scenario.evaluator.balance(*env.moved(cur, int(rng.choice(moves))))
            if not cand.feasible:
                continue
            gain = math.log(cur.time / cand.time)
            if gain >= 0 or rng.random() < math.exp(gain / temp):
                cur = cand
                if cur.time < best.time:
                    best = cur
    return best


@dataclass
class _Samples:
    obs: dict[str, list[np.ndarray]]
    masks: list[np.ndarray]
    actions: list[int]
    returns: list[float]

    def __len__(self) -> int:
        return len(self.actions)


def collect(env: PlanEnv, episodes: int, *, act=None, gamma: float = 0.95, samples: _Samples | None = None,
            progress=None) -> _Samples:
    """Expert-labelled states of `episodes` episodes; the episode follows `act(obs, mask)`
    when given (DAgger), the expert otherwise. Returns-to-go are those of the actions taken."""
    out = samples or _Samples(obs={}, masks=[], actions=[], returns=[])
    for _ in range(episodes):
        obs, _ = env.reset()
        rewards: list[float] = []
        first = len(out)
        done = False
        while not done:
            mask = env.action_masks()
            label = expert_action(env)
            for k, v in obs.items():
                out.obs.setdefault(k, []).append(v)
            out.masks.append(mask)
            out.actions.append(label)
            action = label if act is None else int(act(obs, mask))
            obs, reward, term, trunc, _ = env.step(action)
            rewards.append(float(reward))
            done = term or trunc
        ret = 0.0
        tail = []
        for r in reversed(rewards):
            ret = r + gamma * ret
            tail.append(ret)
        out.returns.extend(reversed(tail))
        assert len(out.returns) == len(out) and len(out) - first == len(rewards)
        if progress is not None:
            progress.update(1)
    return out


@dataclass
class ImitationStats:
    """What `clone` did, for logs and the policy file's metadata."""

    samples: int
    stop_share: float
    accuracy: float
    loss: float


def _train(policy, data: _Samples, epochs: int, batch_size: int, rng: np.random.Generator,
           lr: float = 1e-3) -> tuple[float, float]:
    """`epochs` passes of supervised training; (mean loss, accuracy of the masked argmax)."""
    import torch
    import torch.nn.functional as F

    saved = [g["lr"] for g in policy.optimizer.param_groups]
    for g in policy.optimizer.param_groups:
        g["lr"] = lr  # supervised labels take a larger step than PPO's (it restores its own)

    n = len(data)
    obs = {k: torch.as_tensor(np.stack(v)) for k, v in data.obs.items()}
    masks = torch.as_tensor(np.stack(data.masks))
    actions = torch.as_tensor(data.actions)
    returns = torch.as_tensor(data.returns, dtype=torch.float32)
    policy.set_training_mode(True)
    loss_sum, seen = 0.0, 0
    for _ in range(epochs):
        for idx in np.array_split(rng.permutation(n), max(1, math.ceil(n / batch_size))):
            i = torch.as_tensor(idx)
            values, log_prob, _ = policy.evaluate_actions({k: v[i] for k, v in obs.items()}, actions[i],
                                                          action_masks=masks[i])
            loss = -log_prob.mean() + 0.5 * F.smooth_l1_loss(values.flatten(), returns[i])
            policy.optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 0.5)
            policy.optimizer.step()
            loss_sum += loss.item() * len(idx)
            seen += len(idx)
    policy.set_training_mode(False)
    for g, v in zip(policy.optimizer.param_groups, saved):
        g["lr"] = v
    with torch.no_grad():
        correct = 0
        for idx in np.array_split(np.arange(n), max(1, math.ceil(n / batch_size))):
            i = torch.as_tensor(idx)
            dist = policy.get_distribution({k: v[i] for k, v in obs.items()}, action_masks=masks[i].numpy())
            correct += int((dist.distribution.probs.argmax(-1) == actions[i]).sum())
    return loss_sum / max(seen, 1), correct / max(n, 1)


def clone(policy, env: PlanEnv, *, episodes: int, rounds: int, epochs: int, batch_size: int = 64,
          lr: float = 1e-3, gamma: float = 0.95, seed: int = 0, progress: bool = False,
          stats: list[ImitationStats] | None = None) -> list[ImitationStats]:
    """DAgger on `policy` (an sb3-contrib maskable actor-critic policy): `rounds` rounds of
    `episodes` episodes each (module docstring). Returns the statistics of every round,
    appended to `stats` as each round ends (what an interrupted caller has learned)."""
    import torch
    from tqdm import tqdm

    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)

    def act(obs, mask):
        with torch.no_grad():
            t = {k: torch.as_tensor(v)[None] for k, v in obs.items()}
            probs = policy.get_distribution(t, action_masks=mask[None]).distribution.probs
            return int(torch.multinomial(probs, 1, generator=gen))

    data: _Samples | None = None
    stats = [] if stats is None else stats
    # closed on Ctrl-C too: a message after it then starts on a line of its own
    with tqdm(total=episodes * rounds, desc="imitation", unit="episode", disable=not progress) as bar:
        for r in range(rounds):
            data = collect(env, episodes, act=None if r == 0 else act, gamma=gamma, samples=data, progress=bar)
            loss, accuracy = _train(policy, data, epochs, batch_size, rng, lr)
            stop_share = float(np.mean(np.array(data.actions) == env.actions.stop))
            stats.append(ImitationStats(samples=len(data), stop_share=stop_share, accuracy=accuracy, loss=loss))
            bar.set_postfix(samples=len(data), acc=f"{accuracy:.2f}")
    return stats
