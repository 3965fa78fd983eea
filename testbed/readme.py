"""The README's command blocks, read as tests/test_readme.py (on a simulated node) and
e2e/cluster/test_readme_quickstart.py (on the real cluster) run them, so that no command the
README shows can drift from the code.

The convention, written in the README as HTML comments that do not render:

- a fenced ```sh (or bash, shell, console) block is a command block, and the comment on the
  line before it says where it runs: `<!-- readme-test: sim -->` on a simulated node, `<!--
  readme-test: cluster NAME -->` on a real cluster (the quick-start test runs each by NAME, in
  the order a reader would), `<!-- readme-test: make -->` make targets, checked with a dry run;
- a ```text block right after a sim block is its output: its lines must come out as shown, in
  order and together, a line `...` standing for any number of lines;
- `<!-- readme-test: values FILE -->` before a ```yaml block: a Helm values file the reader
  writes as FILE.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
COMMAND_LANGUAGES = {"sh", "bash", "shell", "console"}
PLACES = {"sim", "cluster", "make", "values"}
ELLIPSIS = "..."

_MARKER = re.compile(r"<!--\s*readme-test:\s*(?P<where>[\w-]+)(?:\s+(?P<name>\S+))?\s*-->")
_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<info>[\w-]*)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block of the README, with the marker before it (if any)."""

    line: int  # of the opening fence, 1-based
    info: str  # the fence's language
    code: str  # without the fence's indentation
    where: str = ""  # sim, cluster, make or values; "" without a marker
    name: str = ""  # a cluster block's name, a values block's file
    output: tuple[str, ...] | None = None  # a sim block's ```text block

    def __str__(self) -> str:
        label = " ".join(part for part in (self.where or "unmarked", self.name) if part)
        return f"README.md:{self.line} ({label})"


def _fenced(lines: list[str]) -> list[tuple[int, int, str, str]]:
    """(opening line index, closing line index, info, code) of every fenced block."""
    found = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent = opening["indent"]
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        body = [
            line[len(indent) :] if line.startswith(indent) else line
            for line in lines[index + 1 : end]
        ]
        found.append((index, end, opening["info"], "\n".join(body) + "\n"))
        index = end + 1
    return found


def _before(lines: list[str], index: int) -> int:
    """The index of the last non-blank line before line `index` (-1: none)."""
    return next((at for at in range(index - 1, -1, -1) if lines[at].strip()), -1)


def blocks(text: str) -> list[Block]:
    """Every fenced block of `text`, in order; a sim block's output block is not one of them
    but that block's `output`."""
    lines = text.splitlines()
    fenced = _fenced(lines)
    result: list[Block] = []
    closing_of_sim: int | None = None
    for opening, closing, info, code in fenced:
        previous = _before(lines, opening)
        if info == "text" and closing_of_sim is not None and previous == closing_of_sim:
            shown = tuple(line.rstrip() for line in code.splitlines())
            result[-1] = replace(result[-1], output=shown)
            closing_of_sim = None
            continue
        marker = _MARKER.fullmatch(lines[previous].strip()) if previous >= 0 else None
        where, name = (marker["where"], marker["name"] or "") if marker else ("", "")
        result.append(Block(opening + 1, info, code, where, name))
        # a sim block's output is the ```text block that comes next, with only blank lines between
        closing_of_sim = closing if where == "sim" else None
    return result


def readme_blocks() -> list[Block]:
    return blocks(README.read_text())


def command_blocks(where: str) -> list[Block]:
    return [block for block in readme_blocks() if block.where == where]


def cluster_block(name: str) -> Block:
    (found,) = [block for block in command_blocks("cluster") if block.name == name]
    return found


def missing_output(actual: str, shown: tuple[str, ...]) -> str | None:
    """None when `actual` holds the lines `shown`, in order and contiguous between `...` lines
    (a shown output that does not start or end with `...` starts or ends the actual one);
    otherwise the first shown line not found where it should be."""
    lines = [line.rstrip() for line in actual.splitlines()]
    runs: list[list[str]] = [[]]
    for line in shown:
        if line == ELLIPSIS:
            runs.append([])
        else:
            runs[-1].append(line)
    anchored_start = not shown or shown[0] != ELLIPSIS
    anchored_end = not shown or shown[-1] != ELLIPSIS
    position = 0
    for number, run in enumerate(runs):
        if not run:
            continue
        first = number == 0 and anchored_start
        candidates = [position] if first else range(position, len(lines) - len(run) + 1)
        start = next((at for at in candidates if lines[at : at + len(run)] == run), None)
        if start is None:
            return run[0]
        position = start + len(run)
    if anchored_end and runs[-1] and position != len(lines):
        return f"(nothing after {runs[-1][-1]!r}, but {lines[position]!r} follows)"
    return None


def commands(code: str) -> list[list[str]]:
    """The simple commands of a block (continuation lines joined, comments and heredoc bodies
    left out), each split as the shell splits it."""
    found: list[list[str]] = []
    heredoc_end: str | None = None
    pending = ""
    for line in code.splitlines():
        if heredoc_end is not None:
            if line.strip() == heredoc_end:
                heredoc_end = None
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        words = shlex.split(pending, comments=True)
        pending = ""
        if not words:
            continue
        heredoc = re.search(r"<<-?\s*'?(\w+)'?", line)
        if heredoc:
            heredoc_end = heredoc.group(1)
        found.append(words)
    return found


def heredocs(code: str) -> list[str]:
    """The bodies of the block's heredocs, in order."""
    return [
        match.group(2)
        for match in re.finditer(r"<<-?\s*'?(\w+)'?[^\n]*\n(.*?)^\1$", code, re.S | re.M)
    ]
