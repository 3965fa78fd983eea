"""`deviceplugin dra explain`: which devices a DeviceClass selects on a node, and what a claim
would be allocated there, without a cluster.

It builds the devices `dra serve` would publish for the node (the same path: simulated NVML,
discovery, health, the `--unhealthy-taint` effect), reads every DeviceClass of `--class FILE`
and every ResourceClaim and ResourceClaimTemplate of `--claim FILE` in any served version
(`dra.resourceapi`: checked as the API server checks them, converted to v1), evaluates each
class on each device with `dra.selectors` (a real CEL library) and allocates the claims one
after the other as the scheduler would (`dra.claims`). Health before evaluation: `--unhealthy
UUID` marks a GPU or MIG device, and each line of `--simulate-events FILE` goes through the same
Xid policy as `serve` (`{"uuid": ..., "xid": 79}`; `{"uuid": ..., "lost": true}`), so a device
hit by a critical Xid drops out of a class that asks for `healthy`, and out of every claim that
does not tolerate its taint. `--config-file` is checked as `dra serve` would check it; nothing in
it changes what is published. `--gpu-sharing` and `--mig-mode` publish as `dra serve` does with
them; with `--mig-mode dynamic` the node's slices carry counter sets, and claims are allocated
against them as the scheduler does (`dra.counters`): the counter sets are read from the slices
that carry them, the devices from the others. `--kubernetes-version 1.35` answers as that
release's API server and scheduler would with their default gates (`explain.versions`): the
node publishes what `dra serve` publishes there, and claims lose the fields that server drops.

Bad input of any kind (unreadable files, YAML that is not a Kubernetes object, objects the API
server would refuse) is answered with exit 2 and a message naming the file and field path.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from deviceplugin.explain.claims import Allocation, Candidate, allocate_all, select
from deviceplugin.explain.counters import SharedCounters
from deviceplugin.explain.resourceapi import Claim, read_claims, read_classes
from deviceplugin.explain.selectors import SelectorError, SelectorLimitError
from deviceplugin.explain.versions import as_stored, features
from deviceplugin.model.devices import Inventory
from deviceplugin.model.errors import ConfigError, DevicePluginError
from deviceplugin.model.gatedfields import slice_contents
from deviceplugin.model.slices import build_slices, quantity
from deviceplugin.model.xidpolicy import HealthPolicy
from deviceplugin.model.yamlimport import yaml
from deviceplugin.node.configread import load_config
from deviceplugin.node.discovery import discover
from deviceplugin.node.health import GPU_LOST, xid_health
from deviceplugin.node.xidcatalog import policy_from_env
from deviceplugin.runtime.host import open_nvml
from deviceplugin.runtime.options import ExplainOptions
from deviceplugin.sim.events import parse_line
from deviceplugin.sim.simulator import NodeSimulator

JsonObject = dict[str, Any]
_POOL = "simulated-node"  # the pool's (and node's) name; nothing reads it back


def explain(options: ExplainOptions) -> int:
    """Print the report; 0 when it could be made (whether or not a claim fits), 2 on bad input."""
    if not options.simulate:
        print("dra explain: needs --simulate NODE (a preset or a node file)", file=sys.stderr)
        return 2
    try:
        report = build_report(options)
    except DevicePluginError as err:
        print(f"dra explain: {err}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2, default=str) if options.output == "json" else render(report))
    return 0


def build_report(options: ExplainOptions) -> JsonObject:
    """The devices, each class's verdict per device, and each claim's allocation."""
    classes = read_classes(read_documents(options.class_file), options.class_file)
    claims = []
    if options.claim_file:
        claims = read_claims(read_documents(options.claim_file), options.claim_file)
    kept = features(options.kubernetes_version)
    release = (options.kubernetes_version or "").removeprefix("v")
    claims = [as_stored(claim, kept, release) for claim in claims]
    slices = node_slices(options)
    published = [d for item in slices for d in item["spec"].get("devices") or ()]
    candidates = [Candidate.of(options.driver, d) for d in published]
    verdicts: dict[str, dict[str, bool | str]] = {}
    for name, device_class in classes.items():
        verdict: dict[str, bool | str] = {}
        for candidate in candidates:
            try:
                verdict[candidate.name] = select(device_class.selectors, candidate.cel)
            except SelectorLimitError as err:
                where = f"{options.class_file}, DeviceClass {name}: {err.path}"
                raise ConfigError(where, str(err)) from err
            except SelectorError as err:
                verdict[candidate.name] = f"error: {err}"
        verdicts[name] = verdict
    try:
        allocations = allocate_all(claims, classes, candidates, SharedCounters.of(slices))
    except SelectorLimitError as err:
        raise ConfigError(f"{options.claim_file}, {err.path}", str(err)) from err
    return {
        "devices": [_summary(d) for d in published],
        "classes": verdicts,
        "claims": [_allocation(c, a) for c, a in zip(claims, allocations, strict=True)],
    }


def node_devices(options: ExplainOptions) -> list[JsonObject]:
    """The devices `dra serve` would publish on the simulated node, health applied."""
    return _published(options)[0]


def node_slices(options: ExplainOptions) -> list[JsonObject]:
    """The ResourceSlices of the node's pool as `dra serve` would publish them: counter sets
    in slices of their own, then the devices."""
    devices, sets = _published(options)
    return build_slices(_POOL, devices, 1, options.driver, sets)


def _published(options: ExplainOptions) -> tuple[list[JsonObject], list[JsonObject]]:
    """The devices and counter sets, as published where the API server is of
    `--kubernetes-version`."""
    load_config(options.config_file, {}, options.env)  # refused as `dra serve` would refuse it
    try:
        nvml = open_nvml(NodeSimulator(options.simulate))
        nvml.init()
    except DevicePluginError as err:
        raise ConfigError(f"--simulate {options.simulate}", str(err)) from err
    try:
        inventory = discover(nvml, mig_profiles=options.mig_mode == "dynamic")
    finally:
        with contextlib.suppress(DevicePluginError):
            nvml.shutdown()
    unhealthy = dict.fromkeys(options.unhealthy, "marked-unhealthy")
    if options.events_file:
        policy = policy_from_env(options.env)
        unhealthy.update(events_health(Path(options.events_file), policy, inventory))
    shares, dynamic = options.gpu_sharing == "memory", options.mig_mode == "dynamic"
    kept = features(options.kubernetes_version)
    return slice_contents(
        inventory, unhealthy, options.driver, options.taint, shares, dynamic, kept
    )


def events_health(path: Path, policy: HealthPolicy, inventory: Inventory) -> dict[str, str]:
    """UUID -> reason for each device a simulated-events line takes away under `policy`, by the
    health monitor's rule (`xid_health`): an Xid comes from the GPU, with a MIG device's
    instance ids, and on a GPU that fell off the bus it says `gpu-lost`."""
    unhealthy: dict[str, str] = {}
    lost: set[str] = set()
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError("simulate-events", f"cannot read {path}: {err}") from err
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = parse_line(line)
        except ValueError as err:
            raise ConfigError("simulate-events", f"{path}:{number}: not an event: {err}") from err
        if event.uuid is None:
            continue  # a waitError line: nothing about health
        gpu, gi, ci = _event_source(inventory, event.uuid)
        if event.lost is True:
            lost.add(gpu)
            unhealthy[gpu] = GPU_LOST
        elif event.lost is False:
            lost.discard(gpu)
            unhealthy.pop(gpu, None)
        if event.xid is not None:
            decision = policy.decide(event.xid)
            targets, reason = xid_health(inventory, decision, gpu, gi, ci, gpu in lost)
            unhealthy.update(dict.fromkeys(targets, reason))
    return unhealthy


def _event_source(inventory: Inventory, uuid: str) -> tuple[str, int | None, int | None]:
    """The GPU an event line's NVML event comes from, with the GPU and compute instance of a
    MIG device (as the simulator reports it)."""
    for gpu in inventory.gpus:
        for mig in gpu.mig_devices:
            if mig.uuid == uuid:
                return gpu.uuid, mig.gpu_instance_id, mig.compute_instance_id
    return uuid, None, None


def read_documents(path: str | None) -> list[object]:
    """The documents of a YAML (or JSON) file; ConfigError naming the file when it cannot be
    read."""
    try:
        data = Path(path or "").read_bytes()
    except OSError as err:
        raise ConfigError(str(path), f"cannot read: {err.strerror or err}") from err
    return parse_documents(data, str(path))


def parse_documents(data: bytes, source: str) -> list[object]:
    """The non-empty YAML documents in `data`; ConfigError for anything that is not UTF-8
    YAML holding at least one."""
    try:
        documents = [d for d in yaml.safe_load_all(data.decode()) if d is not None]
    except (ValueError, OverflowError, yaml.YAMLError, RecursionError) as err:
        raise ConfigError(source, f"not YAML: {err}") from err
    if not documents:
        raise ConfigError(source, "holds no document")
    return documents


def render(report: JsonObject) -> str:
    """A table of devices with one column per class, then each claim's allocation."""
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
    for claim in report["claims"]:
        lines.append("")
        title = f"{claim['kind']} {claim['name']} ({claim['apiVersion']})"
        if claim["failure"]:
            lines.append(f"{title}: cannot be allocated: {claim['failure']}")
        else:
            lines.append(f"{title}: would be allocated")
            for request in claim["devices"]:
                admin = " (admin access)" if request in claim["adminAccess"] else ""
                picked = [_device(r) for r in claim["results"] if r["request"] == request]
                lines.append(f"  {request}: {', '.join(picked)}{admin}")
            for attribute, value in claim["values"].items():
                lines.append(f"  matchAttribute {attribute} = {value}")
        lines.extend(f"  note: {note}" for note in claim["notes"])
    return "\n".join(lines)


def _summary(device: JsonObject) -> JsonObject:
    attributes = device["attributes"]
    return {
        "name": device["name"],
        "type": attributes["type"]["string"],
        "uuid": attributes.get("uuid", {}).get("string", ""),  # none for a partition not cut yet
        "profile": attributes["nvidia.com/migProfile"]["string"],
        "healthy": attributes["nvidia.com/healthy"]["bool"],
        "taints": device.get("taints", []),
    }


def _allocation(claim: Claim, allocation: Allocation) -> JsonObject:
    return {
        "kind": claim.kind,
        "name": claim.name,
        "apiVersion": claim.api_version,
        "devices": {request: list(names) for request, names in allocation.devices.items()},
        "results": _results(allocation),
        "values": dict(allocation.values),
        "adminAccess": list(allocation.admin),
        "failure": allocation.failure,
        "notes": [*claim.notes, *allocation.notes],
    }


def _results(allocation: Allocation) -> list[JsonObject]:
    """One entry per device or share, as `status.allocation.devices.results` would hold it: a
    share (on a device with allowMultipleAllocations) gets a shareID and its consumedCapacity."""
    results = []
    for request, names in allocation.devices.items():
        shares = allocation.shares.get(request, {})
        for name in names:
            result: JsonObject = {"request": request, "device": name, "share": name in shares}
            if name in shares:
                consumed = shares[name]
                result["consumedCapacity"] = {k: quantity(v) for k, v in sorted(consumed.items())}
            results.append(result)
    return results


def _device(result: JsonObject) -> str:
    """`gpu-0`, or for a share `gpu-0 (share: memory 20Gi)`."""
    if not result["share"]:
        return str(result["device"])
    consumed = ", ".join(f"{k} {v}" for k, v in result["consumedCapacity"].items())
    return f"{result['device']} (share: {consumed})"


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
