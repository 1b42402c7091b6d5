"""From padded observations to a graph batch, and the SB3 policy that scores moves.

SB3 only handles fixed-size array observations, so the environment pads devices to N
slots. `GraphPolicyNet` turns a batch of padded observations into one PyG-style batch
(node features of the real devices, the complete directed graph between them, edge
features) here, at the features-extractor boundary, runs the encoder, and returns the
flat action logits plus a value latent. `MaskableGraphPolicy` plugs that into
sb3-contrib's `MaskablePPO`: the logits go straight to the masked categorical
distribution (no extra linear layer), so the action head is per node and per pair.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import torch
from sb3_contrib.common.maskable.policies import MaskableMultiInputActorCriticPolicy
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn

from spantrain.env.spaces import (
    EDGE_BANDWIDTH,
    EDGE_FEATURES,
    EDGE_NEXT_STAGE,
    EDGE_PREV_STAGE,
    GLOBAL_FEATURES,
    KNOBS,
    NODE_FEATURES,
    ActionLayout,
)
from spantrain.errors import SpantrainError
from spantrain.policies.gnn import DeviceGraphEncoder, PlanHeads, check_sizes
from spantrain.policies.train_config import ATTENTION_HEADS

__all__ = ["to_graph", "GraphPolicyNet", "GraphFeaturesExtractor", "MaskableGraphPolicy", "check_observation_space"]


def to_graph(nodes: torch.Tensor, edges: torch.Tensor, mask: torch.Tensor, k: int = 8):
    """A batch of padded observations as one PyG-style disjoint union of graphs.

    Each device receives messages from its `k` fastest peers and from its pipeline
    neighbours. Complete graphs would cost O(N^2) gathers per layer (too slow to train on
    a CPU), while the pair head still sees every edge's features directly.
    Returns (x, edge_index, edge_attr, batch, node_pos): `node_pos` indexes the real nodes
    in the flattened (B * N) slot order, to scatter embeddings back to dense form.
    """
    b, n, _ = nodes.shape
    valid = mask > 0.5
    node_pos = valid.reshape(-1).nonzero(as_tuple=True)[0]
    x = nodes.reshape(b * n, -1)[node_pos]
    batch = node_pos // n
    # position of each slot among the real nodes (for edge_index into x)
    new_index = torch.full((b * n,), -1, dtype=torch.long, device=nodes.device)
    new_index[node_pos] = torch.arange(node_pos.numel(), device=nodes.device)
    pair_ok = valid[:, :, None] & valid[:, None, :]
    pair_ok &= ~torch.eye(n, dtype=torch.bool, device=nodes.device)[None]
    if n - 1 > k:
        score = edges[..., EDGE_BANDWIDTH].masked_fill(~pair_ok, float("-inf"))
        top = torch.zeros_like(pair_ok)
        top.scatter_(2, score.topk(k, dim=2).indices, True)
        adjacent = (edges[..., EDGE_NEXT_STAGE] > 0.5) | (edges[..., EDGE_PREV_STAGE] > 0.5)
        pair_ok &= top | adjacent
    # edge (j -> i): i aggregates from the peers chosen in its row
    gb, gi, gj = pair_ok.nonzero(as_tuple=True)
    edge_index = torch.stack([new_index[gb * n + gj], new_index[gb * n + gi]])
    edge_attr = edges[gb, gi, gj]
    return x, edge_index, edge_attr, batch, node_pos


def _check_batch(obs: Any) -> None:
    """SpantrainError unless `obs` is a batch of observations as float32 tensors: one
    environment observation (numpy, no batch dimension) was a ValueError from inside."""
    fix = "pass {k: torch.as_tensor(v)[None] for k, v in obs.items()} for one PlanEnv observation"
    if not isinstance(obs, Mapping) or any(k not in obs for k in _SHAPES):
        raise SpantrainError(f"GraphPolicyNet takes a dict of nodes, edges, mask and globals tensors: {fix}")
    for k, dims in (("nodes", 3), ("edges", 4), ("mask", 2), ("globals", 2)):
        v = obs[k]
        if not isinstance(v, torch.Tensor) or v.dim() != dims or v.dtype != torch.float32:
            got = f"a {v.dim()}-dim {v.dtype} tensor" if isinstance(v, torch.Tensor) else f"a {type(v).__name__}"
            raise SpantrainError(f"GraphPolicyNet: {k} must be a {dims}-dim float32 tensor (a batch), got {got}: {fix}")


class GraphPolicyNet(nn.Module):
    """Encoder + heads: padded observation dict -> (flat logits, value latent)."""

    def __init__(self, hidden: int = 64, layers: int = 3, heads: int = ATTENTION_HEADS):
        super().__init__()
        self.encoder = DeviceGraphEncoder(NODE_FEATURES, EDGE_FEATURES, hidden=hidden, layers=layers, heads=heads)
        self.heads = PlanHeads(hidden, EDGE_FEATURES, GLOBAL_FEATURES, len(KNOBS))
        self.hidden = hidden
        self.config = {"hidden": hidden, "layers": layers, "heads": heads}

    def forward(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        _check_batch(obs)
        nodes, edges, mask, globals_ = obs["nodes"], obs["edges"], obs["mask"], obs["globals"]
        b, n, _ = nodes.shape
        x, edge_index, edge_attr, batch, node_pos = to_graph(nodes, edges, mask)
        h = self.encoder(x, edge_index, edge_attr)
        g = self.heads.pooled(h, batch, b, globals_)
        dense = h.new_zeros(b * n, self.hidden)
        dense[node_pos] = h
        logits = self.heads(dense.reshape(b, n, self.hidden), edges, g)
        return logits, g


class GraphFeaturesExtractor(BaseFeaturesExtractor):
    """SB3 features extractor whose features are [logits | value latent]."""

    def __init__(self, observation_space: gym.spaces.Dict, hidden: int = 64, layers: int = 3,
                 heads: int = ATTENTION_HEADS, **unknown: Any):
        if unknown:  # features_extractor_kwargs={"hiden": 64} was a TypeError from deep inside SB3
            raise SpantrainError(f"GraphFeaturesExtractor: unknown argument{'s' * (len(unknown) > 1)} "
                                 f"{', '.join(map(repr, sorted(unknown)))}: it takes hidden, layers and heads")
        check_observation_space(observation_space)
        check_sizes(hidden=hidden, layers=layers, heads=heads)  # before features_dim is computed from hidden
        n = observation_space["mask"].shape[0]
        self.n_actions = ActionLayout(n).size
        super().__init__(observation_space, features_dim=self.n_actions + hidden)
        self.net = GraphPolicyNet(hidden=hidden, layers=layers, heads=heads)

    def forward(self, observations: dict[str, torch.Tensor]) -> torch.Tensor:
        logits, latent = self.net(observations)
        return torch.cat([logits, latent], dim=-1)


_SHAPES = {"nodes": lambda n: (n, NODE_FEATURES), "edges": lambda n: (n, n, EDGE_FEATURES), "mask": lambda n: (n,),
           "globals": lambda n: (GLOBAL_FEATURES,)}


def check_observation_space(space: Any) -> None:
    """SpantrainError unless `space` is `PlanEnv`'s observation space (for any padding): a
    flattened one (FlattenObservation) or another environment's was a TypeError or
    KeyError from inside SB3's policy constructor."""
    fix = ("the graph policy reads spantrain.env.plan_env.PlanEnv's Dict observations (nodes, edges, mask, "
           "globals) as the environment gives them: do not flatten or re-shape them")
    if not isinstance(space, gym.spaces.Dict):
        raise SpantrainError(f"observation space is a {type(space).__name__} of shape {getattr(space, 'shape', None)}, "
                             f"not a Dict: {fix}")
    missing = [k for k in _SHAPES if k not in space.spaces]
    if missing:
        raise SpantrainError(f"observation space lacks {', '.join(missing)}: {fix}")
    mask = space["mask"]
    n = mask.shape[0] if isinstance(mask, gym.spaces.Box) and len(mask.shape) == 1 else None
    bad = [f"{k} of shape {getattr(space[k], 'shape', None)}" for k, shape in _SHAPES.items()
           if n is None or not isinstance(space[k], gym.spaces.Box) or space[k].shape != shape(n)]
    if bad:
        raise SpantrainError(f"observation space has {', '.join(bad)}, not PlanEnv's shapes: {fix}")


class _Split(nn.Module):
    """Stands in for SB3's MLP extractor: splits [logits | value latent]."""

    def __init__(self, n_actions: int, latent: int):
        super().__init__()
        self.n_actions = n_actions
        self.latent_dim_pi = n_actions
        self.latent_dim_vf = latent

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return features[:, : self.n_actions], features[:, self.n_actions:]

    def forward_actor(self, features: torch.Tensor) -> torch.Tensor:
        return features[:, : self.n_actions]

    def forward_critic(self, features: torch.Tensor) -> torch.Tensor:
        return features[:, self.n_actions:]


class MaskableGraphPolicy(MaskableMultiInputActorCriticPolicy):
    """MaskablePPO policy whose action logits come from the graph heads directly."""

    def __init__(self, *args: Any, **kwargs: Any):
        if "use_sde" in kwargs:  # stable_baselines3's PPO passes it, MaskablePPO does not; was a TypeError
            raise SpantrainError("MaskableGraphPolicy is for sb3_contrib's MaskablePPO (it masks invalid moves), "
                                 "not stable_baselines3's PPO: use sb3_contrib.MaskablePPO(MaskableGraphPolicy, env)")
        kwargs.setdefault("features_extractor_class", GraphFeaturesExtractor)
        kwargs.setdefault("share_features_extractor", True)
        super().__init__(*args, **kwargs)

    def _build_mlp_extractor(self) -> None:
        n_actions = self.features_extractor.n_actions
        self.mlp_extractor = _Split(n_actions, self.features_dim - n_actions)

    def _build(self, lr_schedule) -> None:
        self._build_mlp_extractor()
        self.action_net = nn.Identity()
        self.value_net = nn.Sequential(nn.Linear(self.mlp_extractor.latent_dim_vf, 64), nn.ReLU(), nn.Linear(64, 1))
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)

    @property
    def graph_net(self) -> GraphPolicyNet:
        return self.features_extractor.net
