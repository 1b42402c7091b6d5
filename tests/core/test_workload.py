from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from spantrain.errors import WorkloadError
from spantrain.workload import MAX_SIZE, PRESETS, Architecture, Workload, load_workload


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
     "activation_bytes: 1}]\n", "w.yaml: 8000 layers by layers[1] after count expansion, at most 4096 are supported"),
    ("global_batch: 2\nseq_len: 8\narchitecture: {family: gpt2, vocab_size: 1, d_model: 4, n_layers: 1000000000, "
     "n_heads: 2, d_ff: 4, max_seq_len: 8}\n", "architecture.n_layers must be at most 4094"),
    # wrong types at the top: tracebacks (name, precision) or misread as true (the flags)
    ("name: [1, 2]\nglobal_batch: 2\nseq_len: 8\nlayers: [{name: a, forward_flops: 1, params: 1, boundary_bytes: 1, "
     "activation_bytes: 1}]\n", "w.yaml: name must be a non-empty string, got [1, 2]"),
    # a whole number in exponent form: YAML's 1e3 was hinted as 1.0e+3, which was refused as a float
    ("global_batch: 1e3\nseq_len: 8\nlayers: [{name: a, forward_flops: 1, params: 1, boundary_bytes: 1, "
     "activation_bytes: 1}]\n", "w.yaml: global_batch must be a positive integer, got the string '1e3' (write 1000)"),
    ("global_batch: 2\nseq_len: 8\narchitecture: {family: gpt2, vocab_size: 5.0e+4, d_model: 4, n_layers: 1, "
     "n_heads: 2, d_ff: 4, max_seq_len: 8}\n",
     "w.yaml: architecture.vocab_size must be a positive integer, got 50000.0 (write 50000)"),
    # shown in the plan's header, tables and the timeline's title: a newline or terminal escape broke them
    ("name: \"a\\nb\\e[31m\"\nglobal_batch: 2\nseq_len: 8\nlayers: [{name: a, forward_flops: 1, params: 1, "
     "boundary_bytes: 1, activation_bytes: 1}]\n", "w.yaml: name must be one line of printable text (no newline, "
     "tab or control character), got 'a\\nb\\x1b[31m'"),
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
    # accepted and ignored, or cut to an int, without a word
    ("tied_embeddings: true\nglobal_batch: 2\nseq_len: 8\nlayers: [{name: a, forward_flops: 1, params: 1, "
     "boundary_bytes: 1, activation_bytes: 1}]\n", "w.yaml: tied_embeddings applies to the architecture form"),
    ("global_batch: 2\nseq_len: 8\nlayers: [{name: a, forward_flops: 1, params: 1.5, boundary_bytes: 1, "
     "activation_bytes: 1}]\n", "w.yaml: layers[0]: params must be a whole number of parameters, got 1.5"),
    # no compute at all: exhaustive search divided by the 0 s a stage takes (compare's traceback); named by the
    # file, not by the workload's name
    ("name: mine\nglobal_batch: 2\nseq_len: 8\nlayers: [{name: a, forward_flops: 0, params: 1, boundary_bytes: 1, "
     "activation_bytes: 1}]\n", "w.yaml: every layer has 0 FLOPs"),
    ("global_batch: 2\nseq_len: 8\nlayers: [{name: a, count: 2, forward_flops: 0, params: 1, boundary_bytes: 1, "
     "activation_bytes: 1}]\n", "w.yaml: every layer has 0 FLOPs, so there is no work to plan"),
    # next to none: plans of 0 s and 0 samples/s called feasible
    ("global_batch: 2\nseq_len: 8\nlayers: [{name: a, count: 2, forward_flops: 1.0e-300, params: 1, "
     "boundary_bytes: 1, activation_bytes: 1}]\n", "w.yaml: its layers have 6e-300 FLOPs in all, under one, so "
     "there is no work to plan"),
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


def test_layers_repeated_by_aliases_stop_at_the_limit_before_they_are_built(tmp_path):
    # 12 KB: one entry of 4,096 layers, repeated 3,000 times; every layer was built (gigabytes, MemoryError)
    p = tmp_path / "w.yaml"
    p.write_text("global_batch: 2\nseq_len: 8\nlayers: [&e {name: b, count: 4096, forward_flops: 1, params: 1, "
                 "boundary_bytes: 1, activation_bytes: 1}" + ", *e" * 3000 + "]\n")
    with pytest.raises(WorkloadError) as err:
        load_workload(str(p))
    assert str(err.value) == (f"{p}: 8192 layers by layers[1] after count expansion, at most 4096 are supported "
                              "(lower the counts)")
    at_limit = tmp_path / "ok.yaml"
    at_limit.write_text("global_batch: 2\nseq_len: 8\nlayers: [&e {name: b, count: 2048, forward_flops: 1, "
                        "params: 1, boundary_bytes: 1, activation_bytes: 1}, {<<: *e, name: c}]\n")
    assert len(load_workload(str(at_limit))) == 4096


def test_a_layer_kind_must_be_text(tmp_path):
    # str() of a kind made of nested aliases expanded all of them
    p = tmp_path / "w.yaml"
    p.write_text("global_batch: 2\nseq_len: 8\nlayers: [{name: a, kind: [1, 2], forward_flops: 1, params: 1, "
                 "boundary_bytes: 1, activation_bytes: 1}]\n")
    with pytest.raises(WorkloadError, match=re.escape("layers[0]: kind must be a non-empty string, got [1, 2]")):
        load_workload(str(p))


_ARCH = {"family": "gpt2", "vocab_size": 64, "d_model": 8, "n_layers": 1, "n_heads": 2, "d_ff": 16, "max_seq_len": 8}


@pytest.mark.parametrize("field", ["vocab_size", "d_model", "n_heads", "d_ff", "max_seq_len"])
@pytest.mark.parametrize("value", [4 * 10**200, 10**300, MAX_SIZE + 1])
def test_architecture_sizes_are_bounded(tmp_path, field, value):
    # 4 * 10**200 was an OverflowError traceback, 10**300 gave 300-digit memory figures
    p = tmp_path / "w.yaml"
    p.write_text(yaml.safe_dump({"global_batch": 2, "seq_len": 8, "architecture": {**_ARCH, field: value}}))
    with pytest.raises(WorkloadError) as err:
        load_workload(str(p))
    assert str(err.value).startswith(f"{p}: architecture.{field} must be at most {MAX_SIZE}, got "), str(err.value)
    assert len(str(err.value)) < 200


def test_architecture_at_the_size_limits_gives_finite_figures():
    arch = Architecture(family="llama", vocab_size=MAX_SIZE, d_model=MAX_SIZE, n_layers=4094, n_heads=MAX_SIZE,
                        d_ff=MAX_SIZE, max_seq_len=MAX_SIZE)
    w = Workload.from_arch(arch, name="huge", global_batch=2**16, seq_len=MAX_SIZE)
    assert 0 < w.train_flops * w.global_batch < float("inf")
    assert 0 < float(w.total_params) < 1e30
    with pytest.raises(WorkloadError, match=f"seq_len must be at most {MAX_SIZE} tokens"):
        Workload(name="w", layers=w.layers[:1], global_batch=1, seq_len=MAX_SIZE + 1)


def test_the_architecture_section_reports_every_problem_at_once(tmp_path):
    # an unknown family hid vocab_size: 0, and an unknown key hid everything else
    p = tmp_path / "w.yaml"
    p.write_text("global_batch: 0\nseq_len: 8\narchitecture: {family: rnn, vocab_size: 0, d_model: 10, n_layers: 1, "
                 "n_heads: 3, d_ff: 4, max_seq_len: 8, colour: red}\n")
    with pytest.raises(WorkloadError) as err:
        load_workload(str(p))
    text = str(err.value)
    for expected in ["w.yaml: global_batch must be a positive integer", "w.yaml: architecture: unknown key 'colour'",
                     "w.yaml: architecture.family: unknown family 'rnn'",
                     "w.yaml: architecture.vocab_size must be a positive integer, got 0",
                     "w.yaml: architecture.d_model (10) must be divisible by n_heads (3)"]:
        assert expected in text, f"missing: {expected}\n{text}"
    with pytest.raises(WorkloadError) as err:  # built directly: the same checks, all at once
        Architecture(family="rnn", vocab_size=0, d_model=4, n_layers=1, n_heads=2, d_ff=4, max_seq_len=8)
    assert str(err.value) == ("architecture.family: unknown family 'rnn' (gpt2, llama or bert); "
                              "architecture.vocab_size must be a positive integer, got 0")


@pytest.mark.parametrize("name, message", [
    ("cee-demo.yaml", "looks like a cluster spec (it has devices and network), not a workload file: pass it as the "
                      "cluster (--cluster)"),
    ("plan-cee-demo.json", "looks like a plan (it has pipelines), not a workload file: pass it as the plan "
                           "(--plan, or plan --from)"),
])
def test_another_kind_of_file_given_as_the_model_is_named_in_one_line(name, message):
    path = Path(__file__).resolve().parents[2] / "examples" / name
    with pytest.raises(WorkloadError) as err:  # each of its keys was an unknown key
        load_workload(str(path))
    assert str(err.value) == f"{path}: {message}"


@pytest.mark.parametrize("kwargs", [{"global_batch": 0}, {"seq_len": 0}, {"seq_len": -1}, {"seq_len": "64"},
                                    {"seq_len": 64.0}])
def test_from_preset_refuses_a_bad_batch_or_length_naming_it(kwargs):
    # 0 was taken as "not given" (the preset's value, silently); -1 blamed the FLOPs; "64" was a TypeError
    with pytest.raises(WorkloadError, match=next(iter(kwargs))):
        Workload.from_preset("tiny-gpt", **kwargs)


def test_load_workload_refuses_global_batch_0():
    # a file's workload kept its own batch when given 0 (`if global_batch`), silently
    for model in ("examples/tiny-custom.yaml", "tiny-gpt"):
        with pytest.raises(WorkloadError, match="global_batch"):
            load_workload(str(Path(__file__).parents[2] / model) if model.endswith("yaml") else model,
                          global_batch=0)


@pytest.mark.parametrize(("field", "value"), [("forward_flops", float("nan")), ("params", -5), ("params", 1.5),
                                              ("boundary_bytes", float("nan")), ("activation_bytes", -1.0),
                                              ("weight_grad_flops", float("inf")), ("name", 5)])
def test_a_layer_built_in_code_checks_its_fields(field, value):
    # a workload of such layers was taken and planned (nan FLOPs passed the "under one FLOP" check)
    import dataclasses
    layer = Workload.from_preset("tiny-gpt").layers[1]
    with pytest.raises(WorkloadError, match=field if field != "name" else "layer name"):
        dataclasses.replace(layer, **{field: value})


@pytest.mark.parametrize(("changes", "named"), [({"name": 5}, "workload name"),
                                                ({"layers": ({"a": 1},)}, "layers must be"),
                                                ({"precision": ["bf16"]}, "precision must be")])
def test_a_workload_built_in_code_names_a_wrong_argument(changes, named):
    layers = Workload.from_preset("tiny-gpt").layers
    with pytest.raises(WorkloadError, match=named):
        Workload(**({"name": "x", "layers": layers, "global_batch": 8, "seq_len": 64} | changes))


def test_load_workload_takes_a_path_and_names_a_wrong_type():
    # a pathlib.Path was an AttributeError ('PosixPath' object has no attribute 'strip'), 5 as well
    path = Path(__file__).parents[2] / "examples/tiny-custom.yaml"
    assert load_workload(path) == load_workload(str(path))
    with pytest.raises(WorkloadError, match="model must be a preset name or a workload file's path"):
        load_workload(5)


@pytest.mark.parametrize(("changes", "named"), [({"precision": ["bf16"]}, "precision must be one of"),
                                                ({"arch": {"family": "gpt2"}}, "arch must be an Architecture")])
def test_from_arch_names_a_wrong_argument(changes, named):
    # a list as precision was a TypeError (unhashable), a dict as arch an AttributeError
    arch = PRESETS["tiny-gpt"]["arch"]
    args = {"arch": arch, "name": "x", "global_batch": 8, "seq_len": 32} | changes
    with pytest.raises(WorkloadError, match=named):
        Workload.from_arch(args.pop("arch"), **args)


def test_a_yaml_workload_saved_as_json_says_to_name_it_yaml(tmp_path):
    # "JSON syntax error at line 1 column 1: Expecting value" named no fix
    p = tmp_path / "mine.json"
    p.write_text("global_batch: 8\nseq_len: 32\nlayers:\n  - {name: a, forward_flops: 1.0e+9, params: 1, "
                 "boundary_bytes: 1, activation_bytes: 1}\n")
    with pytest.raises(WorkloadError) as err:
        load_workload(str(p))
    assert str(err.value) == (f"{p}: JSON syntax error at line 1 column 1: Expecting value (it is YAML, not JSON: "
                              "name it .yaml, or write it as JSON)")
    p.write_text('{"global_batch": 8,}')  # a JSON typo that YAML would read: no such hint
    with pytest.raises(WorkloadError) as err:
        load_workload(str(p))
    assert "YAML" not in str(err.value)


def test_a_workload_file_may_take_a_presets_name_only_with_its_layers(tmp_path):
    # a plan made for the preset ran on it with no note, and a cluster's layer_times measured for the
    # preset were used for its other layers
    p = tmp_path / "mine.yaml"
    arch = ("{family: gpt2, vocab_size: 256, d_model: 128, n_layers: 6, n_heads: 4, d_ff: 512, "
            "max_seq_len: 128}")
    p.write_text(f"name: gpt2-small\nglobal_batch: 8\nseq_len: 64\narchitecture: {arch}\n")
    with pytest.raises(WorkloadError) as err:
        load_workload(str(p))
    assert str(err.value) == (f"{p}: name 'gpt2-small' is a preset's, and this model's layers are not gpt2-small's: "
                              "give it its own name (plans and measured layer_times are matched by name)")
    p.write_text(f"name: tiny-gpt\nglobal_batch: 7\nseq_len: 64\nprecision: fp32\narchitecture: {arch}\n")
    assert load_workload(str(p)).layers == load_workload("tiny-gpt").layers  # the preset at another batch
    copy = tmp_path / "gpt2-small.yaml"  # a preset's copy, changed, and its name taken from the file's
    copy.write_text(f"global_batch: 8\nseq_len: 64\narchitecture: {arch}\n")
    with pytest.raises(WorkloadError, match=r"gpt2-small\.yaml: name \(the file's, as it gives no name:\) "
                                            r"'gpt2-small' is a preset's"):
        load_workload(str(copy))


def test_global_batch_may_come_from_the_override_alone(tmp_path):
    # --global-batch overrides the file's: a file without one was refused as missing a required key
    p = tmp_path / "mine.yaml"
    p.write_text("seq_len: 32\nlayers:\n  - {name: a, forward_flops: 1.0e+9, params: 1, boundary_bytes: 1, "
                 "activation_bytes: 1}\n")
    assert load_workload(str(p), global_batch=16).global_batch == 16
    with pytest.raises(WorkloadError) as err:
        load_workload(str(p))
    assert str(err.value) == f"{p}: missing required key 'global_batch' (give it, or pass --global-batch)"


def test_a_file_of_two_yaml_documents_says_so(tmp_path):
    # "YAML syntax error at line 4 column 1: but found another document"
    p = tmp_path / "two.yaml"
    p.write_text("global_batch: 8\nseq_len: 32\nlayers: []\n---\nname: x\n")
    with pytest.raises(WorkloadError) as err:
        load_workload(str(p))
    assert str(err.value) == (f"{p}: holds more than one YAML document (a second begins with the '---' at line 4): "
                              "keep one per file")
