"""`deviceplugin dra explain`: which devices a DeviceClass selects on a node, and what a claim
would be allocated there, without a cluster.

It builds the devices `dra serve` would publish for the node (the same start-up path: config
merge, simulated NVML, discovery, the MIG strategy's plan, health), evaluates every DeviceClass
of `--class FILE` on them with `dra.selectors` (a real CEL library), and with `--claim FILE`
simulates the scheduler's allocation of a ResourceClaim or ResourceClaimTemplate (`count`,
`allocationMode: All`, `matchAttribute`). Health before evaluation: `--unhealthy UUID` marks a
GPU or MIG device, and each line of `--simulate-events FILE` goes through the same Xid policy as
`serve` (`{"uuid": ..., "xid": 79}`; `{"uuid": ..., "lost": true}`), so a device hit by a
critical Xid drops out of a class that asks for `healthy`.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from deviceplugin.cli import Settings
from deviceplugin.dra.claims import Allocation, allocate, read_claim, read_classes, select
from deviceplugin.dra.selectors import SelectorError, cel_device
from deviceplugin.host import open_nvml
from deviceplugin.model.config import load_config
from deviceplugin.model.errors import ConfigError, DevicePluginError
from deviceplugin.model.resources import apply_health, build_plan
from deviceplugin.model.slices import DRIVER, build_devices
from deviceplugin.model.xidpolicy import HealthPolicy
from deviceplugin.node.discovery import discover

JsonObject = dict[str, Any]


@dataclass(frozen=True)
class ExplainOptions:
    """What `dra explain` was asked."""

    class_file: str
    simulate: str
    claim_file: str | None = None
    events_file: str | None = None
    unhealthy: tuple[str, ...] = ()
    config_file: str | None = None
    driver: str = DRIVER
    output: str = "table"
    overrides: Mapping[str, str | None] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)


def options_from(settings: Settings) -> ExplainOptions:
    """The options of `dra explain` from the parsed command line."""
    return ExplainOptions(
        class_file=settings.class_file or "",
        simulate=settings.simulate or "",
        claim_file=settings.claim_file,
        events_file=settings.simulate_events,
        unhealthy=settings.unhealthy,
        config_file=settings.config_file,
        output=settings.output,
        overrides=settings.overrides,
        env=settings.env,
    )


def explain(options: ExplainOptions) -> int:
    """Print the report; 0 when it could be made (whether or not a claim fits), 2 on bad input."""
    if not options.simulate:
        print("dra explain: needs --simulate NODE (a preset or a node file)", file=sys.stderr)
        return 2
    try:
        report = build_report(options)
    except (ConfigError, SelectorError) as err:
        print(f"dra explain: {err}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if options.output == "json" else render(report))
    return 0


def build_report(options: ExplainOptions) -> JsonObject:
    """The devices, each class's verdict per device, and the claim's allocation."""
    classes = read_classes(_documents(options.class_file))
    claim = read_claim(_documents(options.claim_file)[0]) if options.claim_file else None
    published = node_devices(options)
    devices = {d["name"]: cel_device(options.driver, d) for d in published}
    verdicts: dict[str, dict[str, bool | str]] = {}
    for name, selectors in classes.items():
        verdict: dict[str, bool | str] = {}
        for device_name, device in devices.items():
            try:
                verdict[device_name] = select(selectors, device)
            except SelectorError as err:
                verdict[device_name] = f"error: {err}"
        verdicts[name] = verdict
    report: JsonObject = {
        "devices": [_summary(d) for d in published],
        "classes": verdicts,
    }
    if claim is not None:
        report["claim"] = _allocation(claim.name, allocate(claim, classes, devices))
    return report


def node_devices(options: ExplainOptions) -> list[JsonObject]:
    """The devices `dra serve` would publish on the simulated node, health applied."""
    config = load_config(options.config_file, options.overrides, options.env).config
    nvml = open_nvml(options.simulate)
    nvml.init()
    try:
        inventory = discover(nvml)
    finally:
        with contextlib.suppress(DevicePluginError):
            nvml.shutdown()
    unhealthy = dict.fromkeys(options.unhealthy, "marked-unhealthy")
    if options.events_file:
        unhealthy.update(
            events_health(Path(options.events_file), HealthPolicy.from_env(options.env))
        )
    resources = apply_health(build_plan(inventory, config).resources, unhealthy)
    return build_devices(inventory, resources, options.driver)


def events_health(path: Path, policy: HealthPolicy) -> dict[str, str]:
    """UUID -> reason for each device a simulated-events line takes away under `policy`."""
    unhealthy: dict[str, str] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise ConfigError("simulate-events", f"cannot read {path}: {err}") from err
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
            uuid = event["uuid"]
        except (ValueError, KeyError, TypeError) as err:
            raise ConfigError("simulate-events", f"{path}:{number}: not an event: {err}") from err
        if event.get("lost") is True:
            unhealthy[uuid] = "gpu-lost"
        elif event.get("lost") is False:
            unhealthy.pop(uuid, None)
        if "xid" in event:
            decision = policy.decide(int(event["xid"]))
            if decision.fatal:
                unhealthy[uuid] = decision.reason
    return unhealthy


def render(report: JsonObject) -> str:
    """A table of devices with one column per class, then the claim's allocation."""
    classes: dict[str, dict[str, bool | str]] = report["classes"]
    header = ["DEVICE", "TYPE", "PROFILE", "HEALTHY", *classes]
    rows = [
        [
            device["name"],
            device["type"],
            device["profile"] or "-",
            "yes" if device["healthy"] else "no",
            *(_cell(classes[name][device["name"]]) for name in classes),
        ]
        for device in report["devices"]
    ]
    lines = _table(header, rows)
    for name, verdict in classes.items():
        chosen = sum(value is True for value in verdict.values())
        lines.append(f"{name}: {chosen} of {len(verdict)} devices match")
        lines.extend(f"  {d}: {v}" for d, v in verdict.items() if isinstance(v, str))
    claim = report.get("claim")
    if claim is not None:
        lines.append("")
        if claim["failure"]:
            lines.append(f"claim {claim['name']}: cannot be allocated: {claim['failure']}")
        else:
            lines.append(f"claim {claim['name']}: would be allocated")
            for request, names in claim["devices"].items():
                lines.append(f"  {request}: {', '.join(names)}")
            for attribute, value in claim["values"].items():
                lines.append(f"  matchAttribute {attribute} = {value}")
    return "\n".join(lines)


def _summary(device: JsonObject) -> JsonObject:
    attributes = device["attributes"]
    return {
        "name": device["name"],
        "type": attributes["type"]["string"],
        "uuid": attributes["uuid"]["string"],
        "profile": attributes["nvidia.com/migProfile"]["string"],
        "healthy": attributes["nvidia.com/healthy"]["bool"],
    }


def _allocation(name: str, allocation: Allocation) -> JsonObject:
    return {
        "name": name,
        "devices": {request: list(names) for request, names in allocation.devices.items()},
        "values": dict(allocation.values),
        "failure": allocation.failure,
    }


def _documents(path: str | None) -> list[Any]:
    try:
        documents = [d for d in yaml.safe_load_all(Path(path or "").read_text()) if d]
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(str(path), f"cannot read: {err}") from err
    if not documents:
        raise ConfigError(str(path), "holds no document")
    return documents


def _cell(value: bool | str) -> str:
    if isinstance(value, str):
        return "error"
    return "yes" if value else "no"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
