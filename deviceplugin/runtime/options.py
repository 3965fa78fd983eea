"""What the commands take from the command line and the environment (`cli` builds it before
anything heavy is loaded): the parsed `Settings`, and the parts of it the node engine
(`EngineOptions`) and the own-Node follower (`NodeOptions`) take."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from deviceplugin.model.slices import DEFAULT_TAINT, TaintEffect
from deviceplugin.ops.logs import LogFormat

DEFAULT_KUBELET_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_CDI_SPEC_DIR = "/var/run/cdi"
DEFAULT_KUBELET_ROOT = "/var/lib/kubelet"
DEFAULT_DRA_DRIVER = "gpu.nvidia.com"


@dataclass(frozen=True)
class EngineOptions:
    """The config file, the simulated node, the health settings and the config overrides."""

    config_file: str | None = None
    simulate: str | None = None
    simulate_events: str | None = None
    health_recovery_after: str = "5m"
    overrides: Mapping[str, str | None] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeOptions:
    """What following the own Node takes: named configs chosen by its label, GPU labels."""

    node_name: str | None = None
    kubeconfig: str | None = None
    config_dir: str | None = None
    default_config: str | None = None
    gpu_labels: bool = False
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Settings:
    """Everything `serve` and `inspect` need from the command line and the environment."""

    command: str
    config_file: str | None = None
    kubelet_dir: Path = Path(DEFAULT_KUBELET_DIR)
    simulate: str | None = None
    simulate_events: str | None = None
    http_address: str | None = None
    log_format: LogFormat = "text"
    health_recovery_after: str = "5m"
    cdi_spec_dir: Path = Path(DEFAULT_CDI_SPEC_DIR)
    overrides: Mapping[str, str | None] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    output: str = "table"
    pods: bool = False
    source: str | None = None  # inspect --from URL
    path: str | None = None  # validate-config FILE
    class_file: str | None = None  # dra explain --class
    claim_file: str | None = None  # dra explain --claim
    unhealthy: tuple[str, ...] = ()  # dra explain --unhealthy
    node: str | None = None  # sim-root NODE
    directory: str | None = None  # sim-root DIR
    driver_name: str = DEFAULT_DRA_DRIVER  # dra serve
    kubelet_root: Path = Path(DEFAULT_KUBELET_ROOT)  # dra serve
    kubeconfig: str | None = None  # dra serve
    node_name: str | None = None  # dra serve
    unhealthy_taint: TaintEffect | None = DEFAULT_TAINT  # dra serve, dra explain; None: off
    config_dir: str | None = None  # serve: named configs chosen by node label
    default_config: str | None = None  # serve, with config_dir
    gpu_labels: bool = False  # serve

    @property
    def engine(self) -> EngineOptions:
        """What the node engine of `serve` and `dra serve` takes."""
        return EngineOptions(
            config_file=self.config_file,
            simulate=self.simulate,
            simulate_events=self.simulate_events,
            health_recovery_after=self.health_recovery_after,
            overrides=self.overrides,
            env=self.env,
        )

    @property
    def node_options(self) -> NodeOptions:
        """What following the own Node (`--config-dir`, `--gpu-labels`) takes."""
        return NodeOptions(
            node_name=self.node_name,
            kubeconfig=self.kubeconfig,
            config_dir=self.config_dir,
            default_config=self.default_config,
            gpu_labels=self.gpu_labels,
            env=self.env,
        )

    @property
    def follows_node(self) -> bool:
        """Whether `serve` reads its own Node from the API server."""
        return self.command == "serve" and (self.config_dir is not None or self.gpu_labels)
