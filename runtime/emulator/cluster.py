"""`EmulatedCluster`: a cluster spec brought up on this machine, and commands run on it.

Set-up, in order: sweep leftovers of crashed runs; register a new run (state file);
a CPU cgroup per device; one network namespace per device plus a hub namespace with the
bridge; htb shaping on each device's interface; the emulation file (latency contract,
`spantrain.runtime.emulator.latency`). `run(command)` starts the command once per
device, like torchrun, with the rendezvous variables set. `cleanup()` (also on leaving
the `with` block, on SIGTERM/SIGHUP, Ctrl-C and at interpreter exit) removes everything.

Without root, `ip`/`tc`, or permission to create namespaces, mode ``auto`` says so in
one line and falls back to plain local processes: no kernel shaping, so the transport
emulates latency *and* bandwidth (`delay_before_send` adds ``nbytes / bandwidth`` when
``kernel_shaping`` is false), and CPU quotas only if the cgroup is still writable.
"""

from __future__ import annotations

import atexit
import functools
import math
import os
import shutil
import signal
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from spantrain._interrupt import SignalsHeld
from spantrain._spec import plural
from spantrain.cluster import Cluster
from spantrain.errors import EmulationError
from spantrain.runtime import stop_signals
from spantrain.runtime.emulator import cpu, netns, shaping, state, system
from spantrain.runtime.emulator.latency import ENV_VAR, Emulation
from spantrain.runtime.emulator.launch import DeviceProcess, DeviceResult, stop_all, wait_all
from spantrain.runtime.emulator.options import EMULATE_OPTIONS, Options
from spantrain.runtime.preflight import cpu_cores

__all__ = ["EmulatedCluster", "MODES"]

MODES = ("auto", "netns", "local")
"""auto: namespaces when possible, else local processes; netns: namespaces or an error; local: never."""


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class EmulatedCluster:
    """A local emulated cluster; use as a context manager, or call `setup()` / `cleanup()`."""

    def __init__(self, cluster: Cluster | str | Path, *, cpus: float | None = None, mode: str = "auto",
                 bandwidth_scale: float | str = 1.0, max_gbps: float = 1.0, cpu_limits: bool = True,
                 master_port: int = 29500, log: Callable[[str], None] = _stderr,
                 devices: Sequence[str] | None = None, options: Options = EMULATE_OPTIONS):
        """`devices`: bring up only these devices of `cluster`, in this order (rank k runs
        ``devices[k]``; a training run passes its plan's devices). Their CPU quotas and
        bandwidths stay what emulating the whole cluster gives them (`cpus` is shared by the
        whole cluster), so a device computes at the same speed whichever subset runs, and
        a profile of the whole cluster describes it. `options`: the caller's flags, which
        the fixes in errors name."""
        if mode not in MODES:
            raise EmulationError(f"unknown mode {mode!r} (choose {', '.join(MODES)})")
        full = cluster if isinstance(cluster, Cluster) else Cluster.from_file(cluster)
        if devices is not None:
            devices = list(devices)
            unknown = [d for d in devices if d not in set(full.ids)]
            if unknown or len(set(devices)) != len(devices) or not devices:
                raise EmulationError(f"cannot emulate devices {devices} of cluster {full.name!r}: "
                                     + (f"unknown {', '.join(unknown)}" if unknown else "empty or repeated"))
        self.cluster = full if devices is None else full.subset(devices)
        self.cores = float(cpus if cpus is not None else (os.cpu_count() or 1))
        self.requested_mode = mode
        if bandwidth_scale == "fit":
            self.limits = shaping.RateLimits.fit(full, max_gbps)  # the whole cluster: same rates for any subset
        elif isinstance(bandwidth_scale, str):
            raise EmulationError(f"bandwidth scale must be a number or 'fit', got {bandwidth_scale!r}")
        else:
            self.limits = shaping.RateLimits(scale=float(bandwidth_scale), max_gbps=max_gbps)
        self.want_cpu_limits = cpu_limits
        self.options = options
        self.master_port = master_port
        self.log = log
        self.names: state.RunNames | None = None
        self.mode: str | None = None
        """``netns`` or ``local`` once set up."""
        self.cpu_limited = False
        self.emulation: Emulation | None = None
        self.emulation_file: Path | None = None
        full_shares = cpu.cpu_shares([d.tflops for d in full.devices], self.cores)
        self.shares = [full_shares[full.index(d.id)] for d in self.cluster.devices]
        """Cores of each emulated device (rank order)."""
        self.cores_per_tflops = self.cores / float(full.tflops.sum())
        self.period_us = [cpu.period_us(x) for x in self.shares]
        """CFS period of each emulated device (rank order)."""
        self._old_handlers: dict[int, object] = {}

    # ---- life cycle ------------------------------------------------------------------------------

    def __enter__(self) -> EmulatedCluster:
        self.setup()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def check(self) -> None:
        """Refuse, creating nothing, what `setup` would refuse of the caller's input: a device's
        CPU share below what a quota can hold, a rate the kernel's shaper cannot enforce. A caller
        that writes files of its own first (a training run's directory) checks before it does."""
        if self.want_cpu_limits and cpu.unavailable_reason() is None:
            cpu.check_shares(self.cluster.ids, self.shares, self.cores, self.options)
        if self.requested_mode != "local" and self._netns_unavailable is None:
            shaping.check_rates(self.cluster, self.limits, self.options)  # the user's to fix: no reason to fall back

    @functools.cached_property
    def _netns_unavailable(self) -> str | None:
        """`netns.unavailable_reason`, probed once per emulated cluster (it makes a namespace)."""
        return netns.unavailable_reason()

    def setup(self) -> EmulatedCluster:
        if self.names is not None:
            return self
        self.check()
        cleaned = state.sweep_leftovers()
        if cleaned:
            self.log(f"emulator: removed leftovers of crashed run(s) {', '.join(cleaned)}")
        self.names = state.new_run()
        self._install_handlers()
        try:
            self._setup_cpu()  # first: quotas it must refuse are refused before minutes of namespaces
            self.mode = self._setup_network()
            self._write_emulation()
        except BaseException:
            self.cleanup()
            raise
        return self

    def cleanup(self) -> list[str]:
        """Remove every namespace, link, cgroup and file of this run; safe to call twice.

        Never raises (it runs while an error unwinds, and at exit) except to deliver a signal it
        held: Ctrl-C, SIGTERM or SIGHUP while it runs waits until the teardown is done and the
        original handlers are back (`SignalsHeld`), then takes effect. What could not be removed
        is logged in one line, returned, and swept at the next start.
        """
        if self.names is None:
            return []
        names, self.names = self.names, None
        # Called while a Ctrl-C (or SIGTERM, raised as one) unwinds, a further one is that same interrupt.
        held = SignalsHeld(deliver=not isinstance(sys.exc_info()[1], KeyboardInterrupt))
        try:
            with held:
                problems = state.teardown(names)
        finally:
            self._restore_handlers()
        if problems:
            self.log(f"emulator: cleanup of run {names.run_id} incomplete ({problems[0]}); "
                     "`spantrain emulate --cleanup` retries")
        held.deliver()
        return problems

    def reshape(self, cluster: Cluster) -> bool:
        """Apply `cluster`'s bandwidths to the running emulation (the network changed under a live run).

        `cluster` must hold every emulated device (it may hold more). Under namespaces the
        shapers are replaced in place and traffic already flowing sees the new rates at once;
        True. Latency, which the transport reads when it starts, and bandwidth in the local
        fallback (also the transport's) change only for commands started after a new set-up;
        False then, and nothing is touched.
        """
        if self.names is None or self.emulation is None:
            raise EmulationError("the emulated cluster is not set up (use it in a `with` block)")
        missing = [d.id for d in self.cluster.devices if d.id not in cluster]
        if missing:
            raise EmulationError(f"cannot reshape: the new cluster has no device {', '.join(missing)}")
        if self.mode != "netns":
            return False
        now = cluster.subset([d.id for d in self.cluster.devices])
        # before any device's shaper goes: a rate tc refuses left one device half-shaped (its link at
        # the 1 Gbit/s default, where the file asked for a crawl) and the others on the old rates
        shaping.check_rates(now, self.limits, self.options)
        for k in range(len(now)):
            ns = self.names.device_ns(k)
            classes = shaping.device_classes(now, k, self._addresses, self.limits)
            system.run(["tc", "-n", ns, "qdisc", "del", "dev", netns.IFNAME, "root"])
            netns.set_gso(ns, shaping.gso_bytes(classes, self.limits.max_gbps))
            shaping.apply_shaping(ns, netns.IFNAME, classes, self.limits.max_gbps)
        self.cluster = now
        return True

    # ---- running -------------------------------------------------------------------------------

    def run(self, command: Sequence[str], *, timeout_s: float | None = None, echo: bool = True,
            log_dir: str | Path | None = None, env: Mapping[str, str] | None = None,
            stop_when: Callable[[], bool | float] | None = None, interrupt_grace_s: float | None = None,
            on_interrupt: Callable[[], None] | None = None) -> list[DeviceResult]:
        """Run `command` once per device (rank order) and wait for all; the first failure stops the rest,
        and so does `stop_when()` returning true or a grace in seconds (polled while they run; see
        `wait_all`, also for what Ctrl-C does with `interrupt_grace_s` and `on_interrupt`)."""
        if self.names is None or self.emulation is None:
            raise EmulationError("the emulated cluster is not set up (use it in a `with` block)")
        if not command:
            raise EmulationError("no command given to run on the emulated cluster")
        if shutil.which(command[0]) is None:
            raise EmulationError(f"command not found: {command[0]}")
        logs = Path(log_dir) if log_dir is not None else None
        if logs is not None:
            logs.mkdir(parents=True, exist_ok=True)
        procs: list[DeviceProcess] = []
        # an interrupt between a device's fork and `procs.append` left its process running with nobody
        # to stop it (and one in a forked child's preexec_fn printed a traceback): held until all started
        held = SignalsHeld()
        try:
            with held:
                for rank, dev in enumerate(self.cluster.devices):
                    procs.append(DeviceProcess(
                        rank=rank, device_id=dev.id, command=command, env=self.device_env(rank, env),
                        netns=self.names.device_ns(rank) if self.mode == "netns" else None,
                        cgroup=self._cgroup(rank) if self.cpu_limited else None, echo=echo, log_dir=logs))
            held.deliver()
        except BaseException:
            stop_all(procs, signal.SIGKILL)
            for p in procs:
                p.result()
            raise
        grace = {} if interrupt_grace_s is None else {"interrupt_grace_s": interrupt_grace_s}
        return wait_all(procs, timeout_s, stop_when, on_interrupt=on_interrupt, **grace)

    def device_env(self, rank: int, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of device `rank`'s process: torchrun's variables plus the emulation's."""
        assert self.emulation is not None and self.emulation_file is not None
        env = dict(os.environ)
        env.update(extra or {})
        dev = self.emulation.devices[rank]
        n = len(self.cluster)
        netns_mode = self.mode == "netns"
        env.update({
            "RANK": str(rank), "WORLD_SIZE": str(n),
            # Under namespaces every device is a host of its own; locally they share one.
            "LOCAL_RANK": "0" if netns_mode else str(rank), "LOCAL_WORLD_SIZE": "1" if netns_mode else str(n),
            "GROUP_RANK": str(rank) if netns_mode else "0",
            "MASTER_ADDR": self.emulation.master_addr, "MASTER_PORT": str(self.emulation.master_port),
            "SPANTRAIN_DEVICE_ID": dev["id"], "SPANTRAIN_HOST": dev["host"], ENV_VAR: str(self.emulation_file),
            "GLOO_SOCKET_IFNAME": netns.IFNAME if netns_mode else "lo",
            "TP_SOCKET_IFNAME": netns.IFNAME if netns_mode else "lo",
        })
        env.setdefault("PYTHONUNBUFFERED", "1")
        # devices share this machine's cores: OpenMP threads spinning while they wait made a
        # 4-device run 35x slower with 2 threads a device on 2 cores (`runtime.launcher._WORKER_ENV`)
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        if self.cpu_limited:
            # More threads than the quota's cores only makes them throttle each other, and more than
            # the machine's cores (a quota above them, --emulate-cpus 200) oversubscribes it: 6x slower
            threads = str(max(1, min(math.ceil(self.shares[rank] - 1e-9), cpu_cores())))
            env.setdefault("OMP_NUM_THREADS", threads)
            env.setdefault("MKL_NUM_THREADS", threads)
        return env

    # ---- reporting -----------------------------------------------------------------------------

    def describe(self) -> list[str]:
        """Human lines: mode, CPU shares and time dilation, bandwidth scale, clamped pairs."""
        emu = self.emulation
        assert emu is not None
        lines = [f"emulator: run {emu.run_id}, {plural(len(self.cluster), 'device')}, mode {self.mode}"
                 f"{' (kernel shaping)' if emu.kernel_shaping else ' (no kernel shaping: transport only)'}"]
        if self.cpu_limited:
            total = sum(d.tflops for d in self.cluster.devices)
            cores = f"{sum(self.shares):.4g}"
            lines.append(f"emulator: CPU quota {cores} core{'' if cores == '1' else 's'} over {total:g} spec TFLOP/s = "
                         f"{self.cores_per_tflops:.4g} cores per TFLOP/s (periods {min(self.period_us) / 1e3:g}-"
                         f"{max(self.period_us) / 1e3:g} ms); every device "
                         f"is slowed by the same factor, spec-seconds = real-seconds x (real TFLOP/s / spec TFLOP/s)")
            machine = cpu_cores()
            if sum(self.shares) > machine * (1 + 1e-9):
                lines.append(f"emulator: note: the quotas add up to more than this machine's {machine} cores: devices "
                             "computing at the same time compete for them, and their speeds stop following the "
                             f"spec's ratios; {self.options.cpus} {machine} or less keeps the ratios")
        elif not self.want_cpu_limits:
            lines.append("emulator: no CPU quotas (turned off): devices share the machine's cores freely")
        # else set-up already said why there are no quotas: once is enough
        spec = np.array(emu.spec_gbps, dtype=float)
        emulated = np.array(emu.emulated_gbps, dtype=float)
        off = ~np.eye(len(spec), dtype=bool)
        clamped = int(np.sum(spec[off] * self.limits.scale > self.limits.max_gbps * (1 + 1e-9)))
        rates = (f"{np.nanmin(emulated[off]) * 1e3:.3g}-{np.nanmax(emulated[off]) * 1e3:.3g} Mbit/s" if off.any()
                 else "no links (one device)")
        lines.append(f"emulator: bandwidth = min(spec x {self.limits.scale:.4g}, {self.limits.max_gbps:g} Gbit/s), "
                     + rates + (f"; {clamped} of {int(off.sum())} directed pairs clamped to the cap"
                                if clamped else ""))
        lines.append(f"emulator: latency injected by the transport per message ({ENV_VAR}={self.emulation_file})")
        return lines

    # ---- internals -----------------------------------------------------------------------------

    def _cgroup(self, rank: int) -> Path:
        assert self.names is not None
        return self.names.cgroup / f"d{rank}"  # as made by cpu.create_groups

    def _setup_network(self) -> str:
        if self.requested_mode == "local":
            return "local"
        reason = self._netns_unavailable
        if reason is None:
            try:
                self._build_namespaces()
                return "netns"
            except EmulationError as e:
                reason = str(e)
                assert self.names is not None
                state.teardown_network(self.names)
        if self.requested_mode == "netns":
            raise EmulationError(f"cannot build network namespaces: {reason}")
        self.log(f"emulator: network namespaces unavailable ({reason}); falling back to plain local processes: "
                 "latency and bandwidth are emulated by the transport only (no kernel shaping)")
        return "local"

    def _build_namespaces(self) -> None:
        assert self.names is not None
        addrs = netns.addresses(self.cluster)
        netns.create_hub(self.names.hub)
        for k in range(len(self.cluster)):
            ns = self.names.device_ns(k)
            classes = shaping.device_classes(self.cluster, k, addrs, self.limits)
            netns.add_device(self.names.hub, ns, self.names.hub_if(k), addrs[k],
                             gso_bytes=shaping.gso_bytes(classes, self.limits.max_gbps))
            shaping.apply_shaping(ns, netns.IFNAME, classes, self.limits.max_gbps)
        hosts = [(addrs[k], _host_name(d.id)) for k, d in enumerate(self.cluster.devices)]
        for k in range(len(self.cluster)):
            netns.write_hosts(self.names.device_ns(k), hosts)
        self._addresses = addrs

    def _setup_cpu(self) -> None:
        if not self.want_cpu_limits:
            return
        reason = cpu.unavailable_reason()
        if reason is not None:
            self.log(f"emulator: no CPU quotas ({reason}): devices share the cores freely")
            return
        assert self.names is not None
        cpu.create_groups(self.names.cgroup, self.shares)
        self.cpu_limited = True

    def _write_emulation(self) -> None:
        assert self.names is not None
        c = self.cluster
        netns_mode = self.mode == "netns"
        addrs = self._addresses if netns_mode else ["127.0.0.1"] * len(c)
        host = socket.gethostname()
        devices = [{"rank": k, "id": d.id, "region": d.region, "address": addrs[k],
                    "namespace": self.names.device_ns(k) if netns_mode else None,
                    "host": _host_name(d.id) if netns_mode else host,
                    "cpu_cores": round(self.shares[k], 6) if self.cpu_limited else None,
                    "tflops": d.tflops, "memory_gb": d.memory_gb} for k, d in enumerate(c.devices)]
        emulated = shaping.emulated_gbps(c, self.limits)
        spec = c.bandwidth / shaping.GBPS

        def matrix(m: np.ndarray) -> list[list[float | None]]:
            return [[None if i == j else float(m[i, j]) for j in range(len(c))] for i in range(len(c))]

        self.emulation = Emulation(
            cluster=c.name, run_id=self.names.run_id, kernel_shaping=netns_mode,
            bandwidth_scale=self.limits.scale, max_gbps=self.limits.max_gbps,
            master_addr=addrs[0], master_port=self.master_port if netns_mode else _free_port(),
            cpu={"cores": round(sum(self.shares), 6), "cores_per_tflops": self.cores_per_tflops,
                 "period_us": self.period_us, "limited": self.cpu_limited},
            devices=devices, latency=c.latency.tolist(), spec_gbps=matrix(spec), emulated_gbps=matrix(emulated))
        self.emulation_file = self.names.run_dir / "emulation.json"
        self.emulation.write(self.emulation_file)

    def _install_handlers(self) -> None:
        atexit.register(self.cleanup)
        self._old_handlers = stop_signals.install()  # SIGTERM/SIGHUP unwind `with` blocks, which clean up

    def _restore_handlers(self) -> None:
        atexit.unregister(self.cleanup)
        stop_signals.restore(self._old_handlers)
        self._old_handlers = {}


def _host_name(device_id: str) -> str:
    """The emulated host of a device (each namespace is a host of its own); a ``#`` written ``%23``
    (and ``%`` as ``%25``): /etc/hosts reads the rest of a line after ``#`` as a comment, so an
    id ``a#1`` resolved as host ``emu-a``."""
    return "emu-" + device_id.replace("%", "%25").replace("#", "%23")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
