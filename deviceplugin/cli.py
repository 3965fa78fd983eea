"""The command line (SPEC §1): subcommands, flags, and the environment variable behind each flag.

Parsing only: argv + environment -> the options of one command (`runtime.options`). A flag
beats its variable; config-file values are overridden only by flags or variables that were
actually given (`load_config_text` does that).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from deviceplugin import __version__
from deviceplugin.model.config import ENV_OVERRIDES
from deviceplugin.model.configselect import CONFIG_LABEL
from deviceplugin.model.hostpaths import socket_path_problem
from deviceplugin.model.kubenames import DRIVER_NAME_MAX, dns_subdomain_problem
from deviceplugin.model.memoryshares import (
    GPU_SHARING,
    GPU_SHARING_ENV,
    GpuSharing,
    gpu_sharing,
)
from deviceplugin.model.migpartitions import MIG_MODE_ENV, MIG_MODES, MigMode, mig_mode
from deviceplugin.model.slices import DEFAULT_TAINT, TAINT_EFFECTS
from deviceplugin.ops.logs import LogFormat
from deviceplugin.runtime.options import (
    DEFAULT_CDI_SPEC_DIR,
    DEFAULT_DRA_DRIVER,
    DEFAULT_KUBELET_DIR,
    DEFAULT_KUBELET_ROOT,
    CdiSpecOptions,
    CommandOptions,
    DaemonOptions,
    DemoOptions,
    DraDemoOptions,
    DraServeOptions,
    ExplainOptions,
    InspectOptions,
    ServeOptions,
    SimRootOptions,
    ValidateConfigOptions,
)

# flag name (without --) -> (settings key, env var, help)
_RUNTIME_FLAGS: dict[str, tuple[str, str, str]] = {
    "config-file": ("config_file", "CONFIG_FILE", "the v1 config file; watched for changes"),
    "kubelet-dir": (
        "kubelet_dir",
        "DP_KUBELET_DIR",
        f"where kubelet.sock is and our sockets go (default {DEFAULT_KUBELET_DIR})",
    ),
    "simulate": ("simulate", "DP_SIMULATE", "simulated node: a preset name or a node YAML file"),
    "simulate-events": (
        "simulate_events",
        "DP_SIMULATE_EVENTS",
        "with --simulate: a JSON-lines file; appended lines become NVML events",
    ),
    "http-address": (
        "http_address",
        "DP_HTTP_ADDRESS",
        "HOST:PORT for /healthz, /readyz and /metrics (default: off)",
    ),
    "log-format": ("log_format", "DP_LOG_FORMAT", "text or json (default text)"),
    "health-recovery-after": (
        "health_recovery_after",
        "DP_HEALTH_RECOVERY_AFTER",
        "hold-down before an Unhealthy device is re-probed: seconds, 5m, 1h, or off (default 5m)",
    ),
    "cdi-spec-dir": (
        "cdi_spec_dir",
        "DP_CDI_SPEC_DIR",
        f"where the CDI spec goes when a CDI strategy is on (default {DEFAULT_CDI_SPEC_DIR})",
    ),
}

# `dra serve` only: flag name -> (settings key, env var, help)
_DRA_FLAGS: dict[str, tuple[str, str, str]] = {
    "driver-name": (
        "driver_name",
        "DP_DRA_DRIVER_NAME",
        f"the DRA driver name (default {DEFAULT_DRA_DRIVER})",
    ),
    "kubelet-root": (
        "kubelet_root",
        "DP_KUBELET_ROOT",
        f"the kubelet's root: plugins_registry/ and plugins/ are under it"
        f" (default {DEFAULT_KUBELET_ROOT})",
    ),
    "kubeconfig": (
        "kubeconfig",
        "KUBECONFIG",
        "kubeconfig for the API server (default: in-cluster config)",
    ),
    "node-name": ("node_name", "NODE_NAME", "this node's name (default: the host name)"),
    "unhealthy-taint": (
        "unhealthy_taint",
        "DP_DRA_UNHEALTHY_TAINT",
        f"the taint an unhealthy device gets: {', '.join(TAINT_EFFECTS)} or off"
        f" (default {DEFAULT_TAINT})",
    ),
    "gpu-sharing": (
        "gpu_sharing",
        GPU_SHARING_ENV,
        f"{' or '.join(GPU_SHARING)}: with memory, whole GPUs are published shareable by memory"
        " (consumable capacity) (default off)",
    ),
    "mig-mode": (
        "mig_mode",
        MIG_MODE_ENV,
        f"{' or '.join(MIG_MODES)}: with dynamic, each MIG-capable GPU is published whole and as"
        " every MIG profile x placement, packed by shared counters (default static)",
    ),
    "mps-shared-namespaces": (
        "mps_shared_namespaces",
        "DP_DRA_MPS_SHARED_NAMESPACES",
        "groups of namespaces whose claims may share a device's MPS daemon, as 'a,b;c,d'"
        " (default: none, each namespace's claims get a device's daemon alone)",
    ),
}
# `serve` only: per-node configuration by node label and GPU node labels, the two features for
# which it reads its own Node from the API server (off unless asked for).
_NODE_FLAGS: dict[str, tuple[str, str, str]] = {
    "config-dir": (
        "config_dir",
        "DP_CONFIG_DIR",
        "a directory of named config files (a ConfigMap mounted whole): the node's label "
        f"{CONFIG_LABEL} names the one that applies; instead of --config-file",
    ),
    "default-config": (
        "default_config",
        "DEFAULT_CONFIG",
        "with --config-dir: the config of a node without the label",
    ),
    "gpu-labels": (
        "gpu_labels",
        "DP_GPU_LABELS",
        "on: label this node with its GPUs (nvidia.com/gpu.product, ...); off (default)",
    ),
}
_NODE_API_FLAGS = ("kubeconfig", "node-name")  # of _DRA_FLAGS, which `serve` takes as well
# Config overrides the DRA driver acts on; the others shape only what the device plugin
# advertises, so `dra serve` and `dra explain` refuse them.
DRA_OVERRIDES = ("fail_on_init_error", "nvidia_driver_root", "nvidia_dev_root")
DEVICE_PLUGIN_ONLY = tuple(key for key in ENV_OVERRIDES if key not in DRA_OVERRIDES)

_OVERRIDE_HELP = {
    "mig_strategy": "none, single or mixed",
    "fail_on_init_error": "true or false",
    "pass_device_specs": "true or false",
    "device_list_strategy": "envvar, volume-mounts, cdi-annotations, cdi-cri (comma list)",
    "device_id_strategy": "uuid or index",
    "nvidia_driver_root": "driver root on the host (default /)",
    "nvidia_dev_root": "dev root on the host (default: the driver root)",
    "mps_root": "where sharing.mps keeps its daemons' pipe, log and shm directories",
    "cdi_annotation_prefix": "prefix of the CDI annotation key (default cdi.k8s.io/)",
    "shared_devices_allocation_policy": "distributed or packed",
    "gdrcopy_enabled": "true (default) or false: NVIDIA_GDRCOPY=enabled in each container",
    "gds_enabled": "true (default) or false: NVIDIA_GDS=enabled in each container",
    "mofed_enabled": "true (default) or false: NVIDIA_MOFED=enabled in each container",
}

_DEVICE_PLUGIN_ENV = frozenset(ENV_OVERRIDES[key] for key in DEVICE_PLUGIN_ONLY)
HEALTH_ENV_VARS = ("DP_DISABLE_HEALTHCHECKS", "DP_ENABLE_HEALTHCHECKS", "DP_HEALTH_POLICY")

_ALL_FLAGS = (*_RUNTIME_FLAGS.values(), *_DRA_FLAGS.values(), *_NODE_FLAGS.values())
SERVE_ENV_VARS: frozenset[str] = frozenset(
    [env for _, env, _ in _ALL_FLAGS] + list(ENV_OVERRIDES.values()) + list(HEALTH_ENV_VARS)
)


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


class _Subcommand(argparse.ArgumentParser):
    """A subcommand's parser whose flags are added when it is used (parsed, or its help
    printed): one process runs one command, and adding the flags of all of them costs more
    than parsing (`add_argument` builds a help formatter for every flag)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fill: list[Callable[[argparse.ArgumentParser], None]] = []

    def later(self, fill: Callable[[argparse.ArgumentParser], None]) -> _Subcommand:
        self._fill.append(fill)
        return self

    def _filled(self) -> None:
        while self._fill:
            self._fill.pop(0)(self)

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        self._filled()
        return super().parse_known_args(*args, **kwargs)

    def format_usage(self) -> str:
        self._filled()
        return super().format_usage()

    def format_help(self) -> str:
        self._filled()
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deviceplugin",
        description="Kubernetes device plugin for NVIDIA GPUs, MIG devices and time-sliced GPUs.",
    )
    parser.add_argument("--version", action="version", version=f"deviceplugin {__version__}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Subcommand
    )
    serve = commands.add_parser("serve", help="register with the kubelet and serve until stopped")
    inspect = commands.add_parser("inspect", help="show what serve advertises (or is advertising)")
    cdi_spec = commands.add_parser("cdi-spec", help="print the CDI spec serve would write")
    for sub in (serve, inspect, cdi_spec):
        sub.later(lambda p: _add_serve_flags(p, _RUNTIME_FLAGS))
    node_api = {name: _DRA_FLAGS[name] for name in _NODE_API_FLAGS}
    serve.later(lambda p: _add_serve_flags(p, {**_NODE_FLAGS, **node_api}, ()))
    cdi_spec.later(_add_cdi_spec_flags)
    inspect.later(_add_inspect_flags)
    validate = commands.add_parser("validate-config", help="check a config file")
    validate.add_argument("path", metavar="FILE")
    commands.add_parser("demo", help="run serve on a simulated node against a kubelet emulator")
    sim_root = commands.add_parser(
        "sim-root", help="write a simulated node's host files (dev/, proc/, driver) under DIR"
    )
    sim_root.add_argument("node", metavar="NODE", help="a preset name or a node YAML file")
    sim_root.add_argument("directory", metavar="DIR")
    dra = commands.add_parser("dra", help="the DRA driver")
    dra.later(_add_dra_commands)
    return parser


def _add_cdi_spec_flags(cdi_spec: argparse.ArgumentParser) -> None:
    cdi_spec.add_argument("-o", "--output", choices=("json", "yaml"), default="json")


def _add_inspect_flags(inspect: argparse.ArgumentParser) -> None:
    inspect.add_argument("-o", "--output", choices=("table", "json"), default="table")
    inspect.add_argument("--pods", action="store_true", help="show which pod holds each device")
    inspect.add_argument(
        "--from", dest="source", metavar="URL", help="ask a running serve at http://HOST:PORT"
    )


def _add_dra_commands(dra: argparse.ArgumentParser) -> None:
    dra_commands = dra.add_subparsers(
        dest="dra_command", required=True, metavar="COMMAND", parser_class=_Subcommand
    )
    dra_serve = dra_commands.add_parser(
        "serve", help="publish ResourceSlices and serve the kubelet's DRA API until stopped"
    )
    # The DRA driver has its own kubelet root (--kubelet-root): refuse --kubelet-dir.
    dra_runtime = {k: v for k, v in _RUNTIME_FLAGS.items() if k != "kubelet-dir"}
    named = {name: _NODE_FLAGS[name] for name in ("config-dir", "default-config")}
    dra_serve.later(
        lambda p: _add_serve_flags(p, {**dra_runtime, **_DRA_FLAGS, **named}, DRA_OVERRIDES)
    )
    dra_serve.later(_refuse_device_plugin_flags)
    dra_commands.add_parser(
        "demo", help="dra serve on a simulated node against a plugin watcher and an API server"
    )
    explain = dra_commands.add_parser(
        "explain", help="which devices DeviceClass selectors match on a node, and a claim's devices"
    )
    explain.later(_add_explain_flags)


def _add_explain_flags(explain: argparse.ArgumentParser) -> None:
    explain.add_argument("--class", dest="class_file", required=True, metavar="FILE")
    explain.add_argument("--claim", dest="claim_file", metavar="FILE")
    explain.add_argument(
        "--unhealthy", action="append", default=[], metavar="UUID", help="mark a device unhealthy"
    )
    explain.add_argument("-o", "--output", choices=("table", "json"), default="table")
    explain.add_argument(
        "--kubernetes-version",
        metavar="1.3X",
        help="answer as that release's API server and scheduler, default gates (default: newest)",
    )
    explain_flags = {n: _RUNTIME_FLAGS[n] for n in ("config-file", "simulate", "simulate-events")}
    explain_flags["unhealthy-taint"] = _DRA_FLAGS["unhealthy-taint"]
    explain_flags["gpu-sharing"] = _DRA_FLAGS["gpu-sharing"]
    explain_flags["mig-mode"] = _DRA_FLAGS["mig-mode"]
    _add_serve_flags(explain, explain_flags, ())
    _refuse_device_plugin_flags(explain)


def _add_serve_flags(
    parser: argparse.ArgumentParser,
    flags: Mapping[str, tuple[str, str, str]],
    overrides: Sequence[str] = tuple(ENV_OVERRIDES),
) -> None:
    """`flags` and the config `overrides`, each naming its environment variable in its help."""
    for name, (dest, env, text) in flags.items():
        parser.add_argument(f"--{name}", dest=dest, help=f"{text} [env {env}]")
    for key in overrides:
        env = ENV_OVERRIDES[key]
        parser.add_argument(_flag(key), dest=key, help=f"{_OVERRIDE_HELP.get(key, '')} [env {env}]")


def _refuse_device_plugin_flags(parser: argparse.ArgumentParser) -> None:
    """Hidden flags for the device plugin's settings, so that giving one to a DRA command is
    answered with why, not with "unrecognized arguments"."""
    for key in DEVICE_PLUGIN_ONLY:
        parser.add_argument(_flag(key), dest=f"refused_{key}", help=argparse.SUPPRESS)


def parse_options(argv: Sequence[str], env: Mapping[str, str]) -> CommandOptions:
    """Parse argv into the options of its command; each runtime flag falls back to its
    environment variable.

    Exits 2 (argparse) on bad usage, including paths that cannot work (`_path_problem`)."""
    parser = build_parser()
    args = parser.parse_args(list(argv))
    values = vars(args)
    runtime: dict[str, str | None] = {}
    for dest, env_name, _ in _ALL_FLAGS:
        given = values.get(dest)
        runtime[dest] = given if given is not None else env.get(env_name) or None
    log_format = runtime["log_format"] or "text"
    if log_format not in ("text", "json"):
        parser.error(f"--log-format / DP_LOG_FORMAT must be text or json, got {log_format!r}")
    if runtime["simulate_events"] and not runtime["simulate"]:
        parser.error("--simulate-events needs --simulate")
    command = args.command
    if command == "dra":
        command = f"dra {args.dra_command}"
        refused = [_flag(k) for k in DEVICE_PLUGIN_ONLY if values.get(f"refused_{k}") is not None]
        if refused:
            parser.error(
                f"{refused[0]} is a setting of the device plugin (deviceplugin serve): the DRA"
                " driver publishes the hardware as it is, every GPU once and a MIG-enabled GPU"
                " as its MIG devices"
            )
        env = {k: v for k, v in env.items() if k not in _DEVICE_PLUGIN_ENV}
    gpu_labels = runtime["gpu_labels"] or "off"
    if command in ("serve", "dra serve"):
        if runtime["config_dir"] and runtime["config_file"]:
            parser.error(
                "--config-dir / DP_CONFIG_DIR and --config-file / CONFIG_FILE are both given:"
                " choose one (a directory of named configs, or one file)"
            )
        if gpu_labels not in ("on", "off"):
            parser.error(f"--gpu-labels / DP_GPU_LABELS must be on or off, got {gpu_labels!r}")
    taint = runtime["unhealthy_taint"] or DEFAULT_TAINT
    if command.startswith("dra ") and taint != "off" and taint not in TAINT_EFFECTS:
        parser.error(
            f"--unhealthy-taint / DP_DRA_UNHEALTHY_TAINT must be {', '.join(TAINT_EFFECTS)}"
            f" or off, got {taint!r}"
        )
    sharing: GpuSharing = "off"
    mig: MigMode = "static"
    if command in ("dra serve", "dra explain"):
        try:
            sharing = gpu_sharing(runtime["gpu_sharing"])
        except ValueError as err:
            parser.error(f"--gpu-sharing / {GPU_SHARING_ENV} {err}")
        try:
            mig = mig_mode(runtime["mig_mode"])
        except ValueError as err:
            parser.error(f"--mig-mode / {MIG_MODE_ENV} {err}")
    options = _options(command, values, runtime, env, log_format, taint, gpu_labels, (sharing, mig))
    if isinstance(options, DraServeOptions):
        options = _with_mps_tenancy(parser, options, runtime["mps_shared_namespaces"])
    problem = _path_problem(options)
    if problem is not None:
        parser.error(problem)
    return options


def _options(
    command: str,
    values: Mapping[str, Any],
    runtime: Mapping[str, str | None],
    env: Mapping[str, str],
    log_format: str,
    taint: str,
    gpu_labels: str,
    dra: tuple[GpuSharing, MigMode],
) -> CommandOptions:
    """The options type of `command`, from the parsed flags, their variables and `env`; `dra`
    the DRA driver's GPU sharing and MIG mode."""
    sharing, mig = dra
    logs: LogFormat = "json" if log_format == "json" else "text"
    overrides = {key: values.get(key) for key in ENV_OVERRIDES}
    effect = next((e for e in TAINT_EFFECTS if e == taint), None)
    if command in ("serve", "dra serve"):
        daemon: dict[str, Any] = {
            "log_format": logs,
            "config_file": runtime["config_file"],
            "simulate": runtime["simulate"],
            "simulate_events": runtime["simulate_events"],
            "health_recovery_after": runtime["health_recovery_after"] or "5m",
            "overrides": overrides,
            "env": dict(env),
            "http_address": runtime["http_address"],
            "cdi_spec_dir": Path(runtime["cdi_spec_dir"] or DEFAULT_CDI_SPEC_DIR),
            "config_dir": runtime["config_dir"],
            "default_config": runtime["default_config"],
            "node_name": runtime["node_name"],
            "kubeconfig": runtime["kubeconfig"],
        }
        if command == "serve":
            return ServeOptions(
                **daemon,
                kubelet_dir=Path(runtime["kubelet_dir"] or DEFAULT_KUBELET_DIR),
                gpu_labels=gpu_labels == "on",
            )
        return DraServeOptions(
            **daemon,
            driver_name=runtime["driver_name"] or DEFAULT_DRA_DRIVER,
            kubelet_root=Path(runtime["kubelet_root"] or DEFAULT_KUBELET_ROOT),
            unhealthy_taint=effect,
            gpu_sharing=sharing,
            mig_mode=mig,
        )
    dry_run: dict[str, Any] = {
        "log_format": logs,
        "config_file": runtime["config_file"],
        "simulate": runtime["simulate"],
        "overrides": overrides,
        "env": dict(env),
    }
    if command == "inspect":
        return InspectOptions(
            **dry_run,
            kubelet_dir=Path(runtime["kubelet_dir"] or DEFAULT_KUBELET_DIR),
            output=values.get("output") or "table",
            pods=bool(values.get("pods")),
            source=values.get("source"),
        )
    if command == "cdi-spec":
        return CdiSpecOptions(
            **dry_run,
            output=values.get("output") or "json",
        )
    if command == "dra explain":
        return ExplainOptions(
            log_format=logs,
            class_file=values.get("class_file") or "",
            simulate=runtime["simulate"] or "",
            claim_file=values.get("claim_file"),
            events_file=runtime["simulate_events"],
            unhealthy=tuple(values.get("unhealthy") or ()),
            config_file=runtime["config_file"],
            taint=effect,
            gpu_sharing=sharing,
            mig_mode=mig,
            kubernetes_version=values.get("kubernetes_version"),
            output=values.get("output") or "table",
            env=dict(env),
        )
    if command == "validate-config":
        return ValidateConfigOptions(log_format=logs, path=values.get("path") or "")
    if command == "sim-root":
        return SimRootOptions(
            log_format=logs, node=values.get("node") or "", directory=values.get("directory") or ""
        )
    return (
        DraDemoOptions(log_format=logs) if command == "dra demo" else DemoOptions(log_format=logs)
    )


def _with_mps_tenancy(
    parser: argparse.ArgumentParser, options: DraServeOptions, value: str | None
) -> DraServeOptions:
    """`options` with the groups of `--mps-shared-namespaces`; exits 2 saying what is wrong."""
    from deviceplugin.dra.mpstenants import (
        SHARED_NAMESPACES_ENV,
        SHARED_NAMESPACES_FLAG,
        shared_namespaces,
    )

    try:
        groups = shared_namespaces(value)
    except ValueError as err:
        parser.error(f"{SHARED_NAMESPACES_FLAG} / {SHARED_NAMESPACES_ENV}: {err}")
    return replace(options, mps_shared_namespaces=groups)


def _path_problem(settings: CommandOptions) -> str | None:
    """Why a flag that names a path cannot work, naming the flag; None when they all can. The
    driver name becomes part of paths, so it must be what Kubernetes allows."""
    if not isinstance(settings, DaemonOptions):
        return None
    cdi = settings.cdi_spec_dir
    if cdi.exists() and not cdi.is_dir():
        return f"--cdi-spec-dir / DP_CDI_SPEC_DIR: {cdi} is not a directory"
    if isinstance(settings, ServeOptions):
        problem = socket_path_problem(str(settings.kubelet_dir / "kubelet.sock"))
        return f"--kubelet-dir / DP_KUBELET_DIR: {problem}" if problem else None
    assert isinstance(settings, DraServeOptions)
    problem = dns_subdomain_problem(settings.driver_name, DRIVER_NAME_MAX)
    if problem is not None:
        return f"--driver-name / DP_DRA_DRIVER_NAME: {problem}"
    from deviceplugin.dra.registration import dra_socket, registration_socket

    root, driver = settings.kubelet_root, settings.driver_name
    for socket in (registration_socket(root, driver), dra_socket(root, driver)):
        problem = socket_path_problem(str(socket))
        if problem is not None:
            return f"--kubelet-root / DP_KUBELET_ROOT: {problem}"
    return None
