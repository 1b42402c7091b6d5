"""Plain-torch transformer layers that match `Workload.layers` one for one.

Layer ``i`` of the built model is layer ``i`` of the workload: the embedding first, one
module per transformer block, and the head last (final norm, untied projection; the loss
is `loss_fn`, applied to the head's output). A plan's half-open layer range ``[a, b)``
therefore cuts the real model, and `build_stage_module` builds exactly that range.

Initialisation is deterministic per layer: layer ``i`` draws its weights from a generator
seeded by ``(seed, i)`` only, so the same seed gives the same weights however the model
is cut into stages. Every parameter count equals `Layer.params` (a test checks it).

Families (the workload docstring gives the formulas):

- ``gpt2``: learned positions, pre-LayerNorm blocks with biases, GELU MLP, causal.
- ``llama``: no position table (rotary embeddings, no parameters), RMSNorm, SwiGLU MLP,
  no biases, causal.
- ``bert``: learned positions + token types + embedding LayerNorm, post-LayerNorm blocks,
  bidirectional attention, MLM head (dense + GELU + LayerNorm + decoder with bias).

There is no dropout: the runtime must give bit-for-bit the same function however the
model is cut, and dropout would tie results to each rank's random stream.

Mixed precision (``precision="bf16"`` or ``"fp16"``, `TRAIN_PRECISIONS`; bf16 below): parameters,
gradients and AdamW's state stay fp32; a stage computes under `torch.autocast` in bf16, keeps the
residual stream in fp32 inside itself, and hands the next stage bf16 activations (so
activations and their gradients cross the wire at 2 bytes, as the cost model assumes).
The last stage's output (the logits) is fp32, so the loss is computed in fp32. The cut
points round activations to bf16, so results depend slightly on where the model is cut,
unlike in fp32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from spantrain.errors import WorkloadError
from spantrain.runtime.preflight import require_arch
from spantrain.workload import Architecture, Workload

__all__ = ["IGNORE_INDEX", "TRAIN_PRECISIONS", "build_layer", "build_stage_module", "StageModule", "loss_fn",
           "layer_seed", "param_key", "require_arch"]

IGNORE_INDEX = -100
"""Target value for positions that carry no loss (BERT's unmasked tokens)."""

TRAIN_PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
"""What the runtime trains in -> the autocast dtype (None: plain fp32). fp16 also needs its
loss scaled (`spantrain.runtime.loss_scale`, which the worker adds)."""

_STD = 0.02
_RESIDUAL_OUTPUTS = frozenset({"attn.out.weight", "mlp.proj.weight", "mlp.down.weight"})


def layer_seed(seed: int, index: int) -> int:
    """The generator seed of layer `index` (depends on nothing else, so cuts do not matter)."""
    return (int(seed) * 1_000_003 + int(index) * 7_919 + 12_345) % (2**63 - 1)


def param_key(layer_index: int, name: str) -> str:
    """The plan-independent name of a parameter: ``layers.{i}.{name inside the layer}``."""
    return f"layers.{layer_index}.{name}"


# ---- building blocks -----------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale (h parameters)."""

    def __init__(self, dim: int, eps: float = 1e-5, device: torch.device | str | None = None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotary(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding over (batch, heads, seq, head_dim); no parameters."""
    s, d = x.shape[-2], x.shape[-1]
    half = d // 2
    inv = 1.0 / (10000 ** (torch.arange(0, half, device=x.device, dtype=torch.float32) / half))
    ang = torch.arange(s, device=x.device, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:2 * half]
    rot = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return torch.cat([rot, x[..., 2 * half:]], dim=-1) if d % 2 else rot


class Attention(nn.Module):
    """Multi-head self-attention: fused QKV (GPT-2/BERT, with bias) or separate q/k/v/o (Llama, no bias)."""

    def __init__(self, arch: Architecture, device: torch.device | str | None):
        super().__init__()
        h = arch.d_model
        self.n_heads = arch.n_heads
        self.causal = arch.family != "bert"
        self.rotary = arch.family == "llama"
        bias = arch.family != "llama"
        if arch.family == "llama":
            self.q = nn.Linear(h, h, bias=False, device=device)
            self.k = nn.Linear(h, h, bias=False, device=device)
            self.v = nn.Linear(h, h, bias=False, device=device)
        else:
            self.qkv = nn.Linear(h, 3 * h, bias=bias, device=device)
        self.out = nn.Linear(h, h, bias=bias, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        if hasattr(self, "qkv"):
            q, k, v = self.qkv(x).split(h, dim=-1)
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        q, k, v = (t.view(b, s, self.n_heads, h // self.n_heads).transpose(1, 2) for t in (q, k, v))
        if self.rotary:
            q, k = _rotary(q), _rotary(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.out(y.transpose(1, 2).reshape(b, s, h))


class MLP(nn.Module):
    """GELU MLP (GPT-2/BERT) or SwiGLU (Llama: gate, up and down matrices, no bias)."""

    def __init__(self, arch: Architecture, device: torch.device | str | None):
        super().__init__()
        h, f = arch.d_model, arch.d_ff
        self.swiglu = arch.family == "llama"
        if self.swiglu:
            self.gate = nn.Linear(h, f, bias=False, device=device)
            self.up = nn.Linear(h, f, bias=False, device=device)
            self.down = nn.Linear(f, h, bias=False, device=device)
        else:
            self.fc = nn.Linear(h, f, device=device)
            self.proj = nn.Linear(f, h, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


# ---- the three layer kinds ---------------------------------------------------------------------------


class Embedding(nn.Module):
    """Token ids (batch, seq) -> hidden states (batch, seq, h)."""

    def __init__(self, arch: Architecture, device: torch.device | str | None):
        super().__init__()
        self.family = arch.family
        self.tok = nn.Embedding(arch.vocab_size, arch.d_model, device=device)
        if arch.family in ("gpt2", "bert"):
            self.pos = nn.Embedding(arch.max_seq_len, arch.d_model, device=device)
        if arch.family == "bert":
            self.segment = nn.Embedding(2, arch.d_model, device=device)  # token types
            self.norm = nn.LayerNorm(arch.d_model, device=device)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids)
        if hasattr(self, "pos"):
            x = x + self.pos(torch.arange(ids.shape[1], device=ids.device))
        if self.family == "bert":
            # One segment: every token has type 0.
            x = self.norm(x + self.segment.weight[0])
        return x


class Block(nn.Module):
    """One transformer block; pre-norm (GPT-2, Llama) or post-norm (BERT)."""

    def __init__(self, arch: Architecture, device: torch.device | str | None):
        super().__init__()
        self.post_norm = arch.family == "bert"
        norm = (lambda: RMSNorm(arch.d_model, device=device)) if arch.family == "llama" else \
            (lambda: nn.LayerNorm(arch.d_model, device=device))
        self.norm1 = norm()
        self.attn = Attention(arch, device)
        self.norm2 = norm()
        self.mlp = MLP(arch, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.post_norm:
            x = self.norm1(x + self.attn(x))
            return self.norm2(x + self.mlp(x))
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Head(nn.Module):
    """Final norm and untied projection to the vocabulary (BERT: MLM transform first)."""

    def __init__(self, arch: Architecture, device: torch.device | str | None):
        super().__init__()
        h, V = arch.d_model, arch.vocab_size
        self.mlm = arch.family == "bert"
        if self.mlm:
            self.dense = nn.Linear(h, h, device=device)
            self.norm = nn.LayerNorm(h, device=device)
            self.proj = nn.Linear(h, V, bias=True, device=device)
        else:
            self.norm = RMSNorm(h, device=device) if arch.family == "llama" else nn.LayerNorm(h, device=device)
            self.proj = nn.Linear(h, V, bias=False, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mlm:
            return self.proj(self.norm(F.gelu(self.dense(x))))
        return self.proj(self.norm(x))


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy summed over target positions, divided by the number of *tokens*.

    Dividing by tokens (not by valid targets) makes the loss a plain mean over samples, so
    any split of a batch into micro-batches and replicas averages back to the same value and
    gradient. For causal models every position is a target and this is the usual mean.
    """
    total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                            ignore_index=IGNORE_INDEX, reduction="sum")
    return total / targets.numel()


# ---- construction ------------------------------------------------------------------------------------


def _init_layer(module: nn.Module, arch: Architecture, seed: int, index: int) -> None:
    """Deterministic init from the layer's own generator (GPT-2 style, scaled residual outputs)."""
    g = torch.Generator(device="cpu").manual_seed(layer_seed(seed, index))
    resid_std = _STD / math.sqrt(2 * arch.n_layers)
    with torch.no_grad():
        for name, p in module.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if p.dim() == 1:
                # Norm scales start at one, every bias at zero.
                fill = 1.0 if leaf == "weight" else 0.0
                p.fill_(fill)
                continue
            # Outputs that add into the residual stream are scaled down with depth (GPT-2).
            std = resid_std if name in _RESIDUAL_OUTPUTS else _STD
            # Draw on the CPU so the values do not depend on the device's random stream.
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32).mul_(std).to(p.dtype))


def build_layer(arch: Architecture, index: int, num_layers: int, *, seed: int = 0,
                device: torch.device | str | None = None, init: bool = True) -> nn.Module:
    """Layer `index` of a model with `num_layers` layers (embedding, blocks, head).

    With ``device="meta"`` (and ``init=False``) nothing is allocated: useful to count the
    parameters of models too large for the machine.
    """
    if num_layers != arch.n_layers + 2:
        raise WorkloadError(f"architecture has {arch.n_layers} blocks, so {arch.n_layers + 2} layers, "
                            f"but the workload lists {num_layers}")
    if not 0 <= index < num_layers:
        raise WorkloadError(f"layer {index} is outside the model's {num_layers} layers")
    if index == 0:
        layer: nn.Module = Embedding(arch, device)
    elif index == num_layers - 1:
        layer = Head(arch, device)
    else:
        layer = Block(arch, device)
    if init and str(device) != "meta":
        _init_layer(layer, arch, seed, index)
    return layer


class StageModule(nn.Module):
    """Layers ``[start, end)`` applied in order; parameters are named ``layers.{i}.*`` by global index."""

    def __init__(self, layers: dict[int, nn.Module], *, autocast: torch.dtype | None = None, final: bool = False):
        super().__init__()
        self.indices = sorted(layers)
        self.layers = nn.ModuleDict({str(i): layers[i] for i in self.indices})
        self.autocast = autocast
        """Mixed precision's compute dtype (module docstring); None: fp32 throughout."""
        self.final = final
        """Whether the stage ends with the model's last layer (its output is the logits)."""

    @property
    def start(self) -> int:
        return self.indices[0]

    @property
    def end(self) -> int:
        return self.indices[-1] + 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.autocast is None:
            if x.is_floating_point() and x.dtype != torch.float32:  # from a mixed-precision stage
                x = x.float()
            for i in self.indices:
                x = self.layers[str(i)](x)
            return x
        if x.is_floating_point():  # a previous stage's half-precision activations (token ids stay integers)
            x = x.float()
        with torch.autocast(x.device.type, dtype=self.autocast):
            for i in self.indices:
                x = self.layers[str(i)](x)
        return x.float() if self.final else x.to(self.autocast)

    def layer_parameters(self) -> dict[int, list[tuple[str, nn.Parameter]]]:
        """Per layer index, its (plan-independent key, parameter) pairs in a fixed order."""
        return {i: [(param_key(i, n), p) for n, p in self.layers[str(i)].named_parameters()]
                for i in self.indices}


def build_stage_module(workload: Workload, start: int, end: int, *, seed: int = 0,
                       device: torch.device | str | None = None, precision: str = "fp32") -> StageModule:
    """The layers ``[start, end)`` of the workload's model, initialised from `seed`, trained
    in `precision` (`TRAIN_PRECISIONS`)."""
    arch = require_arch(workload)
    if not 0 <= start < end <= workload.num_layers:
        raise WorkloadError(f"layer range [{start}, {end}) is not inside the model's {workload.num_layers} layers")
    if precision not in TRAIN_PRECISIONS:
        *most, last = TRAIN_PRECISIONS
        raise WorkloadError(f"the runtime trains in {', '.join(most)} or {last}, not {precision!r}")
    return StageModule({i: build_layer(arch, i, workload.num_layers, seed=seed, device=device)
                        for i in range(start, end)},
                       autocast=TRAIN_PRECISIONS[precision], final=end == workload.num_layers)
