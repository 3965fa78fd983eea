"""Every command block of the README runs, so the README cannot drift from the code.

The blocks marked `sim` run here as written, in bash, on a simulated node, from a folder that
holds the clone's config/ and manifests/, and must print what the README shows after them. The
`make` blocks name targets that exist (a dry run). The quick start's `cluster` blocks run on the
real cluster (e2e/cluster/test_readme_quickstart.py); here they are checked as far as no cluster
is needed: they are the blocks that test runs, they parse, their Helm values are the chart's and
render (with Helm), and the claims they apply allocate on a simulated node. The convention:
testbed/readme.py.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster.test_readme_quickstart import BLOCKS
from testbed.readme import (
    COMMAND_LANGUAGES,
    PLACES,
    README,
    Block,
    command_blocks,
    commands,
    heredocs,
    missing_output,
    readme_blocks,
)

REPO = README.parent
CHART = REPO / "manifests" / "helm" / "deviceplugin"
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
BIN = Path(sys.executable).parent
SIMULATED = "a100-80gb-x8-mixed"


def ids(blocks: list[Block]) -> list[str]:
    return [f"line-{block.line}" for block in blocks]


SIM = command_blocks("sim")
MAKE = command_blocks("make")
CLUSTER = command_blocks("cluster")


def reader_folder(tmp_path: Path) -> Path:
    """A folder as a reader's clone looks from the commands: config/ and manifests/ (links)."""
    for name in ("config", "manifests"):
        (tmp_path / name).symlink_to(REPO / name)
    return tmp_path


def reader_env() -> dict[str, str]:
    """The environment of a shell with this project installed, and nothing of the caller's
    that the commands read (CONFIG_FILE, DP_*, ...)."""
    kept = {key: os.environ[key] for key in ("HOME", "TMPDIR", "LANG") if key in os.environ}
    return {**kept, "PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin"}


def run_bash(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", code],
        cwd=cwd,
        env=reader_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_command_block_says_where_it_runs() -> None:
    blocks = readme_blocks()
    unmarked = [str(b) for b in blocks if b.info in COMMAND_LANGUAGES and not b.where]
    assert unmarked == [], "mark each with <!-- readme-test: sim|cluster NAME|make -->"
    assert {b.where for b in blocks if b.where} <= PLACES
    assert all(b.info in COMMAND_LANGUAGES for b in blocks if b.where in ("sim", "cluster", "make"))
    assert [str(b) for b in SIM if not b.output] == [], "a sim block shows its output after it"
    assert SIM and MAKE and CLUSTER


@pytest.mark.parametrize("block", SIM, ids=ids(SIM))
def test_a_simulated_node_block_runs_and_prints_what_the_readme_shows(
    block: Block, tmp_path: Path
) -> None:
    done = run_bash(block.code, reader_folder(tmp_path))
    assert done.returncode == 0, f"{block} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    assert block.output is not None
    missing = missing_output(done.stdout, block.output)
    assert missing is None, f"{block}: {missing!r} not printed; the output was:\n{done.stdout}"


@pytest.mark.parametrize("block", MAKE, ids=ids(MAKE))
def test_a_make_block_names_targets_that_exist(block: Block) -> None:
    for words in commands(block.code):
        assert words[0] == "make", words
        done = subprocess.run(
            ["make", "-n", "-C", str(REPO), *words[1:]], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, f"{block}: {shlex.join(words)}: {done.stderr}"


def test_the_quick_start_blocks_are_those_the_cluster_test_runs() -> None:
    assert tuple(b.name for b in CLUSTER) == BLOCKS


@pytest.mark.parametrize("block", CLUSTER, ids=[b.name for b in CLUSTER])
def test_a_quick_start_block_is_bash(block: Block) -> None:
    done = subprocess.run(["bash", "-n", "-c", block.code], capture_output=True, text=True)
    assert done.returncode == 0, f"{block}: {done.stderr}"


def site_values() -> dict[str, Any]:
    (site,) = [b for b in readme_blocks() if b.where == "values" and b.name == "site.yaml"]
    values: dict[str, Any] = yaml.safe_load(site.code)
    return values


def has_value(path: str, values: Any = VALUES) -> bool:
    head, _, rest = path.partition(".")
    if not isinstance(values, dict) or head not in values:
        return False
    return not rest or has_value(rest, values[head]) or values[head] in (None, {})


def leaves(values: dict[str, Any], prefix: str = "") -> list[str]:
    found = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        found += leaves(value, f"{path}.") if isinstance(value, dict) else [path]
    return found


def installs() -> list[tuple[str, list[str]]]:
    """(block name, helm arguments after `helm`) of every helm install in the quick start."""
    return [
        (block.name, words[1:])
        for block in CLUSTER
        for words in commands(block.code)
        if words[:2] == ["helm", "install"]
    ]


def test_the_quick_start_sets_only_values_the_chart_has() -> None:
    assert [path for path in leaves(site_values()) if not has_value(path)] == []
    assert {name for name, _ in installs()} == {"install-plugin", "install-dra", "install-both"}
    for name, args in installs():
        assert (REPO / args[2]).resolve() == CHART, name
        sets = [args[i + 1].split("=")[0] for i, word in enumerate(args) if word == "--set"]
        assert [path for path in sets if not has_value(path)] == [], name


def helm_binary() -> str | None:
    built = REPO / "e2e" / "cluster" / "run" / "bin" / "helm"
    return str(built) if built.exists() else shutil.which("helm")


HELM = helm_binary()


@pytest.mark.skipif(HELM is None, reason="no helm (make lint builds it)")
def test_each_install_renders_the_daemonsets_the_readme_says(tmp_path: Path) -> None:
    (tmp_path / "site.yaml").write_text(yaml.safe_dump(site_values()))
    (tmp_path / "manifests").symlink_to(REPO / "manifests")
    daemonsets = {}
    for name, args in installs():
        assert HELM is not None
        done = subprocess.run(
            [HELM, "template", *args[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, f"{name}: {done.stderr}"
        documents = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
        found = {d["metadata"]["name"]: d for d in documents if d["kind"] == "DaemonSet"}
        daemonsets[name] = found
        for daemonset in found.values():
            image = daemonset["spec"]["template"]["spec"]["containers"][0]["image"]
            assert image.startswith("registry.example.com/deviceplugin:"), image
    assert set(daemonsets["install-plugin"]) == {"gpu-deviceplugin"}
    assert set(daemonsets["install-dra"]) == {"gpu-deviceplugin-dra"}
    both = daemonsets["install-both"]
    assert set(both) == {"gpu-deviceplugin", "gpu-deviceplugin-dra"}
    # the rollout checks of the quick start name these DaemonSets
    checks = " ".join(b.code for b in CLUSTER if b.name.startswith("check-"))
    assert all(f"daemonset/{name}" in checks for name in both)
    for daemonset in both.values():
        affinity = daemonset["spec"]["template"]["spec"]["affinity"]
        assert "nvidia.com/dra" in str(affinity)


def test_the_quick_starts_claims_allocate_on_a_simulated_node(tmp_path: Path) -> None:
    documents = [
        doc
        for block in CLUSTER
        for body in heredocs(block.code)
        for doc in yaml.safe_load_all(body)
        if doc
    ]
    templates = [doc for doc in documents if doc["kind"] == "ResourceClaimTemplate"]
    assert templates
    claims = tmp_path / "claims.yaml"
    claims.write_text(yaml.safe_dump_all(templates))
    done = subprocess.run(
        [
            str(BIN / "deviceplugin"),
            *("dra", "explain", "--simulate", SIMULATED),
            *("--class", str(REPO / "manifests" / "dra" / "deviceclasses.yaml")),
            *("--claim", str(claims)),
        ],
        env=reader_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("would be allocated") == len(templates), done.stdout
    pods = [doc for doc in documents if doc["kind"] == "Pod"]
    claimed = [pod for pod in pods if pod["spec"].get("resourceClaims")]
    assert {
        c["resourceClaimTemplateName"] for p in claimed for c in p["spec"]["resourceClaims"]
    } <= {t["metadata"]["name"] for t in templates}
