"""A local emulated cluster: one network namespace, shaper and CPU quota per device.

- `cluster.EmulatedCluster`: bring a cluster spec up on this machine and run a command
  once per device (``spantrain emulate``).
- `latency`: the contract with the runtime's transport (``SPANTRAIN_EMULATION``,
  `latency_s`, `delay_before_send`), importable without torch.
- `netns`, `shaping`, `cpu`: namespaces and bridge, htb bandwidth shaping, cgroup CPU
  quotas; `state`: run names, leftovers; `launch`: device processes and their output.
"""

from spantrain.runtime.emulator.cluster import MODES, EmulatedCluster
from spantrain.runtime.emulator.latency import (
    ENV_VAR,
    Emulation,
    delay_before_send,
    latency_s,
    ring_allreduce_delay_s,
    ring_latency_s,
)
from spantrain.runtime.emulator.launch import DeviceResult, first_failure

__all__ = ["MODES", "EmulatedCluster", "DeviceResult", "first_failure", "ENV_VAR", "Emulation",
           "delay_before_send", "latency_s", "ring_latency_s", "ring_allreduce_delay_s"]
