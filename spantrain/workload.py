"""The workload: a model as a list of layers, plus global batch, sequence length, precision.

Layers are what a plan's half-open layer ranges index: embedding first, one entry per
transformer block, head last. Every per-layer figure is *per sample* (one sequence of
`seq_len` tokens), so the cost model scales it by the micro-batch size.

Formulas (s = sequence length, h = hidden size, f = FFN hidden size, a = attention
heads, V = vocabulary, p = bytes per activation element: 2 for fp16/bf16, 4 for fp32).
A matmul of an (s x m) input by an (m x n) weight costs 2smn FLOPs forward; its
backward costs the same again for the input gradient (B) and again for the weight
gradient (W). Attention scores QK^T and the weighted sum AV have no weights: 2s^2h
FLOPs each forward, twice that in B, nothing in W.

- Block, GPT-2/BERT (LayerNorm, biases, GELU MLP):
  params = 4h^2 + 4h (QKV + output projection) + 2hf + f + h (MLP) + 4h (two LayerNorms)
  forward = 2s(4h^2 + 2hf) + 4s^2h; B = 2s(4h^2 + 2hf) + 8s^2h; W = 2s(4h^2 + 2hf)
- Block, Llama (RMSNorm, no biases, SwiGLU MLP with three h x f matrices):
  params = 4h^2 + 3hf + 2h; forward = 2s(4h^2 + 3hf) + 4s^2h (B and W as above)
- Embedding: token table Vh (+ learned positions s_max*h for GPT-2/BERT, + 2h token
  types and a 2h LayerNorm for BERT); forward is a lookup, counted as s*h adds; no W
  FLOPs beyond the scatter (counted as s*h).
- Head: final norm (2h, or h for RMSNorm) and an untied V x h projection (forward 2shV);
  BERT's MLM head adds an h x h transform with LayerNorm and an output bias V.
  The runtime trains the projection untied: in a pipeline the head lives on another
  device than the embedding. Published parameter totals count a tied projection once:
  `Workload.unique_params` does the same, so it matches them (GPT-2 small 124M, XL
  1.56B, BERT-large 335M); Llama-2 is untied (6.74B).
- Boundary bytes (the activation a stage sends on; the same size flows back as its
  gradient): s*h*p for the embedding and every block; 0 for the head (the loss stays).
- Activation memory kept for backward (Korthikanti et al. 2022, "Reducing Activation
  Recomputation", no recomputation, no sequence parallelism), scaled by p/2 from their
  16-bit figures: attention 11sh (+ 5as^2 for the score matrices unless the attention is
  memory-efficient / flash, which keeps O(s) statistics instead), MLP 3sh + 4sf for GELU
  (19sh at f = 4h) or 2sh + 8sf for SwiGLU, LayerNorms 4sh. Embedding: its output and
  dropout mask, 3sh (scaled). Head: its input s*h*p plus fp32 logits 4sV for the loss.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from spantrain._spec import (
    check_keys,
    got,
    nonempty_str,
    nonneg_number,
    other_kind,
    positive_int,
    read_structured,
    shown,
)
from spantrain.errors import WorkloadError, join_problems

__all__ = ["Layer", "Architecture", "Workload", "PRESETS", "PRECISIONS", "MAX_GLOBAL_BATCH", "MAX_LAYERS",
           "MAX_SIZE", "load_workload"]

MAX_LAYERS = 4096
"""Most layers a workload may have: published models have up to a few hundred, and every
planner's partition and the cost model grow with the count (10**9 would not fit memory)."""
MAX_GLOBAL_BATCH = 2**16
"""Largest global batch: 65,536 samples per iteration, beyond the largest batches trained in
practice (large-batch BERT and ImageNet runs); planning time and memory grow with the batch
(2**20 samples take ~30 s and 1.5 GB to plan on 8 devices, and 10**9 exhausts memory)."""

MAX_SIZE = 2**24
"""Largest vocab_size, d_model, n_heads, d_ff, max_seq_len and seq_len: 16,777,216, far beyond
any real model (Llama-2-70B: d_model 8192, d_ff 28672; vocabularies of 256k; contexts of 1M
tokens), and small enough that every figure derived from them stays a float (a d_model of
4 * 10**200 was an OverflowError, 10**300 made 300-digit memory figures)."""

PRECISIONS = {"fp32": 4, "fp16": 2, "bf16": 2}
"""Bytes per activation element for each training precision."""

Family = Literal["gpt2", "llama", "bert"]


@dataclass(frozen=True, kw_only=True)
class Layer:
    """One layer of the model; every figure is per sample (one sequence)."""

    name: str
    """Readable name, e.g. ``block-3``."""
    kind: str
    """``embedding``, ``block``, ``head`` or a free label for custom layers."""
    forward_flops: float
    """Forward FLOPs per sample."""
    input_grad_flops: float
    """Backward FLOPs for the input gradient (the zero-bubble "B") per sample."""
    weight_grad_flops: float
    """Backward FLOPs for the weight gradient (the zero-bubble "W") per sample."""
    params: int
    """Number of parameters."""
    boundary_bytes: float
    """Bytes of this layer's output per sample: sent to the next stage if a stage ends here."""
    activation_bytes: float
    """Bytes of activations kept for backward per sample (in flight per micro-batch)."""

    def __post_init__(self) -> None:
        # as a workload file's layers are checked: built in code, nan FLOPs or -5 params were planned
        where = f"layer {shown(self.name)}"
        problems: list[str] = []
        if not isinstance(self.name, str) or not self.name.strip():
            problems.append(f"layer name must be a non-empty string, {got(self.name)}")
        if not isinstance(self.kind, str) or not self.kind.strip():
            problems.append(f"{where}: kind must be a non-empty string, {got(self.kind)}")
        figures = ("forward_flops", "input_grad_flops", "weight_grad_flops", "params", "boundary_bytes",
                   "activation_bytes")
        fields = {key: getattr(self, key) for key in figures}  # not asdict: a copy per layer made
        for key in figures:
            value = nonneg_number(fields, key, where, problems)
            if key == "params" and value is not None and not value.is_integer():
                problems.append(f"{where}: params must be a whole number of parameters, {got(self.params)}")
        if problems:
            raise WorkloadError(join_problems(problems))


@dataclass(frozen=True, kw_only=True)
class Architecture:
    """The shape of a transformer model, enough for the runtime to build it."""

    family: Family
    """``gpt2`` (LayerNorm, GELU, learned positions), ``llama`` (RMSNorm, SwiGLU, RoPE)
    or ``bert`` (bidirectional encoder with MLM head)."""
    vocab_size: int
    """Vocabulary size V."""
    d_model: int
    """Hidden size h."""
    n_layers: int
    """Number of transformer blocks."""
    n_heads: int
    """Attention heads a."""
    d_ff: int
    """FFN hidden size f."""
    max_seq_len: int
    """Longest sequence (size of the learned position table where there is one)."""
    flash_attention: bool = True
    """Memory-efficient attention: no s^2 score matrices kept for backward."""

    def __post_init__(self) -> None:
        problems = _arch_problems(dataclasses.asdict(self))
        if problems:
            raise WorkloadError(join_problems(problems))


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What to train: layers, batch and precision."""

    name: str
    """Preset or file name."""
    layers: tuple[Layer, ...]
    """Embedding first, head last; plan layer ranges index this tuple."""
    global_batch: int
    """Samples per iteration that planners aim at."""
    seq_len: int
    """Tokens per sample."""
    precision: str = "bf16"
    """``fp32``, ``fp16`` or ``bf16`` (the last two: mixed precision with fp32 master weights)."""
    arch: Architecture | None = None
    """The architecture when the model is a known family; the runtime needs it."""
    tied_embeddings: bool = False
    """Whether the published model ties the head to the embedding (counted once in `unique_params`)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():  # name=5 was taken, and planned as a model
            raise WorkloadError(f"workload name must be a non-empty string, {got(self.name)}")
        if not isinstance(self.layers, tuple | list) or not all(isinstance(x, Layer) for x in self.layers):
            raise WorkloadError(f"workload {shown(self.name)}: layers must be a tuple of Layer, {got(self.layers)}")
        if not self.layers:
            raise WorkloadError(f"workload {shown(self.name)}: needs at least one layer")
        if self.train_flops < 1.0:  # every plan would take (about) 0 s: planners divide by a stage's time
            what = ("every layer has 0 FLOPs" if self.train_flops == 0 else
                    f"its layers have {self.train_flops:.3g} FLOPs in all, under one")
            raise WorkloadError(f"workload {shown(self.name)}: {what}, so there is no work to plan "
                                "(give the layers their forward_flops)")
        if isinstance(self.global_batch, bool) or not isinstance(self.global_batch, int) or self.global_batch <= 0:
            raise WorkloadError(f"workload {shown(self.name)}: global_batch must be a positive integer, "
                                f"got {shown(self.global_batch)}")
        if self.global_batch > MAX_GLOBAL_BATCH:
            raise WorkloadError(f"workload {shown(self.name)}: global_batch must be at most {MAX_GLOBAL_BATCH} "
                                f"samples, got {shown(self.global_batch)}")
        if isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int) or self.seq_len <= 0:
            raise WorkloadError(f"workload {shown(self.name)}: seq_len must be a positive integer, "
                                f"got {shown(self.seq_len)}")
        if self.seq_len > MAX_SIZE:
            raise WorkloadError(f"workload {shown(self.name)}: seq_len must be at most {MAX_SIZE} tokens, "
                                f"got {shown(self.seq_len)}")
        if not isinstance(self.precision, str) or self.precision not in PRECISIONS:
            raise WorkloadError(f"workload {shown(self.name)}: precision must be one of "
                                f"{', '.join(PRECISIONS)}, got {shown(self.precision)}")

    # ---- views ------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def bytes_per_element(self) -> int:
        return PRECISIONS[self.precision]

    @property
    def total_params(self) -> int:
        """Parameters as trained (head projection untied)."""
        return sum(layer.params for layer in self.layers)

    @property
    def unique_params(self) -> int:
        """Parameters counting a tied head projection once, as published totals do."""
        total = self.total_params
        if self.tied_embeddings and self.arch is not None:
            total -= self.arch.vocab_size * self.arch.d_model
        return total

    @property
    def forward_flops(self) -> float:
        """Forward FLOPs per sample over all layers."""
        return sum(layer.forward_flops for layer in self.layers)

    @property
    def train_flops(self) -> float:
        """Forward + backward FLOPs per sample."""
        return sum(x.forward_flops + x.input_grad_flops + x.weight_grad_flops for x in self.layers)

    def with_global_batch(self, global_batch: int) -> Workload:
        return dataclasses.replace(self, global_batch=global_batch)

    # ---- constructors ------------------------------------------------------------------

    @classmethod
    def from_arch(cls, arch: Architecture, *, name: str, global_batch: int, seq_len: int,
                  precision: str = "bf16", tied_embeddings: bool = False) -> Workload:
        if not isinstance(arch, Architecture):  # a dict was an AttributeError
            raise WorkloadError(f"workload {shown(name)}: arch must be an Architecture, {got(arch)}")
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len <= 0:
            raise WorkloadError(f"workload {shown(name)}: seq_len must be a positive integer, got {shown(seq_len)}")
        if seq_len > arch.max_seq_len:
            raise WorkloadError(f"workload {shown(name)}: seq_len {seq_len} exceeds the architecture's "
                                f"max_seq_len {arch.max_seq_len}")
        if not isinstance(precision, str) or precision not in PRECISIONS:  # a list was a TypeError (unhashable)
            raise WorkloadError(f"workload {shown(name)}: precision must be one of {', '.join(PRECISIONS)}, "
                                f"{got(precision)}")
        layers = _transformer_layers(arch, seq_len, PRECISIONS[precision])
        return cls(name=name, layers=tuple(layers), global_batch=global_batch, seq_len=seq_len,
                   precision=precision, arch=arch, tied_embeddings=tied_embeddings)

    @classmethod
    def from_preset(cls, name: str, *, global_batch: int | None = None, seq_len: int | None = None) -> Workload:
        if name not in PRESETS:
            raise WorkloadError(f"unknown model {shown(name)}: use a preset ({', '.join(PRESETS)}) "
                                "or a workload YAML file")
        p = PRESETS[name]
        return cls.from_arch(p["arch"], name=name,
                             global_batch=p["global_batch"] if global_batch is None else global_batch,
                             seq_len=p["seq_len"] if seq_len is None else seq_len, precision=p["precision"],
                             tied_embeddings=p["tied"])

    @classmethod
    def from_file(cls, path: str | Path) -> Workload:
        return _parse_workload(read_structured(path, WorkloadError), str(path))

    @classmethod
    def from_spec(cls, spec: Any, source: str = "workload") -> Workload:
        return _parse_workload(spec, source)


def load_workload(model: str | os.PathLike, *, global_batch: int | None = None) -> Workload:
    """A preset by name, or a workload YAML/JSON file by path (what ``--model`` accepts)."""
    if isinstance(model, os.PathLike):  # a Path was an AttributeError (no .strip)
        model = os.fspath(model)
    if not isinstance(model, str):
        raise WorkloadError(f"model must be a preset name or a workload file's path, {got(model)}")
    if model in PRESETS:
        return Workload.from_preset(model, global_batch=global_batch)
    if not model.strip():  # Path("") is the current directory: "is a directory" named nothing the user gave
        raise WorkloadError(f"the model name is empty: use a preset ({', '.join(PRESETS)}) or a workload YAML file")
    path = Path(model)
    if path.suffix.lower() in (".yaml", ".yml", ".json") or path.exists():
        if global_batch is None:
            return Workload.from_file(path)
        spec = read_structured(path, WorkloadError)
        if isinstance(spec, dict) and "global_batch" not in spec:  # --global-batch gives it: not a missing key
            spec = {**spec, "global_batch": global_batch}
        return _parse_workload(spec, str(path)).with_global_batch(global_batch)
    raise WorkloadError(f"unknown model {shown(model)}: use a preset ({', '.join(PRESETS)}) or a workload YAML file")


# ---- formulas ------------------------------------------------------------------------------

def _transformer_layers(arch: Architecture, s: int, p: int) -> list[Layer]:
    h, f, a, V = arch.d_model, arch.d_ff, arch.n_heads, arch.vocab_size
    scale = p / 2  # Korthikanti's figures are for 16-bit activations
    layers: list[Layer] = []

    if arch.family == "gpt2":
        emb_params = V * h + arch.max_seq_len * h
    elif arch.family == "bert":
        emb_params = V * h + arch.max_seq_len * h + 2 * h + 2 * h
    else:
        emb_params = V * h
    layers.append(Layer(name="embedding", kind="embedding", forward_flops=s * h, input_grad_flops=0.0,
                        weight_grad_flops=s * h, params=emb_params, boundary_bytes=s * h * p,
                        activation_bytes=3 * s * h * scale))

    if arch.family == "llama":
        mm = 4 * h * h + 3 * h * f
        block_params = mm + 2 * h
        mlp_act = 2 * s * h + 8 * s * f
    else:
        mm = 4 * h * h + 2 * h * f
        block_params = mm + 4 * h + f + h + 4 * h
        mlp_act = 3 * s * h + 4 * s * f
    attn_flops = 4 * s * s * h
    attn_act = 11 * s * h + (0 if arch.flash_attention else 5 * a * s * s)
    block_act = (attn_act + mlp_act + 4 * s * h) * scale
    for i in range(arch.n_layers):
        layers.append(Layer(name=f"block-{i}", kind="block", forward_flops=2 * s * mm + attn_flops,
                            input_grad_flops=2 * s * mm + 2 * attn_flops, weight_grad_flops=2 * s * mm,
                            params=block_params, boundary_bytes=s * h * p, activation_bytes=block_act))

    head_mm = h * V
    if arch.family == "bert":
        head_mm += h * h
        head_params = h * V + h * h + h + 2 * h + V
    elif arch.family == "llama":
        head_params = h * V + h
    else:
        head_params = h * V + 2 * h
    layers.append(Layer(name="head", kind="head", forward_flops=2 * s * head_mm, input_grad_flops=2 * s * head_mm,
                        weight_grad_flops=2 * s * head_mm, params=head_params, boundary_bytes=0.0,
                        activation_bytes=s * h * p + 4 * s * V))
    return layers


_ARCH_SIZES = ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len")


def _arch_problems(values: dict[str, Any]) -> list[str]:
    """Every problem of the architecture fields in `values` (those absent are not checked)."""
    problems = []
    if "family" in values and values["family"] not in ("gpt2", "llama", "bert"):
        problems.append(f"architecture.family: unknown family {shown(values['family'])} (gpt2, llama or bert)")
    ok = {}  # the sizes that are valid, for the checks between them
    for f in _ARCH_SIZES:
        if f not in values:
            continue
        v = values[f]
        limit = MAX_LAYERS - 2 if f == "n_layers" else MAX_SIZE  # n_layers: plus the embedding and the head
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            problems.append(f"architecture.{f} must be a positive integer, {got(v, whole=True)}")
        elif v > limit:
            problems.append(f"architecture.{f} must be at most {limit}, got {shown(v)}")
        else:
            ok[f] = v
    flash = values.get("flash_attention", True)
    if not isinstance(flash, bool):  # a quoted "no" would read as true
        problems.append(f"architecture.flash_attention must be true or false, {got(flash)}")
    if "d_model" in ok and "n_heads" in ok and ok["d_model"] % ok["n_heads"]:
        problems.append(f"architecture.d_model ({ok['d_model']}) must be divisible by n_heads ({ok['n_heads']})")
    return problems


def _arch(family: Family, V: int, h: int, L: int, a: int, f: int, smax: int) -> Architecture:
    return Architecture(family=family, vocab_size=V, d_model=h, n_layers=L, n_heads=a, d_ff=f, max_seq_len=smax)


PRESETS: dict[str, dict[str, Any]] = {
    # Byte-level, small enough that a step of the whole batch takes well under a second on a CPU.
    "tiny-gpt": {"arch": _arch("gpt2", 256, 128, 6, 4, 512, 128), "seq_len": 64, "global_batch": 32,
                 "precision": "fp32", "tied": False},
    "gpt2-small": {"arch": _arch("gpt2", 50257, 768, 12, 12, 3072, 1024), "seq_len": 1024, "global_batch": 64,
                   "precision": "bf16", "tied": True},
    "gpt2-medium": {"arch": _arch("gpt2", 50257, 1024, 24, 16, 4096, 1024), "seq_len": 1024,
                    "global_batch": 64, "precision": "bf16", "tied": True},
    "gpt2-large": {"arch": _arch("gpt2", 50257, 1280, 36, 20, 5120, 1024), "seq_len": 1024, "global_batch": 64,
                   "precision": "bf16", "tied": True},
    "gpt2-xl": {"arch": _arch("gpt2", 50257, 1600, 48, 25, 6400, 1024), "seq_len": 1024, "global_batch": 64,
                "precision": "bf16", "tied": True},
    "bert-large": {"arch": _arch("bert", 30522, 1024, 24, 16, 4096, 512), "seq_len": 512, "global_batch": 128,
                   "precision": "bf16", "tied": True},
    "llama2-7b": {"arch": _arch("llama", 32000, 4096, 32, 32, 11008, 4096), "seq_len": 4096, "global_batch": 32,
                  "precision": "bf16", "tied": False},
}
"""Named models: architecture and the defaults `--model NAME` uses."""


# ---- YAML form -------------------------------------------------------------------------------

_LAYER_KEYS = {"name", "kind", "count", "forward_flops", "input_grad_flops", "weight_grad_flops", "params",
               "boundary_bytes", "activation_bytes"}


def _parse_workload(spec: Any, source: str) -> Workload:
    """Parse the YAML form: either `architecture:` (layers derived) or an explicit `layers:` list."""
    if not isinstance(spec, dict):
        raise WorkloadError(f"{source}: expected a mapping with name, global_batch, seq_len and "
                            "architecture or layers")
    if wrong := other_kind(spec, "workload file"):
        raise WorkloadError(f"{source}: {wrong}")
    problems: list[str] = []
    check_keys(spec, {"name", "global_batch", "seq_len", "precision", "architecture", "layers", "tied_embeddings"},
               {"seq_len"}, source, problems)
    if "global_batch" not in spec:
        problems.append(f"{source}: missing required key 'global_batch' (give it, or pass --global-batch)")
    # wrong types here failed later as tracebacks (a list as name is no key for measured
    # layer_times, as precision no key of PRECISIONS) or were misread ("no" as true)
    name = spec.get("name", Path(source).stem)
    if not isinstance(name, str) or not name.strip():
        problems.append(f"{source}: name must be a non-empty string, {got(name)}")
    elif not name.replace(" ", "").isprintable():  # shown in headers and tables: a newline or escape broke them
        problems.append(f"{source}: name must be one line of printable text (no newline, tab or control "
                        f"character), got {shown(name)}")
    tied = spec.get("tied_embeddings", False)
    if not isinstance(tied, bool):
        problems.append(f"{source}: tied_embeddings must be true or false, {got(tied)}")
    gb = positive_int(spec, "global_batch", source, problems)
    if gb is not None and gb > MAX_GLOBAL_BATCH:
        problems.append(f"{source}: global_batch must be at most {MAX_GLOBAL_BATCH} samples, got {shown(gb)}")
    s = positive_int(spec, "seq_len", source, problems)
    if s is not None and s > MAX_SIZE:
        problems.append(f"{source}: seq_len must be at most {MAX_SIZE} tokens, got {shown(s)}")
        s = None
    precision = spec.get("precision", "bf16")
    if not isinstance(precision, str) or precision not in PRECISIONS:
        problems.append(f"{source}: precision must be one of {', '.join(PRECISIONS)}, got {shown(precision)}")
    if ("architecture" in spec) == ("layers" in spec):
        problems.append(f"{source}: give exactly one of 'architecture' or 'layers'")
        raise WorkloadError(join_problems(problems))
    # the section's problems join the ones above: one run names them all
    if "architecture" in spec:
        raw = spec["architecture"]
        if not isinstance(raw, dict):
            problems.append(f"{source}: architecture must be a mapping")
            raise WorkloadError(join_problems(problems))
        fields = dataclasses.fields(Architecture)
        check_keys(raw, {f.name for f in fields}, {f.name for f in fields if f.default is dataclasses.MISSING},
                   f"{source}: architecture", problems)
        problems.extend(f"{source}: {p}" for p in _arch_problems(raw))
        smax = raw.get("max_seq_len")
        if s is not None and _is_size(smax) and s > smax:  # named by its file, as the other problems are
            problems.append(f"{source}: seq_len {s} exceeds the architecture's max_seq_len {smax}: "
                            "lower seq_len or raise max_seq_len")
        if problems:
            raise WorkloadError(join_problems(problems))
        arch = Architecture(**raw)
        return _not_a_preset(Workload.from_arch(arch, name=name, global_batch=gb, seq_len=s, precision=precision,
                                                tied_embeddings=tied), source, "name" in spec)
    if "tied_embeddings" in spec:  # it was accepted and ignored
        problems.append(f"{source}: tied_embeddings applies to the architecture form (the head's weights counted "
                        "once); with a layers list, give each layer's own params and leave it out")
    layers = list(_parse_layers(spec["layers"], source, problems))
    if problems:
        raise WorkloadError(join_problems(problems))
    try:
        workload = Workload(name=name, layers=tuple(layers), global_batch=gb, seq_len=s, precision=precision)
    except WorkloadError as e:  # layers of no work: named by the file, as its other problems are (not by name)
        raise WorkloadError(f"{source}: {str(e).removeprefix(f'workload {shown(name)}: ')}") from None
    return _not_a_preset(workload, source, "name" in spec)


def _not_a_preset(workload: Workload, source: str, named: bool) -> Workload:
    """`workload`, refused when it takes a preset's name with other layers: plans, checkpoints and
    a cluster's measured layer_times are matched by the model's name, so the preset's were used for
    it without a word (its own batch is fine: a plan of another batch is refused by that)."""
    if workload.name in PRESETS and workload.layers != Workload.from_preset(workload.name).layers:
        whose = "name" if named else "name (the file's, as it gives no name:)"
        raise WorkloadError(f"{source}: {whose} {workload.name!r} is a preset's, and this model's layers are not "
                            f"{workload.name}'s: give it its own name (plans and measured layer_times are matched "
                            "by name)")
    return workload


def _is_size(value: Any) -> bool:
    """Whether `value` is an architecture size within its limit (see `_arch_problems`)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_SIZE


def _parse_layers(raw: Any, source: str, problems: list[str]) -> Iterable[Layer]:
    if not isinstance(raw, list) or not raw:
        problems.append(f"{source}: layers must be a non-empty list")
        return
    total = 0  # layers after count expansion so far: a file of aliases repeats one entry of 4,096 thousands of times
    for k, entry in enumerate(raw):
        where = f"{source}: layers[{k}]"
        if not isinstance(entry, dict):
            problems.append(f"{where}: expected a mapping")
            continue
        check_keys(entry, _LAYER_KEYS, {"name", "forward_flops", "params", "boundary_bytes", "activation_bytes"},
                   where, problems)
        name = nonempty_str(entry, "name", where, problems)
        fwd = nonneg_number(entry, "forward_flops", where, problems)
        vals = {key: nonneg_number(entry, key, where, problems)
                for key in ("params", "boundary_bytes", "activation_bytes")}
        if vals["params"] is not None and not float(vals["params"]).is_integer():  # was cut to an int unsaid
            problems.append(f"{where}: params must be a whole number of parameters, {got(vals['params'])}")
            vals["params"] = None
        b = nonneg_number(entry, "input_grad_flops", where, problems) if "input_grad_flops" in entry else fwd
        w = nonneg_number(entry, "weight_grad_flops", where, problems) if "weight_grad_flops" in entry else fwd
        count = positive_int(entry, "count", where, problems) if "count" in entry else 1
        if count is not None and count > MAX_LAYERS:
            problems.append(f"{where}: count must be at most {MAX_LAYERS} (the most layers a workload may have), "
                            f"got {shown(count)}")
            count = None
        total += count or 0
        if total > MAX_LAYERS:  # stop there: expanding the rest only costs memory (gigabytes) and time
            problems.append(f"{source}: {total} layers by layers[{k}] after count expansion, at most {MAX_LAYERS} "
                            "are supported (lower the counts)")
            return
        # a free label, but text: str() of a list of nested aliases took gigabytes
        kind = entry.get("kind", "custom")
        if not isinstance(kind, str) or not kind.strip():
            problems.append(f"{where}: kind must be a non-empty string, {got(kind)}")
            continue
        if None in (name, fwd, b, w, count) or None in vals.values():
            continue
        names = [name] if "count" not in entry else [f"{name}-{i}" for i in range(count)]
        for n in names:
            yield Layer(name=n, kind=kind, forward_flops=fwd, input_grad_flops=b,
                        weight_grad_flops=w, params=int(vals["params"]), boundary_bytes=vals["boundary_bytes"],
                        activation_bytes=vals["activation_bytes"])
