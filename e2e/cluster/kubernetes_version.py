"""Which Kubernetes the cluster runs: `KUBERNETES_VERSION` (a minor such as 1.35), one of the
versions pinned beside this file, and the optional `FEATURE_GATES`. Each pinned version is a Go
module that build.sh builds: ./go.mod is the default, versions/<minor>/go.mod every other one.
The pinned set is read from those files, so build.sh, `cluster up` and the docs' table cannot
name different versions."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from e2e.cluster.layout import HERE

_PIN = re.compile(r"^\s*k8s\.io/kubernetes (v1\.(\d+)\.\d+)\b", re.MULTILINE)
_GATE = re.compile(r"^[A-Za-z0-9]+=(true|false)$")


class BadInput(ValueError):
    """A version or gate list `cluster up` cannot run with; it exits 2 naming what it accepts."""


def module_dirs() -> list[Path]:
    """The default module's folder first, then each version folder."""
    return [HERE, *sorted(p.parent for p in (HERE / "versions").glob("*/go.mod"))]


def pinned_patch(module: Path) -> tuple[str, str]:
    """(minor, patch) of the k8s.io/kubernetes a module's go.mod requires: ("1.35", "v1.35.4")."""
    found = _PIN.search((module / "go.mod").read_text())
    if found is None:
        raise ValueError(f"{module / 'go.mod'} requires no k8s.io/kubernetes")
    return f"1.{found.group(2)}", found.group(1)


def pinned() -> dict[str, str]:
    """Every pinned minor and its patch, oldest first."""
    pins = dict(pinned_patch(module) for module in module_dirs())
    return dict(sorted(pins.items(), key=lambda item: int(item[0].split(".")[1])))


def default_version() -> str:
    return pinned_patch(HERE)[0]


def chosen(environ: Mapping[str, str]) -> str:
    """The minor `KUBERNETES_VERSION` asks for (a leading v allowed), else the default."""
    asked = environ.get("KUBERNETES_VERSION", "").strip().removeprefix("v") or default_version()
    pins = pinned()
    if asked not in pins:
        raise BadInput(
            f"Kubernetes version {asked!r} is not pinned; pinned: {' '.join(pins)}"
            f" (KUBERNETES_VERSION, default {default_version()})"
        )
    return asked


def feature_gates(environ: Mapping[str, str]) -> dict[str, bool]:
    """`FEATURE_GATES=Name=true,Other=false` as a map; empty (the version's defaults) if unset."""
    text = environ.get("FEATURE_GATES", "").strip()
    if not text:
        return {}
    gates: dict[str, bool] = {}
    for item in text.split(","):
        item = item.strip()
        if not _GATE.match(item):
            raise BadInput(f"FEATURE_GATES: {item!r} is not Name=true or Name=false")
        name, value = item.split("=")
        gates[name] = value == "true"
    return gates


def as_flag(gates: Mapping[str, bool]) -> tuple[str, ...]:
    """The `--feature-gates` flag the control plane takes, or nothing for the defaults."""
    if not gates:
        return ()
    return ("--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in gates.items()),)
