"""The Kubernetes versions the real cluster can run (e2e/cluster): a version that is not pinned is
refused with exit 2 naming the pinned ones, by build.sh and by `cluster up` before either does
anything; the pinned set, each module's k8s.io/kubernetes patch and docs/cluster.md's table stay
in step; FEATURE_GATES reaches the control plane only when it is set. No build, no root."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from e2e.cluster import kubernetes_version, matrix, node, served
from e2e.cluster.components import components

REPO = Path(__file__).resolve().parent.parent
CLUSTER = REPO / "e2e" / "cluster"
BUILD = CLUSTER / "build.sh"
DOCS = REPO / "docs" / "cluster.md"
PINNED = "pinned: 1.34 1.35 1.36 1.37"


def docs_pins() -> dict[str, str]:
    """minor -> patch from docs/cluster.md's table of versions (`| 1.35 | v1.35.4 | ...`)."""
    rows = re.findall(r"^\| (1\.\d+)(?: \(default\))? \| (v1\.\d+\.\d+) \|", DOCS.read_text(), re.M)
    return dict(rows)


def test_the_pinned_set_is_the_four_versions_with_the_newest_as_default() -> None:
    assert list(kubernetes_version.pinned()) == ["1.34", "1.35", "1.36", "1.37"]
    assert kubernetes_version.default_version() == "1.37"


def test_each_module_pins_the_patch_the_docs_name() -> None:
    assert kubernetes_version.pinned() == docs_pins()


# docs/cluster.md's columns after the patch, in order: the module each names, and the tools/
# folder a version may build it in, as a module of its own (build-module.sh).
COMPANIONS = (
    ("github.com/containerd/containerd/v2", ""),
    ("github.com/opencontainers/runc", "runc"),
    ("go.etcd.io/etcd/server/v3", ""),
    ("sigs.k8s.io/cri-tools", "crictl"),
    ("github.com/containernetworking/plugins", ""),
)


def test_each_module_pins_the_companions_the_docs_name() -> None:
    """containerd, runc, etcd, crictl and the CNI plugins as go.mod selects them (after tidy)."""
    rows = {
        cells[0].removesuffix(" (default)"): cells[2:]
        for line in DOCS.read_text().splitlines()
        if re.match(r"^\| 1\.\d+(?: \(default\))? \| v1\.", line)
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    for module in kubernetes_version.module_dirs():
        minor = kubernetes_version.pinned_patch(module)[0]
        selected = []
        for path, tool in COMPANIONS:
            own = module / "tools" / tool / "go.mod"
            text = (own if tool and own.exists() else module / "go.mod").read_text()
            selected.append(re.findall(rf"^\s+{re.escape(path)} (v\S+)", text, re.M))
        assert selected == [[version] for version in rows[minor]], minor


def test_each_version_folder_is_named_for_its_module_and_builds_with_the_one_recipe() -> None:
    """The folder name is what KUBERNETES_VERSION names; the link makes build-module.sh hash and
    run the same recipe for every version, in that version's folder."""
    recipe = CLUSTER / "build-module.sh"
    for module in kubernetes_version.module_dirs()[1:]:
        assert kubernetes_version.pinned_patch(module)[0] == module.name
        link = module / "build-module.sh"
        assert link.is_symlink() and link.resolve() == recipe.resolve()


@pytest.mark.parametrize(
    ("args", "env"),
    [(["1.33"], {}), ([], {"KUBERNETES_VERSION": "1.38"}), (["v2.0", "--check"], {})],
)
def test_build_sh_refuses_a_version_that_is_not_pinned(
    tmp_path: Path, args: list[str], env: dict[str, str]
) -> None:
    cache = tmp_path / "cache"
    done = subprocess.run(
        [BUILD, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env, "E2E_CLUSTER_CACHE": str(cache)},
    )
    assert done.returncode == 2, done.stderr
    assert "is not pinned" in done.stderr and PINNED in done.stderr
    assert done.stdout == ""
    assert not cache.exists(), "it started building"


def test_build_sh_passes_a_pinned_version_to_that_versions_checks(tmp_path: Path) -> None:
    done = subprocess.run(
        [BUILD, "--check"],
        capture_output=True,
        text=True,
        env={**os.environ, "KUBERNETES_VERSION": "v1.35", "E2E_CLUSTER_CACHE": str(tmp_path)},
    )
    assert "not pinned" not in done.stderr
    assert done.returncode in (0, 1), done.stderr  # 1: a prerequisite is missing here


@pytest.fixture
def nothing_may_happen(monkeypatch: pytest.MonkeyPatch) -> None:
    """`up` must stop at the bad input: any step past it fails the test instead of running."""

    def went_on(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("cluster up went on past bad input")

    for step in ("up", "ensure_host_packages", "binaries", "clean_host"):
        monkeypatch.setattr(node, step, went_on)
    monkeypatch.setattr(subprocess, "run", went_on)


@pytest.mark.usefixtures("nothing_may_happen")
@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"KUBERNETES_VERSION": "1.33"}, "Kubernetes version '1.33' is not pinned; " + PINNED),
        ({"KUBERNETES_VERSION": "latest"}, "Kubernetes version 'latest' is not pinned; " + PINNED),
        ({"FEATURE_GATES": "DRADeviceTaints"}, "'DRADeviceTaints' is not Name=true or Name=false"),
    ],
)
def test_cluster_up_refuses_bad_input_before_doing_anything(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    env: dict[str, str],
    message: str,
) -> None:
    for name in ("KUBERNETES_VERSION", "FEATURE_GATES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert node.main(["up"]) == 2
    assert message in capsys.readouterr().err


def test_cluster_up_takes_a_pinned_version_and_its_gates(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, dict[str, bool]]] = []
    monkeypatch.setattr(node, "up", lambda version, gates, _nodes: asked.append((version, gates)))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setenv("KUBERNETES_VERSION", "v1.35")
    monkeypatch.setenv("FEATURE_GATES", "DRAPartitionableDevices=true,DRADeviceTaints=false")
    assert node.main(["up"]) == 0
    assert asked == [("1.35", {"DRAPartitionableDevices": True, "DRADeviceTaints": False})]


def test_feature_gates_reach_the_control_plane_only_when_set(tmp_path: Path) -> None:
    control_plane = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")

    def gate_flags(gates: dict[str, bool]) -> dict[str, list[str]]:
        every = components(tmp_path, gates)
        return {
            name: [arg for arg in c.args if arg.startswith("--feature-gates")]
            for name, c in every.items()
        }

    assert all(flags == [] for flags in gate_flags({}).values())
    flags = gate_flags({"DRAConsumableCapacity": True, "DRADeviceTaints": False})
    wanted = ["--feature-gates=DRAConsumableCapacity=true,DRADeviceTaints=false"]
    assert {name: flags[name] for name in control_plane} == dict.fromkeys(control_plane, wanted)
    assert flags["kubelet"] == [], "the kubelet takes its gates from its configuration file"


def test_served_follows_the_versions_default_gates_unless_feature_gates_set_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(served, "VERSION_FILE", tmp_path / "kubernetes-version")
    monkeypatch.setattr(served, "GATES_FILE", tmp_path / "feature-gates.json")
    served.VERSION_FILE.write_text("1.35\n")
    assert not served.served("DRADeviceTaints") and not served.served("DRAPartitionableDevices")
    served.GATES_FILE.write_text('{"DRADeviceTaints": true}\n')
    assert served.served("DRADeviceTaints") and not served.served("DRAConsumableCapacity")
    served.VERSION_FILE.write_text("1.36\n")
    assert served.served("DRAConsumableCapacity") and served.served("DRAExtendedResource")


def test_the_matrix_table_has_a_row_per_observed_feature_and_a_column_per_version() -> None:
    results: dict[str, matrix.Outcome] = {
        "1.35": {"kubernetes": "v1.35.4", "exit": 0, "seconds": 900, "observed": {"A": "off"}},
        "1.37": {
            "kubernetes": "v1.37.2",
            "exit": 1,
            "seconds": 800,
            "observed": {"A": "on", "B": "x"},
        },
    }
    assert matrix.table(results).splitlines() == [
        "| feature | 1.35 (v1.35.4) | 1.37 (v1.37.2) |",
        "| --- | --- | --- |",
        "| A | off | on |",
        "| B | not seen | x |",
        "| `make e2e-cluster` | exit 0, 900 s | exit 1, 800 s |",
    ]
