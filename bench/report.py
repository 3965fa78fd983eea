"""The benchmark's one table (markdown, so it pastes into docs/performance.md) and its JSON.

A target is a goal, not an assertion: a figure over its target reads "miss", and the run still
succeeds. Only a measure that could not be taken at all (the plugin broke) reads "error".
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc


@dataclass
class Figure:
    """One row: a measured value, its goal (value <= target) and a same-run baseline."""

    measure: str
    value: float | None
    unit: str
    target: float | None = None
    baseline: float | None = None
    baseline_label: str = ""
    samples: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def result(self) -> str:
        if self.error:
            return "error"
        if self.target is None or self.value is None:
            return ""
        return "pass" if self.value <= self.target else "miss"


median = statistics.median


def p99(samples: Sequence[float]) -> float:
    """Nearest-rank 99th percentile."""
    return nearest_rank(samples, 0.99)


def p95(samples: Sequence[float]) -> float:
    """Nearest-rank 95th percentile."""
    return nearest_rank(samples, 0.95)


def nearest_rank(samples: Sequence[float], fraction: float) -> float:
    """The sample at rank ceil(n * fraction), counting from 1 in ascending order."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(len(ordered) * fraction) - 1)]


def number(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    digits = 3 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    text = f"{value:.{digits}f}"
    return f"{text}x" if unit == "x" else f"{text} {unit}".rstrip()


def table(figures: Sequence[Figure]) -> str:
    """The markdown table: measure, value, target, result, baseline."""
    rows = [
        "| measure | value | target | result | baseline (same run) |",
        "| --- | ---: | ---: | --- | --- |",
    ]
    for f in figures:
        target = f"≤ {number(f.target, f.unit)}" if f.target is not None else ""
        value = f"error: {f.error.splitlines()[0]}" if f.error else number(f.value, f.unit)
        if f.samples and len(f.samples) > 1 and not f.error:
            value += f" (median of {len(f.samples)})"
        base = ""
        if f.baseline is not None:
            base = f"{number(f.baseline, f.unit)} {f.baseline_label}".strip()
        elif f.baseline_label:
            base = f.baseline_label
        rows.append(f"| {f.measure} | {value} | {target} | {f.result} | {base} |")
    return "\n".join(rows)


def machine() -> dict[str, str | int]:
    """What the figures were measured on."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "kernel": platform.release(),
    }


def write_json(path: Path, figures: Sequence[Figure], extra: dict[str, object]) -> None:
    """Every figure with its samples, plus run metadata, for tooling to compare runs."""
    payload = {
        "machine": machine(),
        **extra,
        "figures": [{**asdict(f), "result": f.result} for f in figures],
    }
    path.write_text(json.dumps(payload, indent=2, allow_nan=False, default=str) + "\n")
