from __future__ import annotations

import re

import pytest

from spantrain.errors import WorkloadError
from spantrain.workload import PRESETS, Workload, load_workload


@pytest.mark.parametrize("name, expected", [
    ("gpt2-small", 124e6), ("gpt2-medium", 355e6), ("gpt2-large", 774e6), ("gpt2-xl", 1.558e9),
    ("bert-large", 335e6), ("llama2-7b", 6.738e9),
])
def test_parameter_totals_match_published_models(name, expected):
    w = Workload.from_preset(name)
    assert w.unique_params == pytest.approx(expected, rel=0.01)


def test_layer_structure_is_embedding_blocks_head():
    for name, preset in PRESETS.items():
        w = Workload.from_preset(name)
        assert len(w.layers) == preset["arch"].n_layers + 2
        assert w.layers[0].kind == "embedding" and w.layers[-1].kind == "head"
        assert all(layer.kind == "block" for layer in w.layers[1:-1])
        assert w.layers[-1].boundary_bytes == 0


def test_block_flops_follow_the_documented_formula():
    w = Workload.from_preset("gpt2-small")
    s, h = 1024, 768
    block = w.layers[1]
    assert block.forward_flops == 24 * s * h * h + 4 * s * s * h
    assert block.weight_grad_flops == 24 * s * h * h
    assert block.input_grad_flops == 24 * s * h * h + 8 * s * s * h
    # training FLOPs ~ 6 x params x tokens (plus attention), the usual rule of thumb
    approx = 6 * w.total_params * s
    assert w.train_flops == pytest.approx(approx, rel=0.15)


def test_activation_memory_matches_korthikanti_for_gpt():
    w = Workload.from_preset("gpt2-medium")
    s, h = 1024, 1024
    assert w.layers[1].activation_bytes == 34 * s * h  # flash attention: no 5as^2 term
    assert w.layers[1].boundary_bytes == s * h * 2


def test_global_batch_override_and_unknown_model():
    assert load_workload("gpt2-small", global_batch=8).global_batch == 8
    with pytest.raises(WorkloadError, match="unknown model 'gpt5'"):
        load_workload("gpt5")
    for empty in ("", "  "):  # was ".: is a directory, expected a file"
        with pytest.raises(WorkloadError, match=r"^the model name is empty: use a preset"):
            load_workload(empty)


def test_yaml_forms(tmp_path):
    arch = tmp_path / "a.yaml"
    arch.write_text("name: mine\nglobal_batch: 8\nseq_len: 128\narchitecture: {family: llama, vocab_size: 1000, "
                    "d_model: 64, n_layers: 3, n_heads: 4, d_ff: 128, max_seq_len: 256}\n")
    w = load_workload(str(arch))
    assert w.name == "mine" and len(w.layers) == 5 and w.arch.family == "llama"
    explicit = tmp_path / "l.yaml"
    explicit.write_text("global_batch: 4\nseq_len: 16\nlayers:\n"
                        "  - {name: in, forward_flops: 10, params: 5, boundary_bytes: 8, activation_bytes: 8}\n"
                        "  - {name: blk, count: 3, forward_flops: 100, params: 50, boundary_bytes: 8, "
                        "activation_bytes: 16}\n")
    w = load_workload(str(explicit))
    assert [x.name for x in w.layers] == ["in", "blk-0", "blk-1", "blk-2"]
    assert w.layers[1].input_grad_flops == 100 and w.arch is None


@pytest.mark.parametrize("text, message", [
    ("global_batch: 0\nseq_len: 8\nlayers: []\n", "global_batch must be a positive integer"),
    ("global_batch: 2\nseq_len: 8\n", "exactly one of 'architecture' or 'layers'"),
    ("global_batch: 2\nseq_len: 8\nlayers: [{name: a, forward_flops: -1, params: 1, boundary_bytes: 1, "
     "activation_bytes: 1}]\n", "forward_flops must be a number >= 0"),
    ("global_batch: 2\nseq_len: 8\narchitecture: {family: rnn, vocab_size: 1, d_model: 4, n_layers: 1, "
     "n_heads: 1, d_ff: 4, max_seq_len: 8}\n", "unknown family 'rnn'"),
    ("global_batch: 2\nseq_len: 8\nprecision: fp8\nlayers: []\n", "precision must be one of"),
    ("global_batch: 2\nseq_len: 8\narchitecture: {family: gpt2, vocab_size: 1, d_model: 4, n_layers: 1, d_ff: 4}\n",
     "w.yaml: architecture: missing required key 'n_heads'"),
    ("global_batch: 2\nseq_len: 8\nlayers: [{name: a, forward_flops: 1.0e9, params: 1, boundary_bytes: 1, "
     "activation_bytes: 1}]\n", "forward_flops must be a number >= 0, got the string '1.0e9' (YAML reads 1.0e9 as "
     "text; write 1.0e+9)"),
    ("global_batch: 2\nseq_len: 8\narchitecture: {family: gpt2, vocab_size: 1, d_model: 4, n_layers: 1, "
     "n_heads: '2', d_ff: 4, max_seq_len: 8}\n",
     "w.yaml: architecture.n_heads must be a positive integer, got the string '2' (write the number without quotes)"),
    ("global_batch: 2\nseq_len: 8\nlayers: [{name: a, forward_flops: 1.0e+300, params: 1, boundary_bytes: 1, "
     "activation_bytes: 1}]\n", "forward_flops must be at most 1e+30, got 1e+300"),
    # a billion layers would be expanded one by one: refused at once
    ("global_batch: 2\nseq_len: 8\nlayers: [{name: a, count: 1000000000, forward_flops: 1, params: 1, "
     "boundary_bytes: 1, activation_bytes: 1}]\n", "layers[0]: count must be at most 4096"),
    ("global_batch: 2\nseq_len: 8\nlayers: [{name: a, count: 4000, forward_flops: 1, params: 1, boundary_bytes: 1, "
     "activation_bytes: 1}, {name: b, count: 4000, forward_flops: 1, params: 1, boundary_bytes: 1, "
     "activation_bytes: 1}]\n", "8000 layers, at most 4096 are supported"),
    ("global_batch: 2\nseq_len: 8\narchitecture: {family: gpt2, vocab_size: 1, d_model: 4, n_layers: 1000000000, "
     "n_heads: 2, d_ff: 4, max_seq_len: 8}\n", "architecture.n_layers must be at most 4094"),
    # wrong types at the top: tracebacks (name, precision) or misread as true (the flags)
    ("name: [1, 2]\nglobal_batch: 2\nseq_len: 8\nlayers: [{name: a, forward_flops: 1, params: 1, boundary_bytes: 1, "
     "activation_bytes: 1}]\n", "w.yaml: name must be a non-empty string, got [1, 2]"),
    ("precision: [1]\nglobal_batch: 2\nseq_len: 8\nlayers: [{name: a, forward_flops: 1, params: 1, "
     "boundary_bytes: 1, activation_bytes: 1}]\n", "w.yaml: precision must be one of fp32, fp16, bf16, got [1]"),
    ("tied_embeddings: maybe\nglobal_batch: 2\nseq_len: 8\nlayers: [{name: a, forward_flops: 1, params: 1, "
     "boundary_bytes: 1, activation_bytes: 1}]\n", "w.yaml: tied_embeddings must be true or false, got 'maybe'"),
    ("global_batch: 2\nseq_len: 8\narchitecture: {family: gpt2, vocab_size: 1, d_model: 4, n_layers: 1, "
     "n_heads: 2, d_ff: 4, max_seq_len: 8, flash_attention: 'no'}\n",
     "w.yaml: architecture.flash_attention must be true or false, got 'no'"),
    # named by the file, as every other problem of the file is (it was named by the workload's name)
    ("global_batch: 2\nseq_len: 16\narchitecture: {family: gpt2, vocab_size: 1, d_model: 4, n_layers: 1, "
     "n_heads: 2, d_ff: 4, max_seq_len: 8}\n", "w.yaml: seq_len 16 exceeds the architecture's max_seq_len 8: lower"),
    # no compute at all: exhaustive search divided by the 0 s a stage takes (compare's traceback)
    ("global_batch: 2\nseq_len: 8\nlayers: [{name: a, count: 2, forward_flops: 0, params: 1, boundary_bytes: 1, "
     "activation_bytes: 1}]\n", "workload 'w': every layer has 0 FLOPs, so there is no work to plan"),
])
def test_bad_workload_files(tmp_path, text, message):
    p = tmp_path / "w.yaml"
    p.write_text(text)
    with pytest.raises(WorkloadError, match=re.escape(message)):
        load_workload(str(p))


def test_non_utf8_workload_file(tmp_path):
    p = tmp_path / "bin.yaml"
    p.write_bytes(b"\xff\xfe\x00x")
    with pytest.raises(WorkloadError, match=r"bin\.yaml: not a UTF-8 text file"):
        load_workload(str(p))
