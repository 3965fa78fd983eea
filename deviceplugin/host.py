"""Which host the plugin runs on: the real one, or the simulated node of `--simulate`.

The one place that picks between real NVML and the simulator, so the node engine and every
front-end run the same code on both.
"""

from __future__ import annotations

from deviceplugin.model.errors import ConfigError
from deviceplugin.node.nvml import Nvml, real_nvml


def open_nvml(simulate: str | None, events_path: str | None = None) -> Nvml:
    """The real NVML library, or with `simulate` (a preset name or node file) the simulator,
    which reads events appended to `events_path`. Not initialised yet: call `init()`."""
    if simulate is None:
        if events_path is not None:
            raise ConfigError("simulateEvents", "simulated events need --simulate")
        return real_nvml()
    from deviceplugin.sim.fake_nvml import FakeNvml  # loaded only when simulating

    sim = FakeNvml(simulate, events_path)
    return Nvml(sim, numa_reader=sim.numa_node)
