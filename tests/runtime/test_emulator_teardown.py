"""A signal arriving while the emulator tears down waits for the teardown, then takes effect
(no root needed: local mode, no CPU quotas)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from spantrain import _interrupt
from spantrain.cluster import Cluster
from spantrain.runtime.emulator import EmulatedCluster, state

SPEC = {
    "name": "teardown",
    "devices": [{"id": "a", "count": 2, "region": "r", "tflops": 10, "memory_gb": 4}],
    "network": {"regions": {"r": {"gbps": 0.1, "latency_ms": 1}}},
}


@pytest.fixture
def emu(tmp_path, monkeypatch):
    monkeypatch.setenv("SPANTRAIN_EMULATOR_DIR", str(tmp_path / "state"))
    # a teardown cut short leaves its register entry for the next run's sweep: keep it in tmp,
    # and sweep only what that register knows (run as root, the start's sweep took every live
    # run on the machine, missing from this register, for a leftover and killed its devices)
    monkeypatch.setattr(state, "REGISTRY", tmp_path / "registry")
    monkeypatch.setattr(state, "_leftover_ids", lambda: state._registered_ids() | state._registry_ids())
    e = EmulatedCluster(Cluster.from_spec(SPEC), mode="local", cpu_limits=False, log=lambda s: None)
    yield e
    e.cleanup()


def _teardown_signalled(monkeypatch, sig: int, times: int = 1, pause_s: float = 0.0) -> list[str]:
    """Make `state.teardown` receive `sig` (`times` times, `pause_s` apart) and finish; its log."""
    real, log = state.teardown, []

    def teardown(names):
        for _ in range(times):
            os.kill(os.getpid(), sig)
            time.sleep(pause_s + 0.05)  # the handler runs between bytecodes: let it
        log.append("removing")
        problems = real(names)
        log.append("removed")
        return problems

    monkeypatch.setattr(state, "teardown", teardown)
    return log


def test_ctrl_c_during_teardown_is_raised_once_it_is_done(emu, monkeypatch):
    # it was dropped: `run --emulate --adapt` tears down at every plan switch and trained on
    emu.setup()
    run_dir = emu.names.run_dir
    log = _teardown_signalled(monkeypatch, signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        emu.cleanup()
    assert log == ["removing", "removed"] and not run_dir.exists()
    assert emu.cleanup() == []


def test_sigterm_during_teardown_reaches_the_callers_handler(emu, monkeypatch):
    # it was dropped: a SIGTERM during the last teardown let the process exit 0
    got: list[int] = []
    old = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        emu.setup()
        log = _teardown_signalled(monkeypatch, signal.SIGTERM, times=2)
        assert emu.cleanup() == []
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        time.sleep(0.05)
    finally:
        signal.signal(signal.SIGTERM, old)
    assert log == ["removing", "removed"] and got == [signal.SIGTERM]  # delivered once, after the teardown


def test_ctrl_c_during_a_ctrl_c_teardown_is_the_same_interrupt(emu, monkeypatch):
    emu.setup()
    log = _teardown_signalled(monkeypatch, signal.SIGINT)
    with pytest.raises(KeyboardInterrupt, match="first"):
        try:
            raise KeyboardInterrupt("first")
        except KeyboardInterrupt:
            emu.cleanup()  # as `__exit__` does while the first one unwinds
            raise
    assert log == ["removing", "removed"]


def test_a_repeated_signal_gets_through_a_teardown_that_hangs(emu, monkeypatch):
    monkeypatch.setattr(_interrupt, "_HOLD_LIMIT_S", 0.2)
    emu.setup()
    log = _teardown_signalled(monkeypatch, signal.SIGINT, times=2, pause_s=0.3)
    with pytest.raises(KeyboardInterrupt):
        emu.cleanup()
    assert log == []  # cut short: the sweep at the next start removes the rest
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
