"""`simulate --timeline` on a plan of many stages: the rows drawn are capped, and the chart says so."""

from __future__ import annotations

import json
import struct
import warnings

import yaml

from spantrain.profiler.topology import generate


def test_rows_to_draw_keeps_the_first_and_last_stages():
    from spantrain.env.timeline import rows_to_draw

    assert rows_to_draw([2, 2], max_rows=4) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert rows_to_draw([3, 3, 3], max_rows=5) == [(0, 0), (0, 1), (0, 2), (2, 1), (2, 2)]
    assert rows_to_draw([4096], max_rows=4) == [(0, 0), (0, 1), (0, 4094), (0, 4095)]


def test_a_plan_of_many_stages_draws_a_capped_timeline(run_cli, monkeypatch, tmp_path):
    from matplotlib.figure import Figure

    from spantrain.env.timeline import MAX_ROWS

    # 96 one-layer stages: one row each made the image as tall as the plan was deep
    cluster = generate(96, seed=0, profile="datacenter")
    cluster.save(tmp_path / "c.yaml")
    arch = {"family": "gpt2", "n_layers": 94, "d_model": 64, "n_heads": 2, "d_ff": 128, "vocab_size": 1000,
            "max_seq_len": 64}
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({"name": "deep", "architecture": arch, "seq_len": 64,
                                                     "global_batch": 4}))
    stages = [{"devices": [d], "layers": [k, k + 1]} for k, d in enumerate(cluster.ids)]
    _one_pipeline(tmp_path / "p.json", stages)
    seen = {}
    real = Figure.savefig

    def spy(self, *args, **kwargs):
        ax = self.axes[0]
        seen["labels"] = [t.get_text() for t in ax.get_yticklabels()]
        seen["title"] = ax.get_title()
        seen["texts"] = [t.get_text() for t in ax.texts]
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    png = tmp_path / "t.png"
    code, _, err = run_cli("simulate", "-c", tmp_path / "c.yaml", "-m", tmp_path / "m.yaml", "-p", tmp_path / "p.json",
                           "--timeline", png)
    assert code == 0, err
    labels = seen["labels"]
    assert len(labels) == MAX_ROWS and labels[0].startswith("p0 s0 ") and labels[-1].startswith("p0 s95 ")
    assert f"{MAX_ROWS} of 96 stages drawn" in seen["title"] and "... 32 stages not drawn ..." in seen["texts"]
    _, height = struct.unpack(">II", png.read_bytes()[16:24])
    assert height < 110 * (1.2 + 0.42 * (MAX_ROWS + 2) + 10)  # dpi x inches of MAX_ROWS rows and the sync panel


def test_a_long_device_id_is_cut_short_in_the_timeline(run_cli, monkeypatch, tmp_path):
    from matplotlib.figure import Figure

    # a 5,000-character id (the spec sets no length limit) made a label wider than the figure:
    # the rows were cut off and matplotlib warned on stderr ("Tight layout not applied")
    long_id = "d" * 5000
    spec = {"name": "long", "devices": [{"id": long_id, "region": "r", "tflops": 10, "memory_gb": 16},
                                        {"id": "b", "region": "r", "tflops": 10, "memory_gb": 16}],
            "network": {"regions": {"r": {"gbps": 10, "latency_ms": 0.1}}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(spec))
    stages = [{"devices": [long_id], "layers": [0, 4]}, {"devices": ["b"], "layers": [4, 8]}]
    _one_pipeline(tmp_path / "p.json", stages)
    seen = {}
    real = Figure.savefig

    def spy(self, *args, **kwargs):
        seen["labels"] = [t.get_text() for t in self.axes[0].get_yticklabels()]
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, _, err = run_cli("simulate", "-c", tmp_path / "c.yaml", "-m", "tiny-gpt", "-p", tmp_path / "p.json",
                               "--timeline", tmp_path / "t.png")
    assert code == 0, err
    assert not [w for w in caught if "layout" in str(w.message)], [str(w.message) for w in caught]
    first, second = seen["labels"]
    assert first.startswith("p0 s0 ddd") and first.endswith("… [0,4)") and len(first) < 60
    assert second == "p0 s1 b [4,8)"


def _one_pipeline(path, stages) -> None:
    """A one-pipeline 1F1B plan file of 4 micro-batches of 1 over `stages`."""
    path.write_text(json.dumps({"schedule": "1f1b", "sync": {"mode": "allreduce", "period": 1},
                                "pipelines": [{"micro_batch_size": 1, "num_micro_batches": 4, "stages": stages}]}))
