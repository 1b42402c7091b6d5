"""Command-line contract: topo commands work; every bad input exits 2 with one line, no traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _one_line_error(code: int, out: str, err: str, needle: str) -> None:
    assert code == 2, (code, out, err)
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert needle in lines[0], lines[0]


def test_topo_generate_and_show(run_cli, tmp_path):
    spec = tmp_path / "c.yaml"
    code, _, err = run_cli("topo", "generate", "--devices", "12", "--seed", "0", "-o", spec)
    assert code == 0 and "12 devices" in err
    code, out, _ = run_cli("topo", "show", spec, "--plot", tmp_path / "c.png")
    assert code == 0 and "12 devices" in out and "links between regions" in out
    assert (tmp_path / "c.png").stat().st_size > 10_000
    code, out, _ = run_cli("topo", "show", spec, "--json")
    data = json.loads(out)
    assert code == 0 and data["devices"] == 12 and sum(r["devices"] for r in data["regions"]) == 12


def test_topo_show_takes_the_spec_as_the_other_commands_do(run_cli):
    # `topo show --cluster g.yaml`, as plan/simulate/compare take it, was an argparse error
    spec = ROOT / "examples" / "cee-demo.yaml"
    positional = run_cli("topo", "show", spec, "--json")
    for flag in ("--cluster", "-c"):
        assert run_cli("topo", "show", flag, spec, "--json") == positional
    assert positional[0] == 0 and json.loads(positional[1])["name"] == "cee-demo"
    _one_line_error(*run_cli("topo", "show", spec, "--cluster", spec), "give FILE or --cluster FILE, not both")
    _one_line_error(*run_cli("topo", "show", "--json"), "the cluster spec is missing")
    _one_line_error(*run_cli("topo", "show", ""), "an empty path")
    _one_line_error(*run_cli("topo", "show", "--cluster", ""), "an empty path")


def test_piped_topo_show_keeps_names_and_figures_whole(run_cli, monkeypatch):
    # piped, rich laid the tables out for 80 columns and cut GPU names short ("A100-8…")
    monkeypatch.delenv("COLUMNS", raising=False)
    code, out, _ = run_cli("topo", "show", ROOT / "examples" / "geo-24.yaml")
    assert code == 0 and "…" not in out
    assert "A100-80GB" in out


def test_small_figures_show_their_digits_not_zero(run_cli, tmp_path):
    # a profiled CPU's 0.047 TFLOP/s read "0 TFLOP/s"; tiny-gpt's iteration "0.000 s/iteration"
    spec = tmp_path / "cpu.yaml"
    spec.write_text(yaml.safe_dump({"name": "cpus", "devices": [{"id": "a", "count": 2, "region": "r", "tflops": 0.0475,
                                                                 "memory_gb": 8}],
                                    "network": {"regions": {"r": {"gbps": 1, "latency_ms": 1}}}}))
    code, out, _ = run_cli("topo", "show", spec)
    assert code == 0 and "0.095 TFLOP/s" in out, out
    # a region of one device has no LAN pair: its spec figure (a profile's placeholder) is not shown as one
    code, out, _ = run_cli("topo", "show", ROOT / "examples" / "cee-demo.yaml")
    # in the region table and on the link matrix's diagonal (which said 10 Gb/s there)
    assert code == 0 and out.count("- (one device)") == 4, out
    cluster, plan = ROOT / "examples" / "cee-demo.yaml", tmp_path / "plan.json"
    assert run_cli("plan", "--cluster", cluster, "--model", "tiny-gpt", "--planner", "heuristic", "-o", plan)[0] == 0
    code, out, _ = run_cli("simulate", "--cluster", cluster, "--model", "tiny-gpt", "--plan", plan)
    period = next(line for line in out.splitlines() if "pipeline 0:" in line)
    assert code == 0 and "e-05 s/iteration" in period and " 0.00 " not in out, out
    from spantrain._spec import readable

    assert [readable(x) for x in (1283.4, 2400.0, 99.5, 7.398e-05)] == ["1,283", "2,400", "99.5", "7.4e-05"]
    # a spec's absurd figures: not "2,000,000,000,000,000,039,769,249,677,312"
    assert readable(2e33) == "2e+33"
    from spantrain.estimate import fmt_memory

    assert (fmt_memory(1e30), fmt_memory(40e9), fmt_memory(1.2e6)) == ("1e+21 GB", "40.0 GB", "1.2 MB")


def test_topo_generate_to_stdout_is_a_spec(run_cli):
    code, out, _ = run_cli("topo", "generate", "--devices", "5", "--profile", "geo")
    assert code == 0 and len(yaml.safe_load(out)["devices"]) >= 2


def _write(tmp_path, spec) -> str:
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(spec))
    return str(p)


@pytest.mark.parametrize("mutate, needle", [
    (lambda s: s["devices"][1].update(speed=3), "unknown key 'speed'"),
    (lambda s: s["devices"][1].update(region="mars"), "unknown region 'mars'"),
    (lambda s: s["devices"][1].update(tflops=-3), "tflops must be a positive number"),
    (lambda s: s["devices"][1].update(memory_gb="lots"), "memory_gb must be a positive number, got 'lots'"),
    (lambda s: s["network"]["regions"]["edge-b"].update(gbps=0), "gbps must be a positive number"),
    (lambda s: s["network"]["links"][0].update(latency_ms="far"), "latency_ms must be a number >= 0"),
    (lambda s: s["devices"][2].update(id="edge-0"), "duplicate device id 'edge-0'"),
    (lambda s: s.update(devices=[]), "the cluster is empty"),
])
def test_bad_spec_inputs_exit_2_with_one_line(run_cli, tmp_path, demo_spec, mutate, needle):
    mutate(demo_spec)
    code, out, err = run_cli("topo", "show", _write(tmp_path, demo_spec))
    _one_line_error(code, out, err, needle)


def test_missing_file_and_syntax_errors(run_cli, tmp_path):
    code, out, err = run_cli("topo", "show", tmp_path / "nope.yaml")
    _one_line_error(code, out, err, "file not found")
    bad = tmp_path / "bad.yaml"
    bad.write_text("devices: [{id: a, region: r\nnetwork: {")
    code, out, err = run_cli("topo", "show", bad)
    _one_line_error(code, out, err, "YAML syntax error")
    badj = tmp_path / "bad.json"
    badj.write_text('{"devices": [}')
    code, out, err = run_cli("topo", "show", badj)
    _one_line_error(code, out, err, "JSON syntax error")


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_file_nested_too_deeply_is_a_one_line_error(run_cli, tmp_path, suffix):
    # both parsers recurse per level: a RecursionError traceback
    deep = tmp_path / f"deep{suffix}"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    code, out, err = run_cli("topo", "show", deep)
    _one_line_error(code, out, err, f"{deep}: nested too deeply to read")


@pytest.mark.parametrize("suffix, number", [(".yaml", "1" + "0" * 5000), (".json", "1" + "0" * 5000),
                                            (".yaml", "1" + "0" * 400), (".yaml", "0x" + "f" * 5000)])
def test_an_integer_past_any_float_is_a_one_line_error(run_cli, tmp_path, suffix, number):
    # Python converts at most 4,300 decimal digits to an int (a ValueError traceback), YAML's hex
    # ints have no limit (reprlib's ValueError), and past 309 digits math.isfinite raised OverflowError
    big = tmp_path / f"big{suffix}"
    big.write_text('{"devices": [{"id": "a", "count": ' + number + "}]}")
    code, out, err = run_cli("topo", "show", big)
    _one_line_error(code, out, err, f"{big}: holds an integer beyond the largest float (about 1.8e308)")


def test_a_bad_value_is_shown_cut_short(run_cli, tmp_path):
    # 490 bytes of nested YAML aliases expand to 10^6 items: the message was 7 MB, and nested
    # deeper, its repr took gigabytes and minutes
    lines = ["name: t", "zz:", "  x0: &a0 [" + ", ".join(["lol"] * 10) + "]"]
    lines += [f"  x{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    lines += ["devices:", "  - {id: a, region: r1, tier: cloud, gpu: A100-40GB, tflops: *a8, memory_gb: 40}",
              "network: {regions: {r1: {gbps: 100, latency_ms: 0.02}}}"]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines))
    code, out, err = run_cli("topo", "show", bomb)
    _one_line_error(code, out, err, "tflops must be a positive number, got [[...], [...], [...], [...], ...]")
    assert len(err) < 400


def test_a_newline_in_a_path_or_id_stays_on_the_one_line(run_cli, tmp_path):
    code, out, err = run_cli("topo", "show", tmp_path / "a\nb.yaml")
    _one_line_error(code, out, err, "a\\nb.yaml: file not found")
    spec = tmp_path / "c.yaml"
    spec.write_text('devices: [{id: "a\\nb", region: r, tflops: 1, memory_gb: -1}]\nnetwork: {regions: {r: {gbps: 1, '
                    'latency_ms: 1}}}')
    code, out, err = run_cli("topo", "show", spec)
    _one_line_error(code, out, err, "memory_gb")


def test_bad_arguments(run_cli):
    code, out, err = run_cli("topo", "generate", "--devices", "1")
    _one_line_error(code, out, err, "from 2 to 4096")
    code, out, err = run_cli("topo", "generate", "--devices", "many")
    _one_line_error(code, out, err, "invalid int value")


@pytest.mark.parametrize("name", ["", "  "])
def test_an_empty_cluster_name_is_refused(run_cli, name):
    # "" fell back to the default name unsaid, "  " was written as the name
    code, out, err = run_cli("topo", "generate", "--devices", "4", "--name", name)
    _one_line_error(code, out, err, f"--name {name!r} is empty: give the cluster a name, or leave --name out")


@pytest.mark.parametrize("command", [("plan",), ("run",), ("compare",)])
def test_the_planner_options_name_the_planners(run_cli, command):
    # "see spantrain compare", whose help named none either
    code, out, _ = run_cli(*command, "--help")
    assert code == 0 and "heuristic, ddp, gpipe, megatron, ga, exhaustive, ppo, auto" in " ".join(out.split())


def test_an_unknown_option_is_named_by_its_command_with_the_nearest_one(run_cli):
    # it was `spantrain: error: ... (see spantrain --help)`, whose help lists no command's options
    code, out, err = run_cli("plan", "--cluster", "c.yaml", "--model", "tiny-gpt", "--planners", "heuristic")
    assert err == "spantrain plan: error: unrecognized arguments: --planners heuristic (did you mean --planner?) " \
                  "(see spantrain plan --help)\n" and code == 2 and out == ""
    code, _, err = run_cli("topo", "show", "c.yaml", "--bogus")
    assert err == "spantrain topo show: error: unrecognized arguments: --bogus (see spantrain topo show --help)\n"
    assert run_cli("--bogus")[2] == "spantrain: error: unrecognized arguments: --bogus (see spantrain --help)\n"
    # an option hidden from --help (profile's, for its own children) is not offered
    assert "did you mean" not in run_cli("profile", "--deadlines", "3")[2]


def test_unwritable_output_path_is_a_one_line_error(run_cli, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    code, out, err = run_cli("topo", "generate", "--devices", "4", "-o", afile / "c.yaml")
    _one_line_error(code, out, err, f"-o {afile / 'c.yaml'}: '{afile}' is not a directory")
    code, out, err = run_cli("topo", "generate", "--devices", "4", "-o", tmp_path)
    _one_line_error(code, out, err, f"-o {tmp_path}: is a directory; give a file name")
    code, out, err = run_cli("topo", "generate", "--devices", "4", "-o", ".")
    _one_line_error(code, out, err, "-o .: is a directory; give a file name")
    # a directory no file can be created in: it failed after generating, "No such file or directory"
    code, out, err = run_cli("topo", "generate", "--devices", "4", "-o", "/proc/x.yaml")
    _one_line_error(code, out, err, "-o /proc/x.yaml: cannot create a file in '/proc' (")
    assert "pass a path in a directory this user can write" in err, err


def test_an_output_path_gone_by_the_time_it_is_written_is_a_one_line_error(run_cli, tmp_path, monkeypatch):
    # -o is checked before the work; its directory may go meanwhile: the save's own error is the line
    import spantrain.cli.plan
    import spantrain.cli.topo

    for module in (spantrain.cli.topo, spantrain.cli.plan):
        monkeypatch.setattr(module, "check_output_file", lambda *a, **k: None)
    out = tmp_path / "gone" / "c.yaml"
    code, stdout, err = run_cli("topo", "generate", "--devices", "4", "-o", out)
    _one_line_error(code, stdout, err, f"spantrain topo: error: cannot save the cluster spec to {out}: its directory "
                                       f"{out.parent} does not exist; create it first")
    code, stdout, err = run_cli("plan", "--cluster", ROOT / "examples" / "cee-demo.yaml", "--model", "tiny-gpt",
                                "--planner", "heuristic", "-o", tmp_path)
    _one_line_error(code, stdout, err, f"spantrain plan: error: cannot save the plan to {tmp_path}: it is a directory")


def test_notes_and_warnings_name_the_command_that_says_them(run_cli, capsys, monkeypatch):
    # code shared by commands said "spantrain: note:", "train-policy: note:" or "spantrain: warning:",
    # where the command's own lines say "spantrain plan: note:"
    from spantrain._say import note, saying_as, warn
    from spantrain.experiments._args import run_script
    from spantrain.policies import ppo

    note("as a library")
    with saying_as("spantrain plan"):
        note("within a command")
        warn("gone wrong")
    note("after it")
    assert capsys.readouterr().err.splitlines() == ["spantrain: note: as a library",
                                                    "spantrain plan: note: within a command",
                                                    "spantrain plan: warning: gone wrong", "spantrain: note: after it"]
    monkeypatch.setattr(ppo, "MAX_POLICY_DEVICES", 2)
    code, _, err = run_cli("plan", "--cluster", ROOT / "examples" / "cee-demo.yaml", "--model", "tiny-gpt")
    assert code == 0 and "spantrain plan: note: 6 devices, more than the policy plans (2): " in err, err
    assert run_script(lambda: note("from a script") or 0, "calibrate") == 0
    assert capsys.readouterr().err == "calibrate: note: from a script\n"  # as its errors: "calibrate: error:"


def test_output_into_a_pipe_or_symlink_writes_what_it_names(run_cli, tmp_path):
    # -o renamed a new file over the path: a FIFO (as /dev/null, /dev/stdout) became a regular
    # file, which for root running `-o /dev/null` replaced the device; a symlink lost its target
    import os
    import stat

    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        code, _, err = run_cli("topo", "generate", "--devices", "4", "-o", fifo)
        assert code == 0, err
        assert stat.S_ISFIFO(fifo.lstat().st_mode)
        assert yaml.safe_load(os.read(reader, 1 << 16))["name"] == "cee-4-s0"
    finally:
        os.close(reader)
    target, link = tmp_path / "real.yaml", tmp_path / "link.yaml"
    target.write_text("old")
    link.symlink_to(target.name)
    code, _, err = run_cli("topo", "generate", "--devices", "4", "-o", link)
    assert code == 0, err
    assert link.is_symlink() and yaml.safe_load(target.read_text())["name"] == "cee-4-s0"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo.yaml", "link.yaml", "real.yaml"]


def test_output_into_a_device_is_not_probed(run_cli, monkeypatch):
    # -o /dev/null is written into as it is: whether a new file could be made beside it does not matter
    import tempfile

    def no_new_files(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "TemporaryFile", no_new_files)
    code, out, err = run_cli("topo", "generate", "--devices", "4", "-o", "/dev/null")
    assert code == 0 and out == "", err


def test_non_utf8_inputs_are_one_line_errors(run_cli, tmp_path, demo_spec):
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00x")
    cluster = _write(tmp_path, demo_spec)
    plan = ROOT / "examples" / "plan-cee-demo.json"
    for args in (["topo", "show", binary],
                 ["plan", "-c", cluster, "-m", binary],
                 ["plan", "-c", cluster, "-m", "gpt2-medium", "--from", binary],
                 ["simulate", "-c", cluster, "-m", "gpt2-medium", "-p", binary],
                 ["simulate", "-c", cluster, "-m", "gpt2-medium", "-p", plan, "--calibration", binary]):
        code, out, err = run_cli(*args)
        _one_line_error(code, out, err, f"{binary}: not a UTF-8 text file")


def test_bad_plot_paths_are_refused_before_any_work(run_cli, tmp_path):
    missing = tmp_path / "nope.yaml"  # never read: the path is checked first
    code, out, err = run_cli("topo", "show", missing, "--plot", tmp_path / "out.txt")
    _one_line_error(code, out, err, "--plot")
    assert "format '.txt' is not supported; give a file name ending in .png, .pdf, .svg" in err
    code, out, err = run_cli("topo", "show", missing, "--plot", tmp_path)
    _one_line_error(code, out, err, f"--plot {tmp_path}: is a directory")
    code, out, err = run_cli("topo", "show", missing, "--plot", tmp_path / "sub" / "c.png")
    _one_line_error(code, out, err, f"'{tmp_path / 'sub'}' does not exist (create it first)")
    assert list(tmp_path.iterdir()) == []  # neither DIR.png nor the missing parent was made


def test_plot_of_devices_without_a_gpu_label_is_clean(run_cli, tmp_path, demo_spec):
    # gpu is optional: the plot's legend got an empty label, and matplotlib warned on stderr
    import warnings

    for device in demo_spec["devices"]:
        del device["gpu"]
    png = tmp_path / "c.png"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code, _, err = run_cli("topo", "show", _write(tmp_path, demo_spec), "--plot", png)
    assert code == 0 and err == "" and png.stat().st_size > 10_000


def test_counts_of_one_are_singular(run_cli, tmp_path):
    # a 1-device spec read "1 devices in 1 regions"
    spec = {"name": "solo", "devices": [{"id": "gpu", "region": "r", "tflops": 10, "memory_gb": 8}],
            "network": {"regions": {"r": {"gbps": 10, "latency_ms": 0.1}}}}
    code, out, _ = run_cli("topo", "show", _write(tmp_path, spec))
    assert code == 0 and "solo: 1 device in 1 region," in out


def test_real_process_prints_no_traceback(tmp_path):
    result = subprocess.run([sys.executable, "-m", "spantrain", "topo", "show", str(tmp_path / "x.yaml")],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1


def test_tables_into_a_closed_pipe_exit_0_like_json(tmp_path):
    # `spantrain topo show C | head`: rich's broken-pipe handler ended the command with exit
    # code 1, where the CLI ends a command on a closed pipe with 0 (as --json output does)
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first row
    try:
        result = subprocess.run([sys.executable, "-m", "spantrain", "topo", "show",
                                 str(ROOT / "examples" / "cee-demo.yaml")],
                                stdout=write_end, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (0, "")


@pytest.mark.parametrize("stdout", ["a full disk", "closed"])
def test_stdout_that_cannot_be_written_is_a_one_line_error(stdout):
    # was a traceback: "OSError: [Errno 28] No space left on device" from print_json, or with
    # stdout closed "AttributeError: 'NoneType' object has no attribute 'write'"
    cmd = [sys.executable, "-m", "spantrain", "plan", "-c", str(ROOT / "examples" / "cee-demo.yaml"), "-m",
           "tiny-gpt", "--planner", "ddp", "--json"]
    if stdout == "closed":
        result = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, close_fds=True,
                                preexec_fn=lambda: os.close(1))
        want = (2, "spantrain: error: stdout is closed; redirect it to a file or to /dev/null instead\n")
    else:
        with open("/dev/full", "w") as full:
            result = subprocess.run(cmd, stdout=full, stderr=subprocess.PIPE, text=True)
        want = (1, "spantrain plan: error: could not write the output: No space left on device\n")
    assert (result.returncode, result.stderr) == want


def test_plan_refuses_to_write_over_a_file_it_reads(run_cli, tmp_path):
    spec = tmp_path / "cluster.yaml"
    spec.write_text((ROOT / "examples" / "cee-demo.yaml").read_text())
    before = spec.read_text()
    code, _, err = run_cli("plan", "-c", spec, "-m", "tiny-gpt", "--planner", "ddp", "-o", tmp_path / "." / spec.name)
    assert code == 2 and err == (f"spantrain plan: error: -o {tmp_path / '.' / spec.name}: is the file --cluster "
                                 "reads; write the output to another file\n")
    assert spec.read_text() == before


def test_stderr_whose_reader_left_goes_quiet_instead_of_ending_the_command():
    from spantrain._say import stderr_reader_may_leave

    read_end, write_end = os.pipe()
    os.close(read_end)
    stream = os.fdopen(write_end, "w", buffering=1)
    real = sys.stderr
    sys.stderr = stream
    try:
        with stderr_reader_may_leave():
            for _ in range(3):  # a progress bar's refreshes, then the command's last line
                print("train-policy: 12%|#", file=sys.stderr, flush=True)
            guarded = sys.stderr
        assert sys.stderr is stream and guarded is not stream
    finally:
        sys.stderr = real
        stream.close()  # its buffer flushes into /dev/null now: no error


ROOT = Path(__file__).resolve().parents[2]
CONSOLE_SCRIPT = Path(sys.executable).parent / "spantrain"


def _default_sigint() -> None:
    """`preexec_fn`: a suite started as a background job passes SIGINT ignored to its children."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["module", "console-script"])
def test_ctrl_c_during_start_up_exits_130_without_a_traceback(entry):
    """Ctrl-C while `spantrain` still imports its modules (numpy, the command modules, then
    what plan itself imports): one line and exit code 130, at whatever moment it comes."""
    if entry == "console-script" and not CONSOLE_SCRIPT.exists():
        pytest.skip(f"no console script at {CONSOLE_SCRIPT}")
    start = [sys.executable, "-m", "spantrain"] if entry == "module" else [str(CONSOLE_SCRIPT)]
    # plan takes about a second here, so every delay interrupts it before it is done
    command = [*start, "plan", "--cluster", str(ROOT / "examples" / "cee-demo.yaml"), "--model", "tiny-gpt",
               "--planner", "heuristic"]
    # from 0.05 s: the interpreter's own start (~20 ms here, longer with an editable install's
    # .pth finder) is out of spantrain's reach
    for delay in (0.05, 0.07, 0.09, 0.11, 0.14, 0.17, 0.2, 0.25, 0.3, 0.4):
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=_default_sigint)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        # killed before the interpreter installed its handler: silent, and 130 to a shell
        if proc.returncode == -signal.SIGINT and out == err == "":
            continue
        # on a loaded machine the signal can land in the interpreter's own start (site, an
        # editable install's finder in the venv), before any of spantrain's code runs
        frames = [x.strip() for x in err.splitlines() if x.strip().startswith('File "')]
        ours = [x for x in frames if x.startswith(f'File "{ROOT}') and not x.startswith(f'File "{sys.prefix}')]
        if err.rstrip().endswith("KeyboardInterrupt") and not ours:
            continue
        assert proc.returncode == 130 and "Traceback" not in err, f"after {delay} s: {err}"
        assert len(err.splitlines()) == 1 and "interrupted" in err, f"after {delay} s: {err}"


def test_generated_flags_show_defaults_as_they_are_typed(run_cli):
    # a tuple default read "(default: ('gpt2-medium', ...))" beside the metavar A,B,...; a None one
    # "(default: None)" after a help text naming the real default (~/.cache/spantrain/starts)
    code, out, _ = run_cli("train-policy", "--help")
    text = " ".join(out.split())
    assert code == 0 and "(default: None)" not in text
    assert "(default: gpt2-medium,gpt2-xl,llama2-7b)" in text and "(default: 25000)" in text


@pytest.mark.parametrize("command", [("topo", "generate"), ("profile",)])
def test_spec_output_help_says_how_the_format_is_picked(run_cli, tmp_path, command):
    # the help said "(.yaml or .json)", yet any other name is written (and read back) as YAML
    code, out, _ = run_cli(*command, "--help")
    assert code == 0 and "JSON if FILE ends in .json, else YAML" in " ".join(out.split())
    if command == ("topo", "generate"):
        spec = tmp_path / "c.txt"
        assert run_cli("topo", "generate", "--devices", "4", "-o", spec)[0] == 0
        assert yaml.safe_load(spec.read_text())["name"] == "cee-4-s0"
        assert run_cli("topo", "show", spec, "--json")[0] == 0


def test_ctrl_c_while_an_output_is_written_leaves_no_temporary_file(tmp_path):
    # topo quits on Ctrl-C with os._exit, which runs no `finally`: a Ctrl-C while -o was being
    # written left .c.yaml.PID.tmp beside it. Here the Ctrl-C comes as the temporary file is written.
    script = ("import os, pathlib, signal, sys\n"
              "from spantrain.__main__ import run\n"
              "write = pathlib.Path.write_text\n"
              "def interrupted(self, *a, **k):\n"
              "    n = write(self, *a, **k)\n"
              "    os.kill(os.getpid(), signal.SIGINT)\n"
              "    return n\n"
              "pathlib.Path.write_text = interrupted\n"
              "sys.argv[1:] = ['topo', 'generate', '--devices', '4', '-o', sys.argv[1]]\n"
              "raise SystemExit(run())\n")
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "c.yaml")], capture_output=True,
                            text=True, preexec_fn=_default_sigint, timeout=120)
    assert result.returncode == 130 and "interrupted" in result.stderr, result.stderr
    assert [p.name for p in tmp_path.iterdir() if p.name != "c.yaml"] == []
    assert yaml.safe_load((tmp_path / "c.yaml").read_text())["name"] == "cee-4-s0"  # whole: Ctrl-C waited


@pytest.mark.parametrize("argv", [["topo", "generate", "--devices", "4"],
                                  # a command that handles Ctrl-C itself (train-policy had shipped its policy)
                                  ["run", "--cluster", "missing.yaml", "--model", "tiny-gpt", "--planner", "heuristic",
                                   "--steps", "1"]])
def test_ctrl_c_as_a_finished_command_exits_keeps_its_exit_code(argv):
    # a command that had printed everything was reported as interrupted (130, no line: the
    # interpreter's shutdown restores the default handler)
    script = ("import os, signal, sys\n"
              "from spantrain.__main__ import run\n"
              f"sys.argv[1:] = {argv!r}\n"
              "code = run()\n"
              "os.kill(os.getpid(), signal.SIGINT)\n"
              "raise SystemExit(code)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            preexec_fn=_default_sigint, timeout=120)
    if argv[0] == "topo":
        assert result.returncode == 0 and result.stderr == "", result.stderr
        assert yaml.safe_load(result.stdout)["name"] == "cee-4-s0"
    else:
        assert result.returncode == 2 and result.stderr.startswith("spantrain run: error: missing.yaml"), result.stderr
        assert len(result.stderr.splitlines()) == 1, result.stderr


@pytest.mark.parametrize("quiet", [False, True])
def test_a_child_whose_parent_reports_ctrl_c_exits_130_without_its_own_line(run_cli, monkeypatch, quiet):
    # profile's per-device children each printed "[dev] spantrain profile: interrupted" under the parent's line
    from spantrain._interrupt import QUIET_INTERRUPT_ENV
    from spantrain.cli import compare

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(compare, "run", interrupted)
    if quiet:
        monkeypatch.setenv(QUIET_INTERRUPT_ENV, "1")
    code, _, err = run_cli("compare", "--cluster", ROOT / "examples" / "cee-demo.yaml", "--model", "tiny-gpt")
    assert code == 130 and err == ("" if quiet else "spantrain compare: interrupted\n")


def test_a_profile_device_child_ends_at_once_on_ctrl_c(tmp_path):
    # its KeyboardInterrupt, raised inside torch's C++ callbacks, aborted the device ("terminate called
    # after throwing an instance of 'pybind11::error_already_set'") on the parent's output
    script = ("import os, pathlib, signal, sys, time\n"
              "from spantrain.cli import profile\n"
              "def measuring(args):\n"
              "    try:\n"
              "        os.kill(os.getpid(), signal.SIGINT)\n"
              "        time.sleep(5)\n"
              "    except KeyboardInterrupt:\n"
              f"        pathlib.Path({str(tmp_path / 'raised')!r}).touch()\n"
              "        raise\n"
              "profile.run = measuring\n"
              "from spantrain.__main__ import run\n"
              "sys.argv[1:] = ['profile', '--model', 'tiny-gpt']\n"
              "raise SystemExit(run())\n")
    env = {**os.environ, "SPANTRAIN_QUIET_INTERRUPT": "1"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                            preexec_fn=_default_sigint, timeout=120)
    assert result.returncode == 130 and result.stderr == "", result.stderr
    assert not (tmp_path / "raised").exists()  # ended where it was, no exception raised through it


def test_errors_are_one_write_and_other_ranks_say_which_they_are(monkeypatch, capsys):
    # under torchrun every process printed the same error, and print's separate newline let
    # two processes' lines run into each other ("...start anewspantrain run: error: ...")
    from spantrain.cli import main

    writes = []
    real_write = sys.stderr.write
    monkeypatch.setattr(sys.stderr, "write", lambda text: writes.append(text) or real_write(text))
    assert main(["topo", "show", "/nonexistent.yaml"]) == 2
    assert len(writes) == 1 and writes[0].startswith("spantrain topo: error: ") and writes[0].endswith("\n")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    writes.clear()
    assert main(["topo", "show", "/nonexistent.yaml"]) == 2
    assert len(writes) == 1 and writes[0].startswith("[rank 3] spantrain topo: error: ")
    monkeypatch.setenv("RANK", "0")  # rank 0 speaks as a single process does
    writes.clear()
    assert main(["topo", "show", "/nonexistent.yaml"]) == 2
    assert writes[0].startswith("spantrain topo: error: ")


def test_torchrun_processes_on_a_host_say_the_same_error_once(monkeypatch, tmp_path, capsys):
    # every rank validates the same spec and plan: 8 processes on a host printed 8 equal lines
    from spantrain.cli import main

    def torchrun_process(attempt: int, local_rank: int) -> None:
        error_file = tmp_path / "run-id" / f"attempt_{attempt}" / str(local_rank) / "error.json"
        error_file.parent.mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
        monkeypatch.setenv("RANK", str(local_rank))
        monkeypatch.setenv("WORLD_SIZE", "4")

    said = []
    for attempt, local_rank, spec in [(0, 0, "/missing.yaml"), (0, 1, "/missing.yaml"), (0, 2, "/missing.yaml"),
                                      (0, 3, "/other.yaml"), (1, 1, "/missing.yaml")]:
        torchrun_process(attempt, local_rank)
        assert main(["topo", "show", spec]) == 2  # every process still fails
        said.append(capsys.readouterr().err)
    assert said[0].startswith("spantrain topo: error: ") and "/missing.yaml" in said[0]
    assert said[1] == said[2] == ""
    assert said[3].startswith("[rank 3] spantrain topo: error: ") and "/other.yaml" in said[3]
    assert said[4].startswith("[rank 1] spantrain topo: error: ")  # a restarted attempt says it again


@pytest.mark.parametrize("args", [["topo", "generate", "--devices", "4", "-o", ""], ["topo", "show", ""],
                                  ["plan", "-c", "C", "-m", "tiny-gpt", "-o", ""],
                                  ["run", "-c", "C", "-m", "tiny-gpt", "--planner", "heuristic", "--run-dir", ""]])
def test_an_empty_path_is_refused(run_cli, args):
    # `-o ""` (an unset shell variable) wrote nothing and said nothing: topo generate printed the spec
    args = [str(ROOT / "examples" / "cee-demo.yaml") if a == "C" else a for a in args]
    code, out, err = run_cli(*args)
    # it said "give a file or directory name" for either kind
    kind = "directory" if "--run-dir" in args else "file"
    _one_line_error(code, out, err, f": an empty path: give a {kind} name")


def test_with_torchrun_redirects_every_rank_log_keeps_its_error(tmp_path):
    # torchrun --redirects/--tee gives each rank its own log beside its error file: the line a
    # rank shares with another local rank was missing from the log of the one that said it second
    attempt = tmp_path / "run-id" / "attempt_0"
    for rank in (0, 1):
        (attempt / str(rank)).mkdir(parents=True)
        with open(attempt / str(rank) / "stderr.log", "w") as log:
            env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(attempt / str(rank) / "error.json"),
                   "RANK": str(rank), "WORLD_SIZE": "2"}
            subprocess.run([sys.executable, "-c", "from spantrain._say import say; say('spantrain run: error: x')"],
                           stderr=log, env=env, check=True, timeout=60)
    assert (attempt / "0" / "stderr.log").read_text() == "spantrain run: error: x\n"
    assert (attempt / "1" / "stderr.log").read_text() == "[rank 1] spantrain run: error: x\n"


@pytest.mark.parametrize("args, message", [
    (("plan", "--cluster", "cee-demo.yaml", "--model", "cee-demo.yaml"),
     "spantrain plan: error: {ex}/cee-demo.yaml: looks like a cluster spec (it has devices and network), not a "
     "workload file: pass it as the cluster (--cluster)"),
    (("plan", "--cluster", "tiny-custom.yaml", "--model", "tiny-gpt"),
     "spantrain plan: error: {ex}/tiny-custom.yaml: looks like a workload file (it has architecture), not a "
     "cluster spec: pass it as the model (--model)"),
    (("simulate", "--cluster", "cee-demo.yaml", "--model", "tiny-gpt", "--plan", "cee-demo.yaml"),
     "spantrain simulate: error: {ex}/cee-demo.yaml: looks like a cluster spec (it has devices and network), not a "
     "plan: pass it as the cluster (--cluster)"),
    # a calibration profile listed its constants as unknown keys, and a spec given as one a dozen
    (("plan", "--cluster", "cee-demo.yaml", "--model", "calibration/emulated-cpu.yaml"),
     "spantrain plan: error: {ex}/calibration/emulated-cpu.yaml: looks like a calibration profile (it has "
     "sync_overlap and grad_bytes_per_param), not a workload file: pass it as the cost-model constants "
     "(--calibration)"),
    (("plan", "--cluster", "cee-demo.yaml", "--model", "tiny-gpt", "--calibration", "cee-demo.yaml"),
     "spantrain plan: error: --calibration {ex}/cee-demo.yaml: looks like a cluster spec (it has devices and "
     "network), not a calibration profile: pass it as the cluster (--cluster)"),
    (("topo", "show", "plan-cee-demo.json"),
     "spantrain topo: error: {ex}/plan-cee-demo.json: looks like a plan (it has pipelines), not a cluster spec: "
     "pass it as the plan (--plan, or plan --from)"),
])
def test_a_file_of_another_kind_is_named_in_one_line(run_cli, args, message):
    # a cluster spec given as --model listed one unknown key per key of it
    ex = ROOT / "examples"
    code, _, err = run_cli(*[str(ex / a) if a.endswith((".yaml", ".json")) else a for a in args])
    assert code == 2 and err.strip() == message.format(ex=ex), err


@pytest.mark.parametrize("flag", ["--cluster", "--plan"])
def test_a_workload_missing_a_required_key_given_as_another_file_is_named(run_cli, tmp_path, flag):
    # without its global_batch it was not known as a workload: each key an unknown key of a spec or plan
    model = tmp_path / "mine.yaml"
    model.write_text("seq_len: 32\nlayers:\n  - {name: a, forward_flops: 1.0e+9, params: 10, boundary_bytes: 10, "
                     "activation_bytes: 10}\n")
    args = {"--cluster": ("plan", "--cluster", model, "--model", "tiny-gpt"),
            "--plan": ("simulate", "--cluster", ROOT / "examples" / "cee-demo.yaml", "--model", "tiny-gpt",
                       "--plan", model)}[flag]
    kind = {"--cluster": "cluster spec", "--plan": "plan"}[flag]
    code, _, err = run_cli(*args)
    assert code == 2 and err.strip() == (f"spantrain {args[0]}: error: {model}: looks like a workload file (it has "
                                         f"layers and seq_len), not a {kind}: pass it as the model (--model)"), err


def _named_inputs(tmp_path, model: str, cluster: str, device: str, region: str):
    """A one-layer-kind workload and a one-device cluster under the given names (YAML scalars), and
    where a plan of them goes."""
    model_file = tmp_path / "m.yaml"
    model_file.write_text(f"name: {model}\nglobal_batch: 4\nseq_len: 8\nlayers:\n  - {{name: a, count: 2, "
                          "forward_flops: 1.0e+9, params: 10, boundary_bytes: 10, activation_bytes: 10}\n")
    cluster_file = tmp_path / "c.yaml"
    cluster_file.write_text(f"name: {cluster}\ndevices:\n  - {{id: {device}, region: {region}, tflops: 10, "
                            f"memory_gb: 16}}\nnetwork:\n  regions: {{{region}: {{gbps: 10, latency_ms: 0.1}}}}\n")
    return model_file, cluster_file, tmp_path / "p.json"


def test_names_with_square_brackets_are_shown_as_written(run_cli, tmp_path):
    # a model, cluster or device named 'x[/]y' was read as rich markup: a MarkupError's traceback,
    # and '[red]gpt' lost its brackets
    model, cluster, plan = _named_inputs(tmp_path, "'[red]gpt[/]x'", "'c[/]'", "'gpu[/]0'", "'r[/]'")
    code, out, err = run_cli("plan", "-c", cluster, "-m", model, "--planner", "heuristic", "-o", plan)
    assert code == 0 and "heuristic plan for [red]gpt[/]x on c[/] (1 device, 1 used)" in out, err
    assert "gpu[/]0" in out and "r[/]" in out
    code, out, err = run_cli("simulate", "-c", cluster, "-m", model, "-p", plan)
    assert code == 0 and "gpu[/]0" in out, err
    code, out, err = run_cli("compare", "-c", cluster, "-m", model, "--planners", "heuristic,ddp")
    assert code == 0 and out.startswith("[red]gpt[/]x on c[/] (1 device)"), err
    code, out, err = run_cli("topo", "show", cluster)
    assert code == 0 and "r[/]" in out, err


def test_names_with_dollar_signs_are_drawn_as_written(run_cli, tmp_path):
    # matplotlib read '$...$' in a name as math: a ParseException's traceback when the figure was saved
    model, cluster, plan = _named_inputs(tmp_path, "'m$\\bad{$x'", "'c$_$'", "'g$0$\\'", "'r$^$'")
    code, _, err = run_cli("plan", "-c", cluster, "-m", model, "--planner", "heuristic", "-o", plan)
    assert code == 0, err
    code, _, err = run_cli("simulate", "-c", cluster, "-m", model, "-p", plan, "--timeline", tmp_path / "t.png")
    assert code == 0 and (tmp_path / "t.png").stat().st_size > 0, err
    code, _, err = run_cli("topo", "show", cluster, "--plot", tmp_path / "c.png")
    assert code == 0 and (tmp_path / "c.png").stat().st_size > 0, err
