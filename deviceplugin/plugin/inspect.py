"""`inspect`: what `serve` would advertise with the same flags, or what a running one advertises.

Without `--from` it runs the same start-up path as `serve` (config merge, NVML, discovery,
resource plan) and stops before serving, so health is as discovered, not as monitored. With
`--from http://HOST:PORT` it reads the running plugin's `/status` and shows live health and
registration. Both print the same document (`snapshot.py`) as a table or, with `-o json`, as
JSON; `--pods` adds which pod holds each device, from the kubelet's pod-resources API.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import urllib.error
import urllib.request
from typing import Any

from deviceplugin.kubelet.pods import pod_resources_socket, read_pods
from deviceplugin.model.errors import DevicePluginError, NvmlError
from deviceplugin.model.resources import ResourceSet, build_plan
from deviceplugin.node.configread import load_config
from deviceplugin.node.discovery import discover
from deviceplugin.ops.snapshot import build_snapshot, without_pods
from deviceplugin.runtime.host import open_nvml
from deviceplugin.runtime.options import InspectOptions
from deviceplugin.sim.simulator import simulator_for

FETCH_TIMEOUT_SECONDS = 3.0


def inspect(settings: InspectOptions) -> int:
    """Print the document; 0 on success, 1 when `--from` cannot be read. ConfigError,
    DiscoveryError and (with failOnInitError) NvmlError propagate to `program`."""
    if settings.source:
        try:
            document = fetch_status(settings.source)
        except DevicePluginError as exc:
            print(f"inspect: {exc}", file=sys.stderr)
            return 1
    else:
        document = dry_run(settings)
    if not settings.pods:
        document = without_pods(document)
    print(json.dumps(document, indent=2) if settings.output == "json" else render(document))
    return 0


def dry_run(settings: InspectOptions) -> dict[str, Any]:
    """Build what `serve` would advertise, and (with --pods) ask the kubelet who holds what."""
    parsed = load_config(settings.config_file, settings.overrides, settings.env)
    config = parsed.config
    notes = list(parsed.warnings)
    resources: dict[str, ResourceSet] = {}
    try:
        nvml = open_nvml(simulator_for(settings.simulate), None, config.flags.nvidia_driver_root)
        nvml.init()
    except NvmlError as exc:
        if config.flags.fail_on_init_error:
            raise
        notes.append(f"NVML unavailable ({exc}); failOnInitError is false: serve would idle")
    else:
        try:
            plan = build_plan(discover(nvml), config)
        finally:
            with contextlib.suppress(DevicePluginError):
                nvml.shutdown()
        resources = dict(plan.resources)
        notes.extend(plan.warnings)
    socket = pod_resources_socket(settings.kubelet_dir)
    pods, pods_note = asyncio.run(read_pods(socket)) if settings.pods else (None, "")
    return build_snapshot(
        resources,
        config,
        settings.config_file,
        pods_socket=socket if settings.pods else None,
        pods=pods,
        pods_note=pods_note,
        notes=notes,
    )


def fetch_status(source: str) -> dict[str, Any]:
    """GET `<source>/status` from a running serve, bypassing any proxy from the environment.
    Raises DevicePluginError saying why it could not be read."""
    base = source if "://" in source else f"http://{source}"
    url = base.rstrip("/") + "/status"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=FETCH_TIMEOUT_SECONDS) as answer:
            document = json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        raise DevicePluginError(f"{url} answered {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DevicePluginError(f"cannot read {url}: {reason}") from None
    if not isinstance(document, dict) or not isinstance(document.get("resources"), list):
        raise DevicePluginError(f"{url} did not answer a plugin status document")
    return document


def render(document: dict[str, Any]) -> str:
    """The document as a table per resource, then what needs attention, then pods."""
    live = bool(document.get("live"))
    header = ["RESOURCE", "DEVICES", "HEALTHY", "REPLICAS", "SOCKET"]
    rows = [
        [r["name"], str(r["total"]), str(r["healthy"]), str(r["replicas"]), r["socket"]]
        + (["yes" if r["registered"] else "no"] if live else [])
        for r in document["resources"]
    ]
    lines = _table(header + (["REGISTERED"] if live else []), rows) if rows else []
    if not rows:
        lines.append("no resources advertised")
    if live:
        reasons = document.get("not_ready") or []
        lines.append("ready: yes" if document.get("ready") else f"ready: no ({'; '.join(reasons)})")
    config = document.get("config", {})
    lines.append(f"config: {config.get('source', 'defaults')}")
    if config.get("last_error"):
        lines.append(f"last config rejected: {config['last_error']}")
    lines.extend(_unhealthy_lines(document))
    lines.extend(f"note: {note}" for note in document.get("notes", []))
    if "pods" in document:
        lines.append("")
        lines.extend(_pod_lines(document))
    return "\n".join(lines)


def _unhealthy_lines(document: dict[str, Any]) -> list[str]:
    """One line per unhealthy physical device and resource, however many replicas it backs."""
    found: dict[tuple[str, str], list[str]] = {}
    for resource in document["resources"]:
        for device in resource["devices"]:
            if device["health"] != "Healthy":
                key = (device["physical_uuid"], resource["name"])
                found.setdefault(key, []).append(device["reason"])
    return [
        f"unhealthy: {physical} ({name}"
        + (f", {len(reasons)} replicas" if len(reasons) > 1 else "")
        + f"): {reasons[0]}"
        for (physical, name), reasons in found.items()
    ]


def _pod_lines(document: dict[str, Any]) -> list[str]:
    pods = document["pods"]
    if not pods.get("known"):
        return [f"note: {pods.get('note') or 'pod assignments unknown'}"]
    rows = [
        [
            device["id"],
            resource["name"],
            f"{holder['namespace']}/{holder['pod']}",
            holder["container"],
            device["gpu_uuid"],
        ]
        for resource in document["resources"]
        for device in resource["devices"]
        for holder in device.get("pods", [])
    ]
    if not rows:
        return ["no device is held by a pod"]
    return _table(["DEVICE", "RESOURCE", "POD", "CONTAINER", "GPU"], rows)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
