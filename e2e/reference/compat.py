"""`make compat`: NVIDIA's reference device plugin as the oracle. Both plugins run, one at a
time, on the same simulated driver root with the same config file against the same kubelet
emulator, for every preset and a matrix of configurations; what each advertises is compared
field by field. A difference is either documented (known.py: its reason, and
docs/compatibility.md) or unexplained, and an unexplained one fails the run.

    python -m e2e.reference.compat            # the full matrix
    python -m e2e.reference.compat --quick    # the subset CI runs
    python -m e2e.reference.compat --case NAME --show   # one case, both answers printed

With `sharing.mps`, NVIDIA's `mps-control-daemon` runs beside its plugin (started first, as its
chart starts it) and ours starts its daemons itself; what the simulated control daemons were
told, the limits they hold and the GPUs' compute modes are compared too (mpsstate.py).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from deviceplugin.node.mpsshm import release_shm
from e2e.reference.advertised import Advertised, MpsNode, advertised, in_turn
from e2e.reference.known import Difference, explain
from e2e.reference.mpsstate import after_stop
from testbed import plugins

CONFIG_DIR = plugins.REPO / "config"
PRESETS = ("a100-80gb-x8-mixed", "a30-x4-mig", "a10-x8", "h100-x8", "dgx1-hybrid-cube")
MIG_PRESETS = ("a100-80gb-x8-mixed", "a30-x4-mig")
LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")


@dataclass(frozen=True)
class Case:
    """One input: a preset and the v1 config file both plugins are given."""

    name: str
    preset: str
    config: str  # the file's text

    @staticmethod
    def of(name: str, preset: str, config: dict[str, Any]) -> Case:
        return Case(name, preset, yaml.safe_dump({"version": "v1", **config}, sort_keys=False))


def _flags(**plugin: Any) -> dict[str, Any]:
    return {"flags": {"plugin": plugin}} if plugin else {}


def config_file_cases() -> Iterator[Case]:
    """Every file in config/ on every preset."""
    for path in sorted(CONFIG_DIR.glob("*.yaml")):
        for preset in PRESETS:
            yield Case(f"config/{path.name} on {preset}", preset, path.read_text())


def mig_strategy_cases() -> Iterator[Case]:
    for preset in (*MIG_PRESETS, "h100-x8"):
        for strategy in ("none", "single", "mixed"):
            config = {"flags": {"migStrategy": strategy}}
            yield Case.of(f"migStrategy {strategy} on {preset}", preset, config)


def plugin_flag_cases(presets: tuple[str, ...]) -> Iterator[Case]:
    """Device list strategy x passDeviceSpecs x deviceIDStrategy."""
    for preset in presets:
        for strategy in LIST_STRATEGIES:
            for specs in (False, True):
                for id_strategy in ("uuid", "index"):
                    config = {
                        "flags": {
                            "migStrategy": "mixed" if preset in MIG_PRESETS else "none",
                            "plugin": {
                                "deviceListStrategy": [strategy],
                                "passDeviceSpecs": specs,
                                "deviceIDStrategy": id_strategy,
                            },
                        }
                    }
                    name = f"{strategy}, passDeviceSpecs {specs}, {id_strategy} IDs on {preset}"
                    yield Case.of(name, preset, config)


def time_slicing_cases(presets: tuple[str, ...]) -> Iterator[Case]:
    for preset in presets:
        for rename in (False, True):
            for fail_over_one in (False, True):
                sharing = {
                    "timeSlicing": {
                        "renameByDefault": rename,
                        "failRequestsGreaterThanOne": fail_over_one,
                        "resources": [{"name": "nvidia.com/gpu", "replicas": 3}],
                    }
                }
                name = (
                    f"time-slicing x3, renameByDefault {rename}, "
                    f"failRequestsGreaterThanOne {fail_over_one} on {preset}"
                )
                yield Case.of(name, preset, {"sharing": sharing})


# A case's `flags.mpsRoot`: each run puts its own folder there (compat writes in it, and
# NVIDIA's daemon sees it as /mps).
MPS_ROOT = "@MPS_ROOT@"


def mps(replicas: int, rename: bool = False, **flags: Any) -> dict[str, Any]:
    resources = [{"name": "nvidia.com/gpu", "replicas": replicas}]
    return {
        "flags": {"migStrategy": "none", "mpsRoot": MPS_ROOT, **flags},
        "sharing": {"mps": {"renameByDefault": rename, "resources": resources}},
    }


def mps_cases() -> Iterator[Case]:
    """MPS: NVIDIA's daemon and plugin against ours, with and without renameByDefault, in
    every device list strategy, and the configurations both refuse."""
    for preset, replicas in (("a100-80gb-x8-mixed", 4), ("h100-x8", 3)):
        for rename in (False, True):
            name = f"MPS x{replicas}, renameByDefault {rename} on {preset}"
            yield Case.of(name, preset, mps(replicas, rename))
    for strategy in LIST_STRATEGIES:
        config = mps(4, plugin={"deviceListStrategy": [strategy]})
        yield Case.of(f"MPS x4, {strategy} on a10-x8", "a10-x8", config)
    yield Case.of(
        "MPS x4, migStrategy mixed on a30-x4-mig", "a30-x4-mig", mps(4, migStrategy="mixed")
    )
    without_root = mps(4)
    del without_root["flags"]["mpsRoot"]
    yield Case.of("MPS x4 without mpsRoot on a10-x8", "a10-x8", without_root)
    # Two GPUs shared, the others whole: the reference ignores `devices` and `rename`.
    for renamed in (True, False):
        some = mps(4)
        (resource,) = some["sharing"]["mps"]["resources"]
        resource["devices"] = [0, 1]
        if renamed:
            resource["rename"] = "nvidia.com/gpu.shared"
        name = f"MPS x4, GPUs 0 and 1 {'renamed' if renamed else 'without rename'} on a10-x8"
        yield Case.of(name, "a10-x8", some)


def full_matrix() -> list[Case]:
    return [
        *config_file_cases(),
        *mig_strategy_cases(),
        *plugin_flag_cases(("a10-x8", "a100-80gb-x8-mixed")),
        *time_slicing_cases(("a10-x8", "h100-x8")),
        *mps_cases(),
    ]


def quick_matrix() -> list[Case]:
    """CI's subset: the seed config on a few presets and the main strategies."""
    seed = (CONFIG_DIR / "seed.yaml").read_text()
    cases = [Case(f"config/seed.yaml on {p}", p, seed) for p in ("a100-80gb-x8-mixed", "a10-x8")]
    flags = {c.name: c for c in plugin_flag_cases(("a100-80gb-x8-mixed",))}
    for strategy in LIST_STRATEGIES:
        cases.append(flags[f"{strategy}, passDeviceSpecs True, uuid IDs on a100-80gb-x8-mixed"])
    cases += [c for c in mig_strategy_cases() if c.preset == "a30-x4-mig"]
    cases += [c for c in mps_cases() if c.name == MPS_SEED_CASE]
    return cases


# The example: 8 A100s, 4 of them in MIG mode (advertised whole with migStrategy none).
MPS_SEED_CASE = "MPS x4, renameByDefault False on a100-80gb-x8-mixed"


# --- comparing ---------------------------------------------------------------------------------


def compare(case: str, ours: Advertised, reference: Advertised) -> Iterator[Difference]:
    """Every field where the two answers differ, named by its path."""
    if ours.failed or reference.failed:
        if bool(ours.failed) != bool(reference.failed):
            yield Difference(case, "started", ours.failed or "served", reference.failed or "served")
        return
    yield from _walk(case, "", ours.resources, reference.resources)
    yield from _walk(case, "mps", ours.mps, reference.mps)


def _walk(case: str, path: str, ours: Any, reference: Any) -> Iterator[Difference]:
    if isinstance(ours, dict) and isinstance(reference, dict):
        for key in sorted(set(ours) | set(reference)):
            inner = f"{path}.{key}" if path else str(key)
            if key not in ours:
                yield Difference(case, inner, None, reference[key])
            elif key not in reference:
                yield Difference(case, inner, ours[key], None)
            else:
                yield from _walk(case, inner, ours[key], reference[key])
    elif ours != reference:
        yield Difference(case, path, ours, reference)


# --- running ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    case: Case
    ours: Advertised
    reference: Advertised
    differences: list[Difference]
    seconds: float


async def run_case(case: Case, binaries: Path, work: Path, roots: dict[str, Path]) -> Outcome:
    began = time.monotonic()
    if case.preset not in roots:
        roots[case.preset] = plugins.sim_root(case.preset, work / f"root-{case.preset}")
    root = roots[case.preset]
    config = work / "config.yaml"
    mps_root = work / "mps" if MPS_ROOT in case.config else None
    config.write_text(case.config.replace(MPS_ROOT, str(mps_root)))
    observe = functools.partial(advertised, mps=MpsNode(mps_root, root) if mps_root else None)
    left: dict[str, Any] = {}

    def stopped(name: str) -> None:
        if mps_root is not None:
            left[name] = after_stop(mps_root, root)

    answers = await in_turn(
        binaries, root, config, work, observe, mps_root=mps_root, stopped=stopped
    )
    if mps_root is not None:  # run as root, our serve made its shm a tmpfs: not left behind
        release_shm(str(mps_root / "shm"))
    for name, state in left.items():
        if answers[name].mps:
            answers[name].mps["afterStop"] = state
    differences = list(compare(case.name, answers["ours"], answers["reference"]))
    return Outcome(
        case, answers["ours"], answers["reference"], differences, time.monotonic() - began
    )


async def run(cases: list[Case], binaries: Path, show: bool = False) -> list[Outcome]:
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="dp-compat-") as temp:
        roots: dict[str, Path] = {}
        for case in cases:
            outcome = await run_case(case, binaries, Path(temp), roots)
            outcomes.append(outcome)
            _report(outcome, show)
    return outcomes


def _report(outcome: Outcome, show: bool) -> None:
    unexplained = [d for d in outcome.differences if explain(d) is None]
    documented = len(outcome.differences) - len(unexplained)
    verdict = (
        "agree" if not outcome.differences else ("documented" if not unexplained else "DIFFER")
    )
    print(
        f"{verdict:10} {outcome.case.name} ({documented} documented, {outcome.seconds:.1f} s)",
        flush=True,
    )
    for difference in unexplained:
        print(f"    {difference}", flush=True)
    if show:
        both = {"ours": outcome.ours.__dict__, "reference": outcome.reference.__dict__}
        print(json.dumps(both, indent=1, sort_keys=True))


PREFERENCE = "Preferred allocation: policy and ties"


def summary(outcomes: list[Outcome]) -> tuple[str, bool]:
    """The closing lines, and whether every difference is documented."""
    unexplained = [d for o in outcomes for d in o.differences if explain(d) is None]
    fields: dict[str, int] = {}
    cases: dict[str, int] = {}
    agree = only_preference = 0
    for outcome in outcomes:
        titles = {getattr(explain(d), "title", "unexplained") for d in outcome.differences}
        agree += not titles
        only_preference += titles == {PREFERENCE}
        for title in titles:
            cases[title] = cases.get(title, 0) + 1
        for difference in outcome.differences:
            known = explain(difference)
            if known is not None:
                fields[known.title] = fields.get(known.title, 0) + 1
    lines = [
        f"{len(outcomes)} cases: {agree} agree field by field, {only_preference} more differ only "
        f"in which valid preferred allocation each picks; "
        + (
            f"{len(unexplained)} unexplained differences"
            if unexplained
            else "every other difference is documented"
        ),
        *(
            f"  {title}: {cases[title]} cases, {count} fields"
            for title, count in sorted(fields.items())
        ),
    ]
    return "\n".join(lines), not unexplained


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.reference.compat")
    parser.add_argument("--quick", action="store_true", help="only the subset CI runs")
    parser.add_argument("--case", action="append", default=[], help="run cases containing this")
    parser.add_argument("--show", action="store_true", help="print both answers of each case")
    arguments = parser.parse_args(argv)
    try:
        binaries = plugins.runnable_binaries()
    except plugins.ReferenceUnavailable as exc:
        print(f"compat: {exc}", file=sys.stderr)
        return 2
    cases = quick_matrix() if arguments.quick else full_matrix()
    if arguments.case:
        cases = [c for c in cases if any(part in c.name for part in arguments.case)]
    began = time.monotonic()
    outcomes = asyncio.run(run(cases, binaries, arguments.show))
    text, ok = summary(outcomes)
    print(f"\n{text}\n({time.monotonic() - began:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
