from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from spantrain.cluster import GBPS, MAX_DEVICES, Cluster
from spantrain.errors import SpantrainError, SpecError


def test_design_example_expands_counts_and_fills_arrays(demo_spec):
    c = Cluster.from_spec(demo_spec)
    assert c.ids == ["cloud-0", "cloud-1", "cloud-2", "cloud-3", "edge-0", "end-0"]
    i, j = c.index("cloud-0"), c.index("cloud-2")
    assert c.bandwidth[i, j] == pytest.approx(100 * GBPS)
    assert c.latency[i, j] == pytest.approx(0.02e-3)
    # device-pair override, symmetric
    a, b = c.index("cloud-0"), c.index("cloud-1")
    assert c.bandwidth[a, b] == c.bandwidth[b, a] == pytest.approx(600 * GBPS)
    # listed inter-region link and the default
    e, n = c.index("edge-0"), c.index("end-0")
    assert c.bandwidth[i, e] == pytest.approx(0.1 * GBPS) and c.latency[e, i] == pytest.approx(0.030)
    assert c.bandwidth[i, n] == pytest.approx(0.05 * GBPS) and c.latency[i, n] == pytest.approx(0.080)
    assert c.bandwidth[e, n] == pytest.approx(0.5 * GBPS)
    assert np.isinf(c.bandwidth[i, i]) and c.latency[i, i] == 0
    assert c.device("edge-0").tflops == 35 and c.device("end-0").memory_bytes == 12e9


@pytest.mark.parametrize("default", [True, False])
def test_arrays_hold_each_region_pairs_link(default):
    # the arrays are filled per listed link over a default; every device pair must read
    # what the network section says of its two regions, with or without a default
    rng = np.random.default_rng(0)
    names = [f"r{k}" for k in range(7)]
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    listed = [p for p in pairs if not default or rng.random() < 0.4]
    spec = {"name": "links",
            "devices": [{"id": f"d{k}", "region": names[k % 7], "tier": "edge", "gpu": "g",
                         "tflops": 10, "memory_gb": 8} for k in range(12)],
            "network": {"regions": {r: {"gbps": float(rng.uniform(1, 100)), "latency_ms": 0.1} for r in names},
                        "links": [{"between": [b, a], "gbps": float(rng.uniform(0.1, 1)),
                                   "latency_ms": float(rng.uniform(1, 50))} for a, b in listed]}}
    if default:
        spec["network"]["default"] = {"gbps": 0.05, "latency_ms": 80}
    c = Cluster.from_spec(spec)
    for i, di in enumerate(c.devices):
        for j, dj in enumerate(c.devices):
            if i != j:
                link = c.network.between(di.region, dj.region)
                assert (c.bandwidth[i, j], c.latency[i, j]) == (link.bytes_per_s, link.latency_s)


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_spec_round_trips_through_files(demo_spec, tmp_path, suffix):
    c = Cluster.from_spec(demo_spec)
    path = tmp_path / f"c{suffix}"
    c.save(path)
    again = Cluster.from_file(path)
    assert again == c
    assert again.to_spec() == c.to_spec()
    # the canonical form is the DESIGN example itself
    assert c.to_spec() == demo_spec


def test_changed_arrays_round_trip_as_overrides(demo_spec, tmp_path):
    c = Cluster.from_spec(demo_spec)
    bw = c.bandwidth.copy()
    lat = c.latency.copy()
    e, n = c.index("edge-0"), c.index("end-0")
    bw[e, n] = 0.01 * GBPS          # directional: only edge -> end degrades
    lat[n, e] = lat[e, n] = 0.2      # symmetric latency change on the same pair
    changed = c.with_arrays(bandwidth=bw, latency=lat)
    changed.save(tmp_path / "c.yaml")
    again = Cluster.from_file(tmp_path / "c.yaml")
    assert np.allclose(again.bandwidth, changed.bandwidth) and np.allclose(again.latency, changed.latency)
    overrides = yaml.safe_load((tmp_path / "c.yaml").read_text())["network"]["overrides"]
    assert any(o.get("from") == "edge-0" and o.get("to") == "end-0" for o in overrides)


@pytest.mark.parametrize("second", [{"between": ["cloud-1", "cloud-0"]}, {"from": "cloud-0", "to": "cloud-1"},
                                    {"from": "cloud-1", "to": "cloud-0"}])
def test_a_device_pair_given_twice_is_refused(demo_spec, second):
    # the last override silently won: a typo'd copy decided the link
    spec = json.loads(json.dumps(demo_spec))
    overrides = spec["network"]["overrides"]
    assert overrides[0]["between"] == ["cloud-0", "cloud-1"]
    overrides.append({**second, "gbps": 7, "latency_ms": 3})
    where = f"network.overrides[{len(overrides) - 1}]"
    with pytest.raises(SpecError, match=re.escape(f"{where}: the link from ") + ".* is already set by "
                       + re.escape("network.overrides[0]: give each device pair once")):
        Cluster.from_spec(spec)
    # a device with itself: that problem alone (it also said the link was "already set" by itself)
    spec["network"]["overrides"] = [{"between": ["cloud-0", "cloud-0"], "gbps": 7, "latency_ms": 3}]
    with pytest.raises(SpecError) as e:
        Cluster.from_spec(spec)
    assert str(e.value).endswith("network.overrides[0]: a device pair needs two different devices"), str(e.value)
    # one override per direction is how a one-way link is written
    spec["network"]["overrides"] = [{"from": "cloud-0", "to": "cloud-1", "gbps": 7, "latency_ms": 3},
                                    {"from": "cloud-1", "to": "cloud-0", "gbps": 9, "latency_ms": 3}]
    c = Cluster.from_spec(spec)
    assert c.bandwidth[c.index("cloud-0"), c.index("cloud-1")] == pytest.approx(7 * GBPS)
    assert c.bandwidth[c.index("cloud-1"), c.index("cloud-0")] == pytest.approx(9 * GBPS)


def test_subset_keeps_links(demo_spec):
    c = Cluster.from_spec(demo_spec)
    s = c.subset(["cloud-1", "end-0"])
    assert s.ids == ["cloud-1", "end-0"]
    assert s.bandwidth[0, 1] == c.bandwidth[c.index("cloud-1"), c.index("end-0")]
    assert Cluster.from_spec(s.to_spec()) == s


def _mutate(spec, path, value):
    obj = spec
    for key in path[:-1]:
        obj = obj[key]
    if value is KeyError:
        del obj[path[-1]]
    else:
        obj[path[-1]] = value
    return spec


@pytest.mark.parametrize("path, value, message", [
    (("devices", 1, "colour"), "red", "unknown key 'colour'"),
    (("devices", 1, "region"), "edge-z", "unknown region 'edge-z'"),
    (("devices", 1, "tflops"), 0, "tflops must be a positive number"),
    (("devices", 1, "tflops"), "fast", "tflops must be a positive number, got 'fast'"),
    (("devices", 2, "memory_gb"), -4, "memory_gb must be a positive number"),
    (("devices", 0, "count"), 0, "count must be a positive integer"),
    (("devices", 1, "id"), "end-0", "duplicate device id 'end-0'"),
    (("devices",), [], "the cluster is empty"),
    (("network", "regions", "end-c", "gbps"), 0, "network.regions.end-c: gbps must be a positive number"),
    (("network", "regions", "end-c", "latency_ms"), "slow", "latency_ms must be a number >= 0"),
    (("network", "links", 0, "between"), ["cloud-a", "moon"], "unknown region 'moon'"),
    (("network", "default"), KeyError, "no link between regions 'cloud-a' and 'end-c'"),
    (("network", "overrides", 0, "between"), ["cloud-0", "cloud-9"], "unknown device 'cloud-9'"),
    (("network", "bandwidth"), 3, "unknown key 'bandwidth'"),
    # figures whose unit conversion or cost-model products would overflow
    (("devices", 1, "tflops"), 1e300, "tflops must be from 1e-30 to 1e+30, got 1e+300"),
    (("devices", 1, "memory_gb"), 1e300, "memory_gb must be from 1e-30 to 1e+30"),
    (("network", "links", 0, "gbps"), 1e-300, "gbps must be from 1e-30 to 1e+30"),
    (("network", "links", 0, "latency_ms"), 1e300, "latency_ms must be at most 1e+30"),
    # measured layer times too: an infinite one made the cost model's kernel fail ("deadlocks")
    (("devices", 1, "layer_times"), {"tiny-gpt": {"batch": 1, "forward_ms": [1.0] * 8,
                                                  "backward_ms": [1.0] * 7 + [float("inf")]}},
     "devices[1] (edge-0).layer_times[tiny-gpt]: backward_ms must be a non-empty list of numbers from 0 to 1e+30"),
    (("devices", 1, "layer_times"), {"tiny-gpt": {"batch": 1, "forward_ms": [1e308] * 8, "backward_ms": [1.0] * 8}},
     "forward_ms must be a non-empty list of numbers from 0 to 1e+30"),
    # all zero: the exhaustive planner's bound divided by the device's time (ZeroDivisionError)
    (("devices", 1, "layer_times"), {"tiny-gpt": {"batch": 1, "forward_ms": [0] * 8, "backward_ms": [0.0] * 8}},
     "devices[1] (edge-0).layer_times[tiny-gpt]: every forward_ms and backward_ms is 0"),
    # YAML 1.1 reads 1.0e9 as a string: say so
    (("devices", 1, "tflops"), "1.0e9", "got the string '1.0e9' (YAML reads 1.0e9 as text; write 1.0e+9)"),
    (("devices", 0, "count"), "4", "got the string '4' (write the number without quotes)"),
])
def test_bad_specs_name_the_problem(demo_spec, path, value, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        Cluster.from_spec(_mutate(demo_spec, path, value))


def test_every_problem_is_reported_at_once(demo_spec):
    demo_spec["devices"][1]["tflops"] = -1
    demo_spec["devices"][2]["region"] = "nowhere"
    with pytest.raises(SpecError) as err:
        Cluster.from_spec(demo_spec)
    assert "tflops" in str(err.value) and "nowhere" in str(err.value)
    assert "\n" not in str(err.value)
    # a missing region link too, under the file's name: it came only once the rest was fixed, naming the cluster
    del demo_spec["network"]["default"]
    demo_spec["devices"][2]["region"] = "end-c"
    with pytest.raises(SpecError) as err:
        Cluster.from_spec(demo_spec, "f.yaml")
    assert str(err.value).startswith("f.yaml: ") and "tflops" in str(err.value)
    assert "no link between regions 'cloud-a' and 'end-c'" in str(err.value)


@pytest.mark.parametrize("entry, dup", [(1, "end-0"), (2, "edge-0"), (2, "cloud-1")],
                         ids=["bad-figure-entry-second", "bad-figure-entry-first", "count-expanded"])
def test_a_duplicate_id_is_reported_with_the_entrys_other_problems(demo_spec, entry, dup):
    """An entry with a bad figure and an id another entry has: both problems in the one error."""
    demo_spec["devices"][entry]["id"] = dup
    demo_spec["devices"][entry]["tflops"] = -1
    with pytest.raises(SpecError) as err:
        Cluster.from_spec(demo_spec)
    assert "tflops must be a positive number" in str(err.value)
    assert f"duplicate device id {dup!r}" in str(err.value)
    assert "\n" not in str(err.value)


def test_file_errors_are_one_line(tmp_path):
    with pytest.raises(SpecError, match="file not found"):
        Cluster.from_file(tmp_path / "missing.yaml")
    # both were "file not found", naming a file that is there
    (tmp_path / "loop-a.yaml").symlink_to(tmp_path / "loop-b.yaml")
    (tmp_path / "loop-b.yaml").symlink_to(tmp_path / "loop-a.yaml")
    with pytest.raises(SpecError, match=r"loop-a.yaml: cannot be read \(a loop of symbolic links\)$"):
        Cluster.from_file(tmp_path / "loop-a.yaml")
    (tmp_path / "link.yaml").symlink_to("gone.yaml")
    with pytest.raises(SpecError, match=r"link.yaml: is a symbolic link to gone.yaml, which does not exist$"):
        Cluster.from_file(tmp_path / "link.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("devices: [\n  {id: a,\n")
    with pytest.raises(SpecError, match="YAML syntax error at line"):
        Cluster.from_file(bad)
    badj = tmp_path / "bad.json"
    badj.write_text(json.dumps({"devices": []})[:-3])
    with pytest.raises(SpecError, match="JSON syntax error"):
        Cluster.from_file(badj)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00x")
    with pytest.raises(SpecError, match=r"bin\.yaml: not a UTF-8 text file"):
        Cluster.from_file(binary)
    twice = tmp_path / "twice.yaml"  # PyYAML kept the last silently: a 500 TFLOP/s device
    twice.write_text("devices:\n  - {id: a, tflops: 10, tflops: 500}\n")
    with pytest.raises(SpecError, match=r"twice\.yaml: YAML syntax error at line 2 column 25: duplicate key 'tflops' "
                                        r"\(first at line 2\): give each key once"):
        Cluster.from_file(twice)
    twice_json = tmp_path / "twice.json"
    twice_json.write_text('{"name": "a", "name": "b"}')
    with pytest.raises(SpecError, match=r"twice\.json: duplicate key 'name' in one object: give each key once"):
        Cluster.from_file(twice_json)
    empty = tmp_path / "empty.yaml"
    empty.write_text("# to be written\n")  # it said "got NoneType"
    with pytest.raises(SpecError, match=r"empty\.yaml: empty: a cluster spec is a mapping with 'devices' and "):
        Cluster.from_file(empty)


def test_file_name_is_named_once(tmp_path):
    p = tmp_path / "nodev.yaml"
    p.write_text("network: {regions: {a: {gbps: 1, latency_ms: 1}}}\nname: 3\n")
    with pytest.raises(SpecError) as err:
        Cluster.from_file(p)
    assert str(err.value) == f"{p}: missing required key 'devices'; name must be a string"


def test_device_count_is_bounded_before_expansion(demo_spec):
    demo_spec["devices"][0]["count"] = 10**9  # would hang expanding, or exhaust memory in the arrays
    with pytest.raises(SpecError) as err:
        Cluster.from_spec(demo_spec)
    assert str(err.value) == (f"cluster spec: devices[0] (cloud): count must be at most {MAX_DEVICES} "
                              "(the most devices a cluster may have), got 1000000000")
    demo_spec["devices"][0]["count"] = MAX_DEVICES - 1  # + edge-0 + end-0
    with pytest.raises(SpecError, match=f"{MAX_DEVICES + 1} devices after count expansion, at most {MAX_DEVICES}"):
        Cluster.from_spec(demo_spec)
    demo_spec["devices"][0]["count"] = MAX_DEVICES - 2
    del demo_spec["network"]["overrides"]  # keeps the build of the largest cluster fast
    assert len(Cluster.from_spec(demo_spec)) == MAX_DEVICES


def test_generator_and_spec_share_the_device_limit():
    from spantrain.profiler import topology

    assert topology.MAX_DEVICES is MAX_DEVICES


@pytest.mark.parametrize("out", [".", "..", "/"])
def test_save_to_a_path_naming_no_file_is_a_spec_error(tmp_path, monkeypatch, demo_spec, out):
    # a path without a file name had no place to write its temporary file beside: a ValueError, then
    # an IsADirectoryError; a library caller gets the project's own error, naming the path and the fix
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    with pytest.raises(SpecError) as err:
        Cluster.from_spec(demo_spec).save(out)
    assert str(err.value) == (f"cannot save the cluster spec to {out}: it is a directory; pass the path of a file "
                              f"in it, such as {Path(out) / 'cluster.yaml'}")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["sub"]


@pytest.mark.parametrize("out, message", [
    (None, "cannot save the cluster spec: expected the path of a file, got None; pass one such as cluster.yaml"),
    (3, "cannot save the cluster spec: expected the path of a file, got 3; pass one such as cluster.yaml"),
    ("", "cannot save the cluster spec: the path is empty; pass a file path such as cluster.yaml"),
    ("TMP/missing/c.yaml", "cannot save the cluster spec to TMP/missing/c.yaml: its directory TMP/missing does "
                           "not exist; create it first, or pass a path in an existing directory"),
    ("TMP/afile/c.json", "cannot save the cluster spec to TMP/afile/c.json: TMP/afile is not a directory; pass "
                         "a path in a directory"),
    ("/proc/c.yaml", "cannot save the cluster spec to /proc/c.yaml: cannot create a file in /proc ("),
])
def test_save_to_a_path_it_cannot_write_is_one_spec_error(tmp_path, demo_spec, out, message):
    # None was a TypeError from Path(); a missing directory a FileNotFoundError naming the temporary file's
    # directory; /proc a DiskFull ("its disk is full"), since /proc has no free space to tell
    (tmp_path / "afile").write_text("")
    out = out.replace("TMP", str(tmp_path)) if isinstance(out, str) else out
    with pytest.raises(SpecError) as err:
        Cluster.from_spec(demo_spec).save(out)
    assert str(err.value).startswith(message.replace("TMP", str(tmp_path))), str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_save_replaces_the_file_whole_or_not_at_all(tmp_path, demo_spec, monkeypatch):
    # `run --adapt` follows a cluster file that a profiler rewrites: a reader must never see half of it
    import spantrain._spec as spec_module

    path = tmp_path / "cluster.yaml"
    Cluster.from_spec(demo_spec).save(path)
    before = path.read_text()
    demo_spec["devices"][1]["tflops"] = 70
    changed = Cluster.from_spec(demo_spec)

    def interrupted(self, text):  # the write dies halfway, as on Ctrl-C or a full disk
        with open(self, "w") as f:
            f.write(text[: len(text) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(spec_module.Path, "write_text", interrupted)
    with pytest.raises(KeyboardInterrupt):
        changed.save(path)
    monkeypatch.undo()
    assert path.read_text() == before and sorted(p.name for p in tmp_path.iterdir()) == ["cluster.yaml"]
    changed.save(path)
    assert Cluster.from_file(path).device("edge-0").tflops == 70
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.yaml"]


@pytest.mark.parametrize("regions, message", [
    (5, "network.regions: expected a non-empty mapping"),  # was a TypeError traceback, also in a running --adapt
    ("cloud", "network.regions: expected a non-empty mapping"),
    ([1, 2], "network.regions: expected a non-empty mapping"),
])
def test_a_wrong_regions_block_is_one_problem_not_a_cascade(demo_spec, regions, message):
    demo_spec["network"]["regions"] = regions
    with pytest.raises(SpecError) as err:
        Cluster.from_spec(demo_spec)
    # every device and link named its region "unknown" after the real problem
    assert message in str(err.value) and "unknown region" not in str(err.value), str(err.value)


def test_a_region_name_yaml_reads_as_a_number_is_named_as_such(demo_spec):
    spec = yaml.safe_load("network:\n  regions:\n    1: {gbps: 10, latency_ms: 1}\n")
    demo_spec["network"] = spec["network"]
    for d in demo_spec["devices"]:
        d["region"] = "1"
    with pytest.raises(SpecError) as err:
        Cluster.from_spec(demo_spec)
    assert "network.regions: region name 1 must be a string (quote it: '1')" in str(err.value)
    assert "unknown region" not in str(err.value)


def test_a_file_that_never_ends_is_refused_and_a_byte_order_mark_is_read(tmp_path, monkeypatch, demo_spec):
    from spantrain import _spec

    monkeypatch.setattr(_spec, "MAX_FILE_BYTES", 4096)  # the real bound, 256 MB, takes a moment to fill
    # /dev/zero (or any device or endless pipe) filled the memory until the kernel killed the process
    with pytest.raises(SpecError, match=r"^/dev/zero: is a device, not a regular file; save what it gives to a file"):
        Cluster.from_file("/dev/zero")
    huge = tmp_path / "huge.yaml"  # a regular file is still read only up to the bound
    with open(huge, "wb") as f:
        f.truncate(8192)
    with pytest.raises(SpecError, match=r"^.*huge\.yaml: larger than 0 MB, which no spec, plan or workload file is"):
        Cluster.from_file(huge)
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(demo_spec).encode())  # as some Windows editors save
    assert len(Cluster.from_file(path)) == len(Cluster.from_spec(demo_spec))  # was "Unexpected UTF-8 BOM"


@pytest.mark.timeout(120)  # without the check, each read waits forever
def test_a_pipe_or_standard_input_is_refused_not_waited_on(tmp_path, demo_spec, run_cli):
    # `mkfifo f; spantrain plan --cluster f` waited for a writer forever, and so did a FIFO given as a plan,
    # a workload or a calibration profile (all read here)
    import subprocess
    import sys

    from spantrain.plan import Plan

    fifo = tmp_path / "cluster.yaml"
    os.mkfifo(fifo)
    for load in (Cluster.from_file, Plan.from_file):
        with pytest.raises(SpantrainError) as err:
            load(fifo)
        assert str(err.value) == (f"{fifo}: is a pipe (FIFO), not a regular file; save what it gives to a file and "
                                  "pass that file's path")
    code, out, err = run_cli("plan", "--cluster", fifo, "--model", "gpt2-medium")
    assert (code, out) == (2, "") and err == (f"spantrain plan: error: {fifo}: is a pipe (FIFO), not a regular file; "
                                              "save what it gives to a file and pass that file's path\n")
    with pytest.raises(SpecError, match=r"^-: reading from standard input is not supported; save it to a file"):
        Cluster.from_file("-")
    # /dev/stdin is read when it is a file redirected in, refused when it is a pipe
    code = "import sys; from spantrain.cluster import Cluster; print(len(Cluster.from_file('/dev/stdin')))"
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(demo_spec))
    with open(spec) as f:
        done = subprocess.run([sys.executable, "-c", code], stdin=f, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == str(len(Cluster.from_spec(demo_spec))), done.stderr
    done = subprocess.run([sys.executable, "-c", code], input=spec.read_text(), capture_output=True, text=True,
                          timeout=60)
    assert "/dev/stdin: is a pipe (FIFO), not a regular file" in done.stderr


def test_an_error_line_lists_twenty_problems_and_counts_the_rest(demo_spec):
    from spantrain.errors import MAX_PROBLEMS_SHOWN, PlanError

    demo_spec["devices"] = [{"id": f"d{k}", "region": "nowhere", "tflops": 1, "memory_gb": 1} for k in range(500)]
    with pytest.raises(SpecError) as err:
        Cluster.from_spec(demo_spec)
    assert str(err.value).count("unknown region 'nowhere'") == MAX_PROBLEMS_SHOWN == 20
    assert re.search(r"; \.\.\. and 4[89]\d more$", str(err.value))  # 480 devices, and the links to them
    assert str(PlanError(["a", "b"])) == "a; b" and PlanError(["x"] * 21).problems == ["x"] * 21  # all kept


def test_a_workload_given_as_the_cluster_is_named_in_one_line(tmp_path, demo_spec):
    # each of its keys was an unknown key, and devices and network missing
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump({"global_batch": 2, "seq_len": 8, "layers": [{"name": "a"}]}))
    with pytest.raises(SpecError) as err:
        Cluster.from_file(path)
    assert str(err.value) == (f"{path}: looks like a workload file (it has layers and global_batch), not a cluster "
                              "spec: pass it as the model (--model)")
    # a spec with its own keys is told its own problems, whatever else it has
    demo_spec["pipelines"] = []
    with pytest.raises(SpecError, match="unknown key 'pipelines'"):
        Cluster.from_spec(demo_spec)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"tflops": -5.0}, "tflops"),
    ({"tflops": float("nan")}, "tflops"),
    ({"memory_gb": float("inf")}, "memory_gb"),
    ({"memory_gb": "16"}, "memory_gb"),
    ({"id": 3}, "id"),
    ({"region": None}, "region"),
])
def test_device_built_in_code_checks_its_fields(kwargs, field):
    from spantrain.cluster import Device
    args = {"id": "a", "region": "r", "tflops": 10.0, "memory_gb": 16.0} | kwargs
    with pytest.raises(SpecError, match=field):
        Device(**args)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"gbps": -1.0}, "gbps"), ({"gbps": 0}, "gbps"), ({"latency_ms": float("nan")}, "latency_ms"),
    ({"latency_ms": -2}, "latency_ms"),
])
def test_netlink_built_in_code_checks_its_fields(kwargs, field):
    from spantrain.cluster import NetLink
    with pytest.raises(SpecError, match=field):
        NetLink(**({"gbps": 10.0, "latency_ms": 0.1} | kwargs))


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_changed_cluster_saved_reads_back_equal(demo_spec, tmp_path, suffix):
    # figures were cut to 9 digits and changes under 1e-9 not saved: the file read back was another cluster
    import dataclasses

    from spantrain.cluster import LayerTimes
    c = Cluster.from_spec(demo_spec)
    times = {"m": LayerTimes(batch=2, forward_s=(1 / 3, 0.1), backward_s=(2 / 3, 0.2))}
    devices = [dataclasses.replace(d, tflops=d.tflops / 3, memory_gb=d.memory_gb / 7, layer_times=times)
               for d in c.devices]
    c = Cluster(name=c.name, devices=devices, network=c.network)
    rng = np.random.default_rng(0)
    changed = c.with_arrays(bandwidth=c.bandwidth * rng.uniform(0.5, 2, c.bandwidth.shape),
                            latency=c.latency * (1 + 1e-12))
    changed.save(tmp_path / f"c{suffix}")
    again = Cluster.from_file(tmp_path / f"c{suffix}")
    assert again.devices == changed.devices
    # exact where a figure in Gbit/s (ms) reads back as these bytes/s (s); else the nearest float to it
    for a, b in ((again.bandwidth, changed.bandwidth), (again.latency, changed.latency)):
        off = ~np.eye(len(c), dtype=bool)
        assert np.all(np.abs(a[off] - b[off]) <= np.spacing(b[off])), np.max(np.abs(a[off] / b[off] - 1))


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"backward_s": (1.0,)}, "different lengths"),   # was saved to a spec that could not be read back
    ({"forward_s": (float("nan"), 1.0)}, "forward_s"),
    ({"forward_s": (1e28, 1.0)}, r"forward_s must be a non-empty tuple of numbers from 0 to 1e\+27"),  # no spec held it
    ({"backward_s": ()}, "backward_s"),
    ({"batch": 0}, "batch"),
])
def test_layer_times_built_in_code_check_their_fields(kwargs, named):
    from spantrain.cluster import LayerTimes
    with pytest.raises(SpecError, match=named):
        LayerTimes(**({"batch": 2, "forward_s": (0.1, 0.2), "backward_s": (0.2, 0.4)} | kwargs))


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"name": 5}, "name must be a string"),      # was saved to a spec that could not be read back
    ({"devices": None}, "devices must be"),       # was a TypeError
    ({"network": None}, "network must be"),       # was an AttributeError
    ({"devices": [{"id": "a"}]}, "devices must be Device"),
])
def test_cluster_built_in_code_names_a_wrong_argument(kwargs, named):
    from spantrain.cluster import Device, NetLink, Network
    args = {"name": "x", "devices": [Device(id="a", region="r", tflops=1.0, memory_gb=1.0)],
            "network": Network(regions={"r": NetLink(gbps=1.0, latency_ms=0.1)})} | kwargs
    with pytest.raises(SpecError, match=named):
        Cluster(**args)


def test_an_unhashable_device_id_is_no_device(demo_spec):
    # Cluster.index(["a"]) and ["a"] in cluster were TypeErrors (unhashable list)
    c = Cluster.from_spec(demo_spec)
    assert ["cloud-0"] not in c
    with pytest.raises(SpecError, match="has no device"):
        c.index(["cloud-0"])


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"latency": np.inf}, "latency must be >= 0 and finite"),
    ({"bandwidth": np.inf}, "bandwidth must be positive and finite"),
    ({"latency": 1e300}, "latency must be"),
    ({"bandwidth": 1e-300}, "bandwidth must be"),
    ({"bandwidth": "abc"}, "bandwidth must be an array of numbers"),   # was a bare ValueError
])
def test_with_arrays_refuses_what_no_spec_can_hold(demo_spec, kwargs, named):
    # inf and 1e300 were taken, and to_spec then wrote a file that could not be read back
    c = Cluster.from_spec(demo_spec)
    (key, value), = kwargs.items()
    arr = value if isinstance(value, str) else np.full((len(c), len(c)), value)
    with pytest.raises(SpecError, match=named):
        c.with_arrays(**{key: arr})


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_random_arrays_save_and_load_exactly(demo_spec, tmp_path, suffix):
    # ~4 % of bandwidths (bytes/s) have no gbps figure that reads back to them, ~2 % of latencies
    # no latency_ms one: the file read back was another cluster by one float step
    rng = np.random.default_rng(1234)
    devices = [{"id": "d", "count": 48, "region": "r", "tflops": 10, "memory_gb": 8}]
    c = Cluster.from_spec({"name": "rand", "devices": devices,
                           "network": {"regions": {"r": {"gbps": 10, "latency_ms": 0.1}}}})
    n = len(c)
    bw = 10 ** rng.uniform(6, 12, (n, n))        # 1 MB/s to 1 TB/s, every float step likely
    lat = 10 ** rng.uniform(-6, 0, (n, n))
    bw[rng.random((n, n)) < 0.1] = 12.5 * GBPS  # some figures as a person writes them
    changed = c.with_arrays(bandwidth=bw, latency=lat)
    path = tmp_path / f"c{suffix}"
    changed.save(path)
    again = Cluster.from_file(path)
    assert np.array_equal(again.bandwidth, changed.bandwidth)
    assert np.array_equal(again.latency, changed.latency)
    assert again == changed
    overrides = changed.to_spec()["network"]["overrides"]
    assert len(overrides) == n * (n - 1)
    # the spec's own keys everywhere (a reader of DESIGN.md's format finds them), and the base units
    # beside them only where no figure reads back
    assert all("gbps" in o and "latency_ms" in o for o in overrides)
    base = [o for o in overrides if "bytes_per_s" in o]
    assert 0 < len(base) < 0.1 * len(overrides) and any("latency_s" in o for o in overrides)
    assert all(o["gbps"] * GBPS == pytest.approx(o["bytes_per_s"], rel=1e-12) for o in base)
    written = [o for o in overrides if bw[c.index(o["from"]), c.index(o["to"])] == 12.5 * GBPS]
    assert written and all(o["gbps"] == 12.5 for o in written)


def test_handwritten_overrides_load_and_save_as_written(demo_spec):
    # the spec is a contract: an override in gbps and latency_ms reads as before and is written back as given
    spec = json.loads(json.dumps(demo_spec))
    spec["network"]["overrides"].append({"from": "edge-0", "to": "end-0", "gbps": 0.3, "latency_ms": 7.1})
    c = Cluster.from_spec(spec)
    e, n = c.index("edge-0"), c.index("end-0")
    assert (c.bandwidth[e, n], c.latency[e, n]) == (0.3 * GBPS, 7.1 / 1e3)
    assert c.to_spec() == spec
    # the same figures in the base units read the same arrays
    spec["network"]["overrides"][-1] = {"from": "edge-0", "to": "end-0", "bytes_per_s": 0.3 * GBPS,
                                        "latency_s": 7.1 / 1e3}
    assert Cluster.from_spec(spec) == c
    # both, alike (as a saved spec gives them where the figure is rounded): the base unit's value counts
    exact = 0.3 * GBPS * (1 + 1e-15)
    spec["network"]["overrides"][-1] = {"from": "edge-0", "to": "end-0", "gbps": 0.3, "bytes_per_s": exact,
                                        "latency_ms": 7.1}
    assert Cluster.from_spec(spec).bandwidth[e, n] == exact


@pytest.mark.parametrize("link, message", [
    ({"gbps": 2, "bytes_per_s": 1.25e8, "latency_ms": 1}, "gbps 2 and bytes_per_s 125000000.0 are different values"),
    ({"bytes_per_s": 0, "latency_ms": 1}, "bytes_per_s must be a number from 1.25e-22 to 1.25e+38, got 0"),
    ({"gbps": 1, "latency_s": -1}, "latency_s must be a number from 0 to 1e+27, got -1"),
    ({"gbps": 1, "latency_s": "1"}, "latency_s must be a number from 0 to 1e+27, got '1'"),
    ({"latency_s": 1}, "missing required key 'gbps'"),
])
def test_override_in_base_units_is_checked(demo_spec, link, message):
    spec = json.loads(json.dumps(demo_spec))
    spec["network"]["overrides"] = [{"between": ["cloud-0", "cloud-1"], **link}]
    with pytest.raises(SpecError, match=re.escape(f"network.overrides[0]: {message}")):
        Cluster.from_spec(spec)


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_random_layer_times_save_and_load_exactly(tmp_path, suffix):
    # ~2.4 % of times in seconds have no forward_ms/backward_ms figure that reads back to them: the file
    # read back held other times by one float step
    from spantrain.cluster import LayerTimes
    rng = np.random.default_rng(4321)
    devices = [{"id": f"d{k}", "region": "r", "tflops": 10, "memory_gb": 8} for k in range(40)]
    c = Cluster.from_spec({"name": "rand", "devices": devices,
                           "network": {"regions": {"r": {"gbps": 10, "latency_ms": 0.1}}}})
    import dataclasses
    measured = []
    for d in c.devices:
        fwd, bwd = (tuple(float(t) for t in 10 ** rng.uniform(-5, np.log10(0.5), 12)) for _ in range(2))
        measured.append(dataclasses.replace(d, layer_times={"m": LayerTimes(batch=4, forward_s=fwd,
                                                                               backward_s=bwd)}))
    c = Cluster(name=c.name, devices=measured, network=c.network)
    path = tmp_path / f"c{suffix}"
    c.save(path)
    again = Cluster.from_file(path)
    assert again.devices == c.devices and again == c
    # milliseconds everywhere (the spec's own keys), seconds beside them only for the lists that need them
    entries = [d["layer_times"]["m"] for d in c.to_spec()["devices"]]
    in_s = sum("forward_s" in e for e in entries) + sum("backward_s" in e for e in entries)
    assert 0 < in_s < 2 * len(entries)
    assert all("forward_ms" in e and "backward_ms" in e for e in entries)


def test_handwritten_layer_times_load_and_save_as_written(demo_spec):
    # a spec written in ms reads the times it read before forward_s existed, and is written back as given
    spec = json.loads(json.dumps(demo_spec))
    spec["devices"][1]["layer_times"] = {"tiny-gpt": {"batch": 4, "forward_ms": [1.1, 2, 0.3],
                                                      "backward_ms": [2.2, 4, 0.6]}}
    c = Cluster.from_spec(spec)
    times = c.devices[c.index("edge-0")].layer_times["tiny-gpt"]
    assert times.forward_s == (1.1 / 1e3, 2 / 1e3, 0.3 / 1e3) and times.backward_s == (2.2 / 1e3, 4 / 1e3, 0.6 / 1e3)
    assert c.to_spec() == spec
    # seconds for either list read the same times
    spec["devices"][1]["layer_times"]["tiny-gpt"] = {"batch": 4, "forward_s": list(times.forward_s),
                                                     "backward_ms": [2.2, 4, 0.6]}
    assert Cluster.from_spec(spec) == c
    # both, alike (as a saved spec gives a list with a time no ms figure reads back to): the seconds count
    exact = [t * (1 + 1e-15) for t in times.forward_s]
    spec["devices"][1]["layer_times"]["tiny-gpt"]["forward_ms"] = [1.1, 2, 0.3]
    spec["devices"][1]["layer_times"]["tiny-gpt"]["forward_s"] = exact
    again = Cluster.from_spec(spec)
    assert again.devices[again.index("edge-0")].layer_times["tiny-gpt"].forward_s == tuple(exact)


@pytest.mark.parametrize("entry, message", [
    ({"forward_ms": [1], "forward_s": [0.002], "backward_ms": [1]}, "forward_ms and forward_s hold different times"),
    ({"forward_ms": [1], "forward_s": [0.001, 0], "backward_ms": [1]}, "forward_ms and forward_s hold different times"),
    ({"forward_ms": [1], "backward_s": [-1]}, "backward_s must be a non-empty list of numbers from 0 to 1e+27"),
    ({"forward_s": [1e28], "backward_ms": [1]}, "forward_s must be a non-empty list of numbers from 0 to 1e+27"),
    ({"forward_s": [1, 2], "backward_ms": [1]}, "forward_s and backward_ms have different lengths"),
    ({"forward_s": [0], "backward_s": [0]}, "every forward_s and backward_s is 0"),
    ({"forward_ms": [1]}, "missing required key 'backward_ms'"),
])
def test_layer_times_in_seconds_are_checked(demo_spec, entry, message):
    spec = json.loads(json.dumps(demo_spec))
    spec["devices"][1]["layer_times"] = {"m": {"batch": 1, **entry}}
    with pytest.raises(SpecError, match=re.escape(f"devices[1] (edge-0).layer_times[m]: {message}")):
        Cluster.from_spec(spec)
