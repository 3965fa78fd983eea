"""What each command takes from the command line and the environment: one options type per
command (`cli` builds it before anything heavy is loaded), and the parts of a daemon's options
the node engine (`EngineOptions`) and the own-Node follower (`NodeOptions`) take.

Every type is frozen and keyword-only; `command` names the command it is for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from typing import ClassVar

from deviceplugin.model.memoryshares import GpuSharing
from deviceplugin.model.migpartitions import MigMode
from deviceplugin.model.record import record
from deviceplugin.model.slices import DEFAULT_TAINT, TaintEffect
from deviceplugin.ops.logs import LogFormat

DEFAULT_KUBELET_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_CDI_SPEC_DIR = "/var/run/cdi"
DEFAULT_KUBELET_ROOT = "/var/lib/kubelet"
DEFAULT_DRA_DRIVER = "gpu.nvidia.com"


@record(frozen=True, kw_only=True)
class EngineOptions:
    """The config file, the simulated events file, the health settings and the config
    overrides. The simulated node itself reaches the engine built (`runtime.host.Simulator`)."""

    config_file: str | None = None
    simulate_events: str | None = None
    health_recovery_after: str = "5m"
    overrides: Mapping[str, str | None] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def reads_mig_profiles(self) -> bool:
        """Whether discovery reads each MIG-capable GPU's profiles and placements."""
        return False


@record(frozen=True, kw_only=True)
class NodeOptions:
    """What following the own Node takes: named configs chosen by its label, GPU labels."""

    node_name: str | None = None
    kubeconfig: str | None = None
    config_dir: str | None = None
    default_config: str | None = None
    gpu_labels: bool = False
    env: Mapping[str, str] = field(default_factory=dict)


@record(frozen=True, kw_only=True)
class CommandOptions:
    """What every command takes."""

    command: ClassVar[str]
    log_format: LogFormat = "text"


@record(frozen=True, kw_only=True)
class DaemonOptions(CommandOptions, EngineOptions):
    """What both daemons take: the engine's options (a daemon's options are the options of its
    engine), the simulated node, HTTP, the CDI spec directory, and the own Node's API access
    for named configs."""

    simulate: str | None = None  # the composition builds the simulator of this node
    http_address: str | None = None
    cdi_spec_dir: Path = Path(DEFAULT_CDI_SPEC_DIR)
    config_dir: str | None = None  # named configs chosen by the node's label
    default_config: str | None = None  # with config_dir
    node_name: str | None = None
    kubeconfig: str | None = None

    @property
    def node_options(self) -> NodeOptions:
        """What following the own Node (`--config-dir`, `--gpu-labels`) takes."""
        return NodeOptions(
            node_name=self.node_name,
            kubeconfig=self.kubeconfig,
            config_dir=self.config_dir,
            default_config=self.default_config,
            gpu_labels=self.labels_gpus,
            env=self.env,
        )

    @property
    def labels_gpus(self) -> bool:
        return False


@record(frozen=True, kw_only=True)
class ServeOptions(DaemonOptions):
    """`serve`: the device plugin."""

    command: ClassVar[str] = "serve"
    kubelet_dir: Path = Path(DEFAULT_KUBELET_DIR)
    gpu_labels: bool = False

    @property
    def labels_gpus(self) -> bool:
        return self.gpu_labels

    @property
    def follows_node(self) -> bool:
        """Whether `serve` reads its own Node from the API server."""
        return self.config_dir is not None or self.gpu_labels


@record(frozen=True, kw_only=True)
class DraServeOptions(DaemonOptions):
    """`dra serve`: the DRA driver."""

    command: ClassVar[str] = "dra serve"
    driver_name: str = DEFAULT_DRA_DRIVER
    kubelet_root: Path = Path(DEFAULT_KUBELET_ROOT)
    unhealthy_taint: TaintEffect | None = DEFAULT_TAINT  # None: off
    gpu_sharing: GpuSharing = "off"  # "memory": whole GPUs published shareable by memory
    mig_mode: MigMode = "static"  # "dynamic": MIG-capable GPUs published as partitions
    # groups of namespaces whose claims may share a device's MPS daemon (`dra/mpstenants.py`)
    mps_shared_namespaces: tuple[tuple[str, ...], ...] = ()

    @property
    def reads_mig_profiles(self) -> bool:
        return self.mig_mode == "dynamic"


@record(frozen=True, kw_only=True)
class DryRunOptions(CommandOptions):
    """What a command that works out what `serve` would do takes: its config and node."""

    config_file: str | None = None
    simulate: str | None = None
    overrides: Mapping[str, str | None] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)


@record(frozen=True, kw_only=True)
class InspectOptions(DryRunOptions):
    """`inspect`: what `serve` would advertise here, or what a running one does (`source`)."""

    command: ClassVar[str] = "inspect"
    kubelet_dir: Path = Path(DEFAULT_KUBELET_DIR)
    output: str = "table"
    pods: bool = False
    source: str | None = None  # --from URL


@record(frozen=True, kw_only=True)
class CdiSpecOptions(DryRunOptions):
    """`cdi-spec`: the CDI spec `serve` would write."""

    command: ClassVar[str] = "cdi-spec"
    output: str = "json"


@record(frozen=True, kw_only=True)
class ValidateConfigOptions(CommandOptions):
    """`validate-config FILE`."""

    command: ClassVar[str] = "validate-config"
    path: str


@record(frozen=True, kw_only=True)
class SimRootOptions(CommandOptions):
    """`sim-root NODE DIR`."""

    command: ClassVar[str] = "sim-root"
    node: str
    directory: str


@record(frozen=True, kw_only=True)
class ExplainOptions(CommandOptions):
    """`dra explain`: which devices DeviceClass selectors match, and a claim's devices."""

    command: ClassVar[str] = "dra explain"
    class_file: str
    simulate: str
    claim_file: str | None = None
    events_file: str | None = None
    unhealthy: tuple[str, ...] = ()
    config_file: str | None = None
    driver: str = DEFAULT_DRA_DRIVER
    taint: TaintEffect | None = DEFAULT_TAINT
    gpu_sharing: GpuSharing = "off"
    mig_mode: MigMode = "static"
    kubernetes_version: str | None = None  # None: the newest, every gated field served
    output: str = "table"
    env: Mapping[str, str] = field(default_factory=dict)


@record(frozen=True, kw_only=True)
class DemoOptions(CommandOptions):
    """`demo`: serve on a simulated node against a kubelet emulator."""

    command: ClassVar[str] = "demo"


@record(frozen=True, kw_only=True)
class DraDemoOptions(CommandOptions):
    """`dra demo`: dra serve on a simulated node against emulators."""

    command: ClassVar[str] = "dra demo"
