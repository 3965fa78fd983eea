"""What `make bench-reference`'s tables are made of: one row per measure with our figure, the
reference's and the ratio, ours ÷ reference; a reference cut at its time limit reads as a
bound. Shared by the device-plugin table (bench/reference.py) and the DRA one
(bench/drareference.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bench.report import median, number

OURS, REFERENCE = "ours", "reference"


class BenchError(Exception):
    """A measure could not be taken: a plugin exited or never showed the expected state."""


@dataclass
class Row:
    """One measure for both plugins. `reference` is None when it took longer than `limit`."""

    measure: str
    unit: str
    ours: float | None
    reference: float | None
    limit: float | None = None
    samples: dict[str, list[float]] = field(default_factory=dict)
    error: str = ""

    def cells(self) -> tuple[str, str, str]:
        """The values and the ratio as the table shows them."""
        if self.error:
            return f"error: {self.error.splitlines()[0]}", "", ""
        ours = number(self.ours, self.unit)
        if self.reference is None and self.limit is not None:
            ratio = "" if self.ours is None else f"< {number(self.ours / self.limit, 'x')}"
            return ours, f"> {number(self.limit, self.unit)}", ratio
        reference = number(self.reference, self.unit)
        if self.ours is None or not self.reference:
            return ours, reference, "—"
        return ours, reference, number(self.ours / self.reference, "x")


def table(rows: Sequence[Row], reference: str = "reference v0.19.0") -> str:
    """The markdown table: measure, ours, the reference (named `reference`), ours ÷ it."""
    lines = [
        f"| measure | ours | {reference} | ours ÷ reference |",
        "| --- | ---: | ---: | ---: |",
    ]
    lines += [f"| {row.measure} | {' | '.join(row.cells())} |" for row in rows]
    return "\n".join(lines)


def from_samples(
    measure: str, unit: str, samples: Mapping[str, list[float]], limit: float | None = None
) -> Row:
    """A row of the medians of each plugin's samples; none for the reference: over `limit`."""
    reference = median(samples[REFERENCE]) if samples[REFERENCE] else None
    return Row(measure, unit, median(samples[OURS]), reference, limit, dict(samples))
