"""The CUDA/NCCL path, on a machine without a GPU: torch's CUDA and NCCL entry points are faked,
so what is checked is spantrain's side of it (which device, which backend, when to synchronize)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from runtime_helpers import ASYMMETRIC, plan, spantrain_here, write_inputs

from spantrain.errors import ExecutionError
from spantrain.runtime import transport as transport_module
from spantrain.runtime.transport import DEVICE_ENV, Transport, choose_backend


@pytest.fixture
def gpus(monkeypatch):
    """A machine with `n` GPUs and NCCL (set `gpus(n)`); `set_device` calls are recorded."""
    state = {"set": []}

    def have(n: int) -> dict:
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "set_device", lambda d: state["set"].append(d))
        monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
        for var in ("SPANTRAIN_EMULATION", DEVICE_ENV, "CUDA_VISIBLE_DEVICES"):
            monkeypatch.delenv(var, raising=False)
        return state

    return have


def test_each_worker_gets_its_own_gpu_and_nccl(gpus):
    state = gpus(4)
    assert choose_backend(2, 4) == ("nccl", torch.device("cuda", 2))
    assert state["set"] == [torch.device("cuda", 2)]


def test_more_torchrun_processes_than_gpus_is_one_line_naming_the_fix(gpus, monkeypatch):
    gpus(2)
    with pytest.raises(ExecutionError, match=r"4 processes on this host \(LOCAL_WORLD_SIZE\) but 2 GPU\(s\) visible: "
                                             r"start at most 2 per node \(torchrun --nproc-per-node 2\)"):
        choose_backend(3, 4)
    # ranks used to wrap around the GPUs, and NCCL failed at the first collective ("Duplicate GPU")
    gpus(1)
    with pytest.raises(ExecutionError, match="at most 1 per node"):
        choose_backend(1, 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # one GPU per process, chosen by the user
    assert choose_backend(1, 2) == ("nccl", torch.device("cuda", 0))


def test_local_runs_with_more_workers_than_gpus_the_emulator_and_the_opt_out_train_on_the_cpu(gpus, monkeypatch):
    gpus(1)
    assert choose_backend(0, 3, local=True) == ("gloo", torch.device("cpu"))
    gpus(4)
    monkeypatch.setenv("SPANTRAIN_EMULATION", "/run/spantrain-emulator/x/emulation.json")
    # emulated devices are CPU processes under quotas, and NCCL would bypass the shaped network
    assert choose_backend(0, 1) == ("gloo", torch.device("cpu"))
    monkeypatch.delenv("SPANTRAIN_EMULATION")
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    assert choose_backend(0, 1) == ("gloo", torch.device("cpu"))
    gpus(0)
    assert choose_backend(0, 1, local=True) == ("gloo", torch.device("cpu"))


def _op(kind, peer: int, numel: int = 4):
    return SimpleNamespace(op=kind, tensor=torch.zeros(numel), group=None, group_peer=peer, tag=0)


def test_under_nccl_a_batch_mixing_sends_and_receives_goes_out_as_one_group(monkeypatch):
    """1F1B's steady state sends its activation and receives a gradient in one batch: one at a
    time, NCCL queues each side's send before its receive and both wait forever."""
    calls = []
    monkeypatch.setattr(dist, "batch_isend_irecv", lambda ops: calls.append(("batch", len(ops))) or ["w"])
    monkeypatch.setattr(dist, "isend", lambda t, **kw: calls.append(("isend", kw["group_dst"])) or "s")
    monkeypatch.setattr(dist, "irecv", lambda t, **kw: calls.append(("irecv", kw["group_src"])) or "r")
    nccl = Transport("nccl", torch.device("cpu"), 10)
    assert nccl.issue([_op(dist.isend, 1), _op(dist.irecv, 1)]) == ["w"]
    assert calls == [("batch", 2)] and nccl.stats.bytes_sent == 16 and nccl.stats.messages == 2
    calls.clear()
    assert nccl.issue([_op(dist.isend, 1), _op(dist.isend, 2)]) == ["s", "s"]  # one kind: one at a time
    gloo = Transport("gloo", torch.device("cpu"), 10)
    assert gloo.issue([_op(dist.isend, 1), _op(dist.irecv, 1)]) == ["s", "r"]  # gloo: per message, as before
    assert calls == [("isend", 1), ("isend", 2), ("isend", 1), ("irecv", 1)]


def test_on_a_gpu_waits_and_collectives_are_timed_to_when_the_gpu_is_done(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: synced.append(d))
    monkeypatch.setattr(dist, "all_reduce", lambda *a, **kw: None)
    gpu = Transport("nccl", torch.device("cuda", 1), 10)
    gpu.wait([SimpleNamespace(wait=lambda: None)])
    gpu.all_reduce(torch.zeros(1), None)
    # before (the queued compute is not the wait's) and after (the transfer itself)
    assert synced == [torch.device("cuda", 1)] * 4
    synced.clear()
    Transport("gloo", torch.device("cpu"), 10).wait([])
    assert synced == []


def test_the_link_probe_times_a_gpu_transfer_to_its_end(monkeypatch):
    from spantrain.runtime import linkprobe

    synced, sent = [], []
    real = torch

    def make(fn):
        return lambda *a, device=None, **kw: fn(*a, **kw)

    fake_torch = SimpleNamespace(zeros=make(real.zeros), empty=make(real.empty), tensor=make(real.tensor),
                                 int64=real.int64, uint8=real.uint8, device=real.device,
                                 cuda=SimpleNamespace(synchronize=lambda d: synced.append(d)))
    fake_dist = SimpleNamespace(send=lambda t, peer: sent.append(t.numel()), recv=lambda t, peer: None)
    monkeypatch.setattr(linkprobe, "delay_before_send", lambda *a: None)
    linkprobe._timed_send(fake_dist, fake_torch, 0, 1, 1000, device="cuda:0")
    assert sent == [1, 1000] and synced == ["cuda:0", "cuda:0"]  # before the clock starts, and before it stops
    synced.clear()
    linkprobe._timed_send(fake_dist, fake_torch, 0, 1, 1000, device=None)
    assert synced == []


@pytest.mark.parametrize(("everyone_native", "trains"), [(True, "bf16"), (False, "fp32")])
def test_bf16_on_gpus_is_what_every_rank_supports_natively(monkeypatch, everyone_native, trains):
    from spantrain.runtime.worker import agreed_precision

    asked = []
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True:
                        asked.append(including_emulation) or True)
    # this rank's GPU has it; another rank's (a T4 beside an A100) does not, or does
    gpu = SimpleNamespace(device=torch.device("cuda", 0), all_gather_object=lambda mine: [mine, everyone_native])
    assert agreed_precision("bf16", gpu) == trains
    assert asked == [False]  # torch counts emulated bf16 as supported by default
    cpu = SimpleNamespace(device=torch.device("cpu"), all_gather_object=None)
    assert agreed_precision("bf16", cpu) == "bf16" and agreed_precision("fp16", gpu) == "fp16"


def test_a_local_run_on_this_machines_gpus_is_not_held_to_its_host_memory(tmp_path, monkeypatch):
    from spantrain.runtime import launcher, preflight

    seen = []
    real_check = preflight.check_memory

    def check(*args, on_this_machine, **kwargs):
        seen.append(on_this_machine)
        return real_check(*args, on_this_machine=on_this_machine, **kwargs)

    def stop(cfg, **kwargs):
        raise KeyboardInterrupt  # enough: the checks before launch ran

    monkeypatch.setattr(preflight, "check_memory", check)
    monkeypatch.setattr(launcher, "launch_local", stop)
    cluster, model = write_inputs(tmp_path)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan("1f1b", "allreduce", ASYMMETRIC)))
    args = ["run", "--cluster", str(cluster), "--model", str(model), "--plan", str(plan_file), "--steps", "1",
            "--run-dir", str(tmp_path / "run")]
    for count in (0, 8):
        monkeypatch.setattr(preflight, "visible_gpus", lambda count=count: count)
        code, _, err = spantrain_here(*args)
        assert code == 130, err
    assert seen == [True, False]  # GPU memory is not the host's RAM


def test_the_launcher_counts_no_gpus_without_importing_torch_where_no_gpu_driver_is_loaded(monkeypatch):
    import subprocess
    import sys

    from spantrain.runtime import preflight

    # importing torch was a second of every local run's start-up, and more at its exit
    code = ("import sys; from spantrain.runtime.preflight import visible_gpus; "
            "print(visible_gpus(), 'torch' in sys.modules)")
    if any(preflight.os.path.exists(p) for p in preflight._GPU_DRIVERS):
        pytest.skip("this host has a GPU driver: CUDA is asked")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.split() == ["0", "False"], out
    monkeypatch.setattr(preflight.os.path, "exists", lambda p: p == "/dev/nvidiactl")  # a driver: torch decides
    monkeypatch.setattr(transport_module, "visible_gpus", lambda: 3)
    assert preflight.visible_gpus() == 3
