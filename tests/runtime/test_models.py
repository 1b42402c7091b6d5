"""The runtime's layers match the workload's, parameter for parameter, however the model is cut."""

from __future__ import annotations

import pytest
import torch

from spantrain.errors import WorkloadError
from spantrain.runtime.models import IGNORE_INDEX, build_layer, build_stage_module, loss_fn
from spantrain.workload import PRESETS, Architecture, Workload


def _small(family: str) -> Workload:
    arch = Architecture(family=family, vocab_size=300, d_model=24, n_layers=3, n_heads=3, d_ff=40, max_seq_len=20)
    return Workload.from_arch(arch, name=f"small-{family}", global_batch=4, seq_len=12, precision="fp32")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_layers_have_the_workload_parameter_counts(name):
    w = Workload.from_preset(name)
    # embedding, one block (all blocks are alike) and head; on the meta device nothing is allocated
    for i in (0, 1, w.num_layers - 1):
        layer = build_layer(w.arch, i, w.num_layers, device="meta", init=False)
        assert sum(p.numel() for p in layer.parameters()) == w.layers[i].params, (name, w.layers[i].name)


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
def test_every_built_layer_matches_its_workload_layer(family):
    w = _small(family)
    model = build_stage_module(w, 0, w.num_layers, seed=3)
    per_layer = model.layer_parameters()
    assert sorted(per_layer) == list(range(w.num_layers))
    for i, params in per_layer.items():
        assert sum(p.numel() for _, p in params) == w.layers[i].params
        assert all(k.startswith(f"layers.{i}.") for k, _ in params)


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
def test_init_depends_on_seed_and_layer_only(family):
    w = _small(family)
    full = dict(p for ps in build_stage_module(w, 0, w.num_layers, seed=5).layer_parameters().values() for p in ps)
    cut = dict(p for ps in build_stage_module(w, 2, 4, seed=5).layer_parameters().values() for p in ps)
    assert cut and all(torch.equal(full[k], v) for k, v in cut.items())
    other = dict(p for ps in build_stage_module(w, 2, 4, seed=6).layer_parameters().values() for p in ps)
    assert any(not torch.equal(other[k], v) for k, v in cut.items())


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
def test_stages_chain_to_the_full_model(family):
    w = _small(family)
    ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    full = build_stage_module(w, 0, w.num_layers, seed=1)(ids)
    x = ids
    for a, b in ((0, 2), (2, 3), (3, w.num_layers)):
        x = build_stage_module(w, a, b, seed=1)(x)
    assert x.shape == (2, 12, 300)
    torch.testing.assert_close(x, full)


def test_causal_models_do_not_look_ahead():
    w = _small("gpt2")
    model = build_stage_module(w, 0, w.num_layers, seed=0)
    a = torch.randint(0, 300, (1, 12), generator=torch.Generator().manual_seed(1))
    b = a.clone()
    b[0, 8:] = (b[0, 8:] + 1) % 300
    torch.testing.assert_close(model(a)[0, :8], model(b)[0, :8])


def test_loss_is_a_mean_over_tokens_that_ignores_unmasked_positions():
    logits = torch.randn(2, 3, 5)
    targets = torch.tensor([[1, IGNORE_INDEX, 2], [IGNORE_INDEX, IGNORE_INDEX, 4]])
    flat = torch.nn.functional.cross_entropy(logits.reshape(-1, 5), targets.reshape(-1), ignore_index=IGNORE_INDEX,
                                             reduction="sum")
    torch.testing.assert_close(loss_fn(logits, targets), flat / 6)
    # halves of a batch average back to the whole batch's loss
    halves = (loss_fn(logits[:1], targets[:1]) + loss_fn(logits[1:], targets[1:])) / 2
    torch.testing.assert_close(halves, loss_fn(logits, targets))


def test_model_without_architecture_is_refused():
    from spantrain.workload import Layer

    layer = Layer(name="x", kind="custom", forward_flops=1, input_grad_flops=1, weight_grad_flops=1, params=1,
                  boundary_bytes=1, activation_bytes=1)
    w = Workload(name="opaque", layers=(layer,), global_batch=1, seq_len=4)
    with pytest.raises(WorkloadError, match="no architecture"):
        build_stage_module(w, 0, 1)
