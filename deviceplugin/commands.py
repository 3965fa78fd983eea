"""One-shot commands that do not serve: `validate-config`, `cdi-spec`, `sim-root`."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

from deviceplugin.model.allocation import cdi_enabled
from deviceplugin.model.config import parse_config, summary
from deviceplugin.model.errors import ConfigError, DevicePluginError
from deviceplugin.model.yamlimport import yaml
from deviceplugin.node.configread import load_config, read_text
from deviceplugin.node.discovery import discover
from deviceplugin.plugin.cdispec import node_spec
from deviceplugin.runtime.host import open_host_config, open_nvml, proc_root
from deviceplugin.runtime.options import CdiSpecOptions, SimRootOptions, ValidateConfigOptions
from deviceplugin.sim.simulator import simulator_for


def validate_config(settings: ValidateConfigOptions) -> int:
    """Exit 0 with a one-line summary when FILE is valid; 2 naming the offending field if not.
    FILE may be a pipe (`validate-config /dev/stdin < config.yaml`): only this command waits."""
    path = settings.path
    try:
        parsed = parse_config(read_text(path, only_regular=False), source=path)
    except ConfigError as exc:
        # Read and syntax errors already name the file; a field error names only the field.
        message = str(exc) if str(exc).startswith(path) else f"{path}: {exc}"
        print(f"invalid: {message}", file=sys.stderr)
        return 2
    for warning in parsed.warnings:
        print(f"{path}: warning: {warning}", file=sys.stderr)
    print(f"{path}: {summary(parsed.config)}")
    return 0


def cdi_spec(settings: CdiSpecOptions) -> int:
    """Print the CDI spec `serve` with these flags would write on this node (exit 0), so it
    can be diffed against another generator's. Says on stderr when no CDI strategy is on."""
    simulator = simulator_for(settings.simulate)
    parsed, host, _ = open_host_config(
        simulator,
        settings.overrides,
        lambda overrides: load_config(settings.config_file, overrides, settings.env),
    )
    config = parsed.config
    try:
        nvml = open_nvml(simulator, None, config.flags.nvidia_driver_root)
        nvml.init()
        try:
            inventory = discover(nvml)
        finally:
            with contextlib.suppress(DevicePluginError):
                nvml.shutdown()
        spec = node_spec(inventory, config, proc_root(host))
    finally:
        if host is not None:
            host.close()
    if not cdi_enabled(config):
        print(
            "note: no CDI strategy in deviceListStrategy: serve writes no spec; "
            "this is the spec it would write with one",
            file=sys.stderr,
        )
    if settings.output == "yaml":
        print(yaml.dump(spec, Dumper=_PlainDumper, sort_keys=False), end="")
    else:
        print(json.dumps(spec, indent=2))
    return 0


class _PlainDumper(yaml.SafeDumper):
    """Writes a node shared by two devices (a GPU's and `all`) in full both times, not as a
    YAML anchor and alias: the printout is for reading and diffing."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def sim_root(settings: SimRootOptions) -> int:
    """Write the host tree of a simulated node under DIR, with the simulated NVML library, MPS
    control program and nvidia-smi, for `--nvidia-driver-root DIR` (and any other NVML consumer
    given DIR as its driver root)."""
    from deviceplugin.sim.hostroot import (
        install_library,
        install_mps_control,
        install_nvidia_smi,
        lay_out,
    )
    from deviceplugin.sim.libbuild import (
        BuildError,
        library_path,
        mps_control_path,
        nvidia_smi_path,
    )
    from deviceplugin.sim.node import read_node, resolve_node_path

    directory = Path(settings.directory)
    node = read_node(resolve_node_path(settings.node))
    try:
        library = library_path()
        mps_control = mps_control_path()
        nvidia_smi = nvidia_smi_path()
    except BuildError as exc:
        print(f"sim-root: no simulated libnvidia-ml.so.1 or MPS control: {exc}", file=sys.stderr)
        return 1
    try:
        real = lay_out(node, directory)
        install_library(node, directory, library)
        install_mps_control(directory, mps_control)
        install_nvidia_smi(directory, nvidia_smi)
    except OSError as exc:
        print(f"sim-root: cannot write {directory}: {exc.strerror}", file=sys.stderr)
        return 1
    kind = "character devices" if real else "plain files (not root: no mknod)"
    print(f"{directory}: {len(node.gpus)} GPUs' host files, device nodes as {kind}, NVML simulated")
    return 0
