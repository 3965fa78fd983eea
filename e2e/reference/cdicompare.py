"""Our CDI spec beside `nvidia-ctk cdi generate`'s, on the same simulated driver root.

    python -m e2e.reference.cdicompare [PRESET...]     # as root; default: every preset

For each preset, `deviceplugin sim-root` lays out a driver root; then, in a private mount
namespace whose `/proc/driver` is a tmpfs holding the simulated node's mig-minors table (both
tools read it from `/proc`, not from the driver root), nvidia-ctk (built by `build.sh`) and our
`cdi-spec` each write a spec for that root, once per device-name strategy (`uuid`, `index`),
nvidia-ctk with the kind the reference device plugin gives it (`k8s.device-plugin.nvidia.com`,
class `gpu`). Both specs are normalised (host paths relative to the driver root, lists keyed and
sorted, Go's omitted zero major/minor as 0) and compared per device name and for the common
containerEdits: device nodes, env, mounts and hooks, field by field.

A difference is `documented` when an entry of `DOCUMENTED` explains it (the same table, with the
same reasons, is in docs/compatibility.md, "CDI: ours and nvidia-ctk"), else `unexplained`: the
exit status is then 1. Needs root (mknod, unshare, mount), Go and gcc (build.sh).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from deviceplugin.sim.node import preset_names

HERE = Path(__file__).resolve().parent
STRATEGIES = ("uuid", "index")
VENDOR, CLASS = "k8s.device-plugin.nvidia.com", "gpu"  # the reference plugin's kind
COMMON, SPEC = "(common)", "(spec)"  # scopes other than a device name
ABSENT, UNSET = "absent", "unset"
Side = Literal["ours", "nvidia-ctk"]

# One mount namespace per preset: nvidia-ctk and our cdi-spec see the simulated node's
# /proc/driver, nothing else on the host changes.
GENERATE = r"""
set -eu
root=$1 ctk=$2 python=$3 out=$4
mount -t tmpfs tmpfs /proc/driver
cp -r "$root/proc/driver/." /proc/driver/
for strategy in uuid index; do
    "$ctk" --quiet cdi generate --driver-root "$root" --dev-root "$root" \
        --vendor k8s.device-plugin.nvidia.com --class gpu \
        --device-name-strategy "$strategy" --format json --output "$out/nvidia-ctk-$strategy.json"
    "$python" -m deviceplugin cdi-spec --nvidia-driver-root "$root" \
        --device-list-strategy cdi-cri --mig-strategy mixed \
        --device-id-strategy "$strategy" -o json > "$out/ours-$strategy.json"
done
"""


@dataclass(frozen=True)
class Difference:
    """One field on which the specs disagree: where (a device name, COMMON or SPEC), which
    field (`deviceNode.type`, `mount`, ...), its key (a path, a variable, a hook) and each
    side's normalised value (ABSENT where that side has no such entry)."""

    scope: str
    field: str
    key: str
    ours: str
    theirs: str

    def only_in(self) -> Side | None:
        if self.theirs == ABSENT:
            return "ours"
        if self.ours == ABSENT:
            return "nvidia-ctk"
        return None

    def __str__(self) -> str:
        return f"{self.scope}: {self.field} {self.key}: ours {self.ours}, nvidia-ctk {self.theirs}"


@dataclass(frozen=True)
class Documented:
    """A known difference: the field, a pattern its key must match in full, the side that has
    the entry alone where it is a presence difference, and why we differ."""

    ident: str
    field: str
    key: str
    reason: str
    only_in: Side | None = None

    def matches(self, difference: Difference) -> bool:
        return (
            difference.field == self.field
            and re.fullmatch(self.key, difference.key) is not None
            and (self.only_in is None or difference.only_in() == self.only_in)
        )


HOOK = "createContainer "
DOCUMENTED: tuple[Documented, ...] = (
    Documented(
        "mig-enabled-gpu",
        "device (MIG-enabled GPU)",
        r".+",
        "A GPU in MIG mode keeps its name in our spec; nvidia-ctk defines only its MIG devices. "
        "With migStrategy none the plugin advertises such a GPU whole, and its name must "
        "resolve; with single or mixed the name is never handed out and is unused.",
        only_in="ours",
    ),
    Documented(
        "node-type",
        "deviceNode.type",
        r"/dev/.+",
        "We state type c with the major:minor, a minimal specification: the runtime can create "
        "the node (a MIG capability node in particular) without stating the host's. nvidia-ctk "
        "leaves type out and the runtime reads it from the host node; the result is the same.",
    ),
    Documented(
        "node-file-mode",
        "deviceNode.fileMode",
        r"/dev/.+",
        "nvidia-ctk copies the host node's mode; we leave it out, and the CDI library fills it "
        "from the host node when there is one (else runc's default, 0666).",
    ),
    Documented(
        "node-permissions",
        "deviceNode.permissions",
        r"/dev/.+",
        "nvidia-ctk writes rwm; we leave it out, which CDI defines as rwm.",
    ),
    Documented(
        "libcuda-dir-env",
        "env",
        r"NVIDIA_CTK_LIBCUDA_DIR",
        "Read only by nvidia-cdi-hook (its enable-cuda-compat hook); we add no such hook.",
        only_in="nvidia-ctk",
    ),
    Documented(
        "soname-link-mounts",
        "mount",
        r"/.+/lib[^/]+\.so(\.1)?",
        "We bind-mount the driver's soname and development links (libcuda.so.1, libcuda.so) "
        "as found on the host; nvidia-ctk mounts only the versioned files and has its "
        "create-symlinks hook make the links inside the container.",
        only_in="ours",
    ),
    Documented(
        "simulation-mounts",
        "mount",
        r"/etc/deviceplugin-sim|/.+/deviceplugin-sim-node\.json",
        "Only on a driver root marked as simulated: the simulated libnvidia-ml.so.1 in the "
        "container reads its node file beside itself, and the state every process on the node "
        "shares (MIG layout, memory limits, compute modes) in etc/deviceplugin-sim. A real "
        "driver root gets neither mount.",
        only_in="ours",
    ),
    Documented(
        "hook-create-symlinks",
        "hook",
        HOOK + "create-symlinks",
        "We ship no nvidia-cdi-hook binary on the host: the links it would create are "
        "mounted instead (soname-link-mounts).",
        only_in="nvidia-ctk",
    ),
    Documented(
        "hook-update-ldcache",
        "hook",
        HOOK + "update-ldcache",
        "No hook binary on the host. The libraries and their links are mounted into the "
        "directory they have on the host, which a container's loader searches without a cache "
        "update where the image is of the host's distribution family (multiarch directories on "
        "Debian and Ubuntu, /usr/lib64 on RHEL); an image of another family must add the "
        "directory to its ld.so.conf and run ldconfig, or set LD_LIBRARY_PATH.",
        only_in="nvidia-ctk",
    ),
    Documented(
        "hook-enable-cuda-compat",
        "hook",
        HOOK + "enable-cuda-compat",
        "No hook binary on the host: CUDA forward-compatibility libraries shipped in an image "
        "are not put ahead of the driver's; such an image must set LD_LIBRARY_PATH itself.",
        only_in="nvidia-ctk",
    ),
    Documented(
        "hook-disable-device-node-modification",
        "hook",
        HOOK + "disable-device-node-modification",
        "No hook binary on the host: the hook stops the NVIDIA library in the container from "
        "creating device nodes; our spec already injects every node the device needs.",
        only_in="nvidia-ctk",
    ),
    Documented(
        "hook-apply-cuda-memory-limits",
        "hook",
        r"createRuntime apply-cuda-memory-limits( #\d+)?",
        "No hook binary on the host: the hook caps a container's GPU memory from its "
        "NVIDIA_GPU_MEMORY_REQUEST / NVIDIA_GPU_MEMORY_LIMIT variables (cgroup v2 only); we "
        "offer no per-container GPU memory limit, and such variables are ignored.",
        only_in="nvidia-ctk",
    ),
    Documented(
        "hook-update-application-profile",
        "hook",
        HOOK + "update-application-profile",
        "No hook binary on the host: the hook writes a driver application profile for "
        "graphics workloads, which this compute plugin does not serve.",
        only_in="nvidia-ctk",
    ),
)


@dataclass
class Outcome:
    """One preset and strategy compared: how many fields agree and every difference."""

    preset: str
    strategy: str
    agreed: int = 0
    differences: list[Difference] = field(default_factory=list)

    def explained(self) -> list[tuple[Difference, Documented]]:
        return [(d, doc) for d in self.differences if (doc := explain(d)) is not None]

    def unexplained(self) -> list[Difference]:
        return [d for d in self.differences if explain(d) is None]


def explain(difference: Difference) -> Documented | None:
    return next((doc for doc in DOCUMENTED if doc.matches(difference)), None)


def compare(ours: Mapping[str, Any], theirs: Mapping[str, Any], root: str) -> Outcome:
    """Compare two specs generated for the driver root `root` (Outcome's preset and strategy
    left empty for the caller)."""
    outcome = Outcome("", "")
    for key in ("kind", "cdiVersion"):
        _check(outcome, SPEC, key, "", str(ours.get(key)), str(theirs.get(key)))
    our_devices = {d["name"]: d.get("containerEdits", {}) for d in ours.get("devices", ())}
    their_devices = {d["name"]: d.get("containerEdits", {}) for d in theirs.get("devices", ())}
    parents = mig_enabled_gpus(ours)
    for name in sorted(our_devices.keys() | their_devices.keys()):
        if name in our_devices and name in their_devices:
            outcome.agreed += 1
            _compare_edits(outcome, name, our_devices[name], their_devices[name], root)
        else:
            kind = "device (MIG-enabled GPU)" if name in parents else "device"
            outcome.differences.append(
                _presence(name, kind, name, name in our_devices, name in their_devices)
            )
    _compare_edits(
        outcome, COMMON, ours.get("containerEdits", {}), theirs.get("containerEdits", {}), root
    )
    return outcome


def mig_enabled_gpus(spec: Mapping[str, Any]) -> set[str]:
    """The names of devices that are a GPU whose node is also a MIG device's parent node (a MIG
    device: one with a capability node under /dev/nvidia-caps)."""
    nodes = {
        d["name"]: {n["path"] for n in d.get("containerEdits", {}).get("deviceNodes", ())}
        for d in spec.get("devices", ())
        if d["name"] != "all"
    }
    mig_parents = set().union(
        *(paths for paths in nodes.values() if any("/nvidia-caps/" in p for p in paths))
    )
    return {
        name
        for name, paths in nodes.items()
        if paths and not any("/nvidia-caps/" in p for p in paths) and paths <= mig_parents
    }


def _compare_edits(
    outcome: Outcome, scope: str, ours: Mapping[str, Any], theirs: Mapping[str, Any], root: str
) -> None:
    for kind, entries in (("deviceNode", "deviceNodes"), ("mount", "mounts"), ("hook", "hooks")):
        _compare_keyed(
            outcome, scope, kind, _keyed(ours, entries, root), _keyed(theirs, entries, root)
        )
    _compare_keyed(outcome, scope, "env", _env(ours), _env(theirs))
    for key in sorted((ours.keys() | theirs.keys()) - {"deviceNodes", "env", "mounts", "hooks"}):
        _check(outcome, scope, key, "", _text(ours.get(key)), _text(theirs.get(key)))


def _compare_keyed(
    outcome: Outcome,
    scope: str,
    kind: str,
    ours: Mapping[str, Mapping[str, str]],
    theirs: Mapping[str, Mapping[str, str]],
) -> None:
    """Entries keyed by path, variable or hook: presence, then each attribute."""
    for key in sorted(ours.keys() | theirs.keys()):
        if key not in ours or key not in theirs:
            outcome.differences.append(_presence(scope, kind, key, key in ours, key in theirs))
            continue
        outcome.agreed += 1
        for attribute in sorted(ours[key].keys() | theirs[key].keys()):
            _check(
                outcome,
                scope,
                f"{kind}.{attribute}",
                key,
                ours[key].get(attribute, UNSET),
                theirs[key].get(attribute, UNSET),
            )


def _presence(scope: str, kind: str, key: str, in_ours: bool, in_theirs: bool) -> Difference:
    """An entry that one side has and the other lacks."""
    return Difference(
        scope, kind, key, "present" if in_ours else ABSENT, "present" if in_theirs else ABSENT
    )


def _check(outcome: Outcome, scope: str, name: str, key: str, ours: str, theirs: str) -> None:
    if ours == theirs:
        outcome.agreed += 1
    else:
        outcome.differences.append(Difference(scope, name, key, ours, theirs))


def _keyed(edits: Mapping[str, Any], kind: str, root: str) -> dict[str, dict[str, str]]:
    """Device nodes by path, mounts by container path, hooks by `hookName subcommand`, each
    as attribute -> normalised text."""
    keyed: dict[str, dict[str, str]] = {}
    for entry in edits.get(kind, ()):
        if kind == "deviceNodes":
            key = entry["path"]
            values = {k: v for k, v in entry.items() if k != "path"}
            values.setdefault("major", 0)  # Go omits a zero major or minor
            values.setdefault("minor", 0)
        elif kind == "mounts":
            key = entry["containerPath"]
            values = {k: v for k, v in entry.items() if k != "containerPath"}
        else:
            args = entry.get("args") or [entry["path"]]
            key = f"{entry['hookName']} {args[1] if len(args) > 1 else Path(args[0]).name}"
            values = {k: v for k, v in entry.items() if k != "hookName"}
        if "hostPath" in values:
            values["hostPath"] = _relative(str(values["hostPath"]), root)
        repeat = sum(1 for k in keyed if k == key or k.startswith(f"{key} #"))
        keyed[f"{key} #{repeat + 1}" if repeat else key] = {k: _text(v) for k, v in values.items()}
    return keyed


def _env(edits: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    pairs = (str(item).partition("=") for item in edits.get("env", ()))
    return {name: {"value": value} for name, _, value in pairs}


def _relative(path: str, root: str) -> str:
    """A host path under the driver root as the path inside it; any other as it is."""
    root = root.rstrip("/")
    return path[len(root) :] if path.startswith(root + "/") else path


def _text(value: Any) -> str:
    if value is None:
        return UNSET
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


def nvidia_ctk() -> Path:
    """nvidia-ctk as build.sh builds it (instant once cached)."""
    result = subprocess.run([str(HERE / "build.sh")], check=True, stdout=subprocess.PIPE, text=True)
    return Path(result.stdout.strip().splitlines()[-1]) / "nvidia-ctk"


def run_preset(preset: str, ctk: Path) -> list[Outcome]:
    """Lay out the preset's driver root, generate both specs per strategy, compare them."""
    with tempfile.TemporaryDirectory(prefix=f"cdicompare-{preset}-") as temp:
        root, out = Path(temp) / "root", Path(temp) / "out"
        out.mkdir()
        python = sys.executable
        subprocess.run(
            [python, "-m", "deviceplugin", "sim-root", preset, str(root)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        subprocess.run(
            [
                *("unshare", "-m", "--propagation", "private", "sh", "-c", GENERATE, "sh"),
                *(str(root), str(ctk), python, str(out)),
            ],
            check=True,
        )
        outcomes = []
        for strategy in STRATEGIES:
            ours = json.loads((out / f"ours-{strategy}.json").read_text())
            theirs = json.loads((out / f"nvidia-ctk-{strategy}.json").read_text())
            outcome = compare(ours, theirs, str(root))
            outcome.preset, outcome.strategy = preset, strategy
            outcomes.append(outcome)
        return outcomes


def report(outcomes: Iterable[Outcome], verbose: bool = False, examples: int = 3) -> str:
    """Per preset and strategy: the counts, every unexplained difference, and the documented
    ones grouped by entry (all of them with `verbose`); then the table of reasons."""
    lines: list[str] = []
    used: set[str] = set()
    for outcome in outcomes:
        explained, unexplained = outcome.explained(), outcome.unexplained()
        lines.append(
            f"{outcome.preset} ({outcome.strategy} names): {outcome.agreed} fields agree, "
            f"{len(outcome.differences)} differ: {len(explained)} documented, "
            f"{len(unexplained)} unexplained"
        )
        lines.extend(f"  UNEXPLAINED {d}" for d in unexplained)
        by_entry: dict[str, list[Difference]] = {}
        for difference, doc in explained:
            by_entry.setdefault(doc.ident, []).append(difference)
        for ident, differences in by_entry.items():
            used.add(ident)
            shown = differences if verbose else differences[:examples]
            more = len(differences) - len(shown)
            lines.append(f"  documented {ident} ({len(differences)}):")
            lines.extend(f"    {d}" for d in shown)
            if more:
                lines.append(f"    ... and {more} more")
    lines.append("")
    lines.append("Documented differences:")
    for doc in DOCUMENTED:
        seen = "" if doc.ident in used else " (not seen in this run)"
        lines.append(f"  {doc.ident}{seen}: {doc.reason}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.reference.cdicompare")
    parser.add_argument("presets", nargs="*", metavar="PRESET", help="default: every preset")
    parser.add_argument("-v", "--verbose", action="store_true", help="list every difference")
    args = parser.parse_args(argv)
    ctk = nvidia_ctk()
    outcomes = [o for preset in args.presets or preset_names() for o in run_preset(preset, ctk)]
    print(report(outcomes, args.verbose))
    return 1 if any(o.unexplained() for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
