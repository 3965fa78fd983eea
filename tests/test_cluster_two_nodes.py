"""A second node on the same machine (e2e/cluster, `NODES=2`), checked without a cluster: `NODES`
and `NODE2_PRESET` refused with exit 2 before anything runs; node 2's command lines and files own
every port, address, path, pod range, cgroup root and identity node 1 has; its mount namespace
laid out, entered and ended for real inside a user namespace (mountns.py), with nothing reaching
the view it was started from; `cluster exec` through the `cluster` script."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from e2e.cluster import cgroups, mountns, node, pki, processes, topology
from e2e.cluster.components import (
    MOUNTNS,
    cni_config,
    components,
    containerd_config,
    kubelet_config,
    mount_plan,
)
from e2e.cluster.layout import (
    API_PORT,
    FIRST,
    NODES,
    OWN_PATHS,
    RUN,
    RUNTIME_STATE,
    SECOND,
    SERVICE_SUBNET,
    STATE,
)
from e2e.cluster.network import forward_rules
from e2e.cluster.processes import STOP_ORDER

REPO = Path(__file__).resolve().parent.parent
CLUSTER = REPO / "e2e" / "cluster" / "cluster"
ACCEPTED = "accepted: 1 2 (default 1)"


# --- NODES and NODE2_PRESET -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "count"), [({}, 1), ({"NODES": ""}, 1), ({"NODES": "1"}, 1), ({"NODES": " 2 "}, 2)]
)
def test_nodes_is_one_unless_two_is_asked(environ: dict[str, str], count: int) -> None:
    asked = topology.asked(environ)
    assert asked.count == count
    assert [n.name for n in asked.nodes] == [n.name for n in NODES[:count]]
    assert asked.second_preset == "a10-x8"


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
    ("environ", "message"),
    [
        ({"NODES": "3"}, f"NODES='3' is not accepted; {ACCEPTED}"),
        ({"NODES": "0"}, f"NODES='0' is not accepted; {ACCEPTED}"),
        ({"NODES": "two"}, f"NODES='two' is not accepted; {ACCEPTED}"),
        ({"NODES": "2.0"}, f"NODES='2.0' is not accepted; {ACCEPTED}"),
        (
            {"NODES": "2", "NODE2_PRESET": "a10-x9"},
            "NODE2_PRESET='a10-x9' is neither a preset (a10-x8 a100-80gb-x8-dynamic",
        ),
    ],
)
def test_cluster_up_refuses_a_node_count_or_preset_it_cannot_run(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    environ: dict[str, str],
    message: str,
) -> None:
    for name in ("KUBERNETES_VERSION", "FEATURE_GATES", "NODES", "NODE2_PRESET"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert node.main(["up"]) == 2
    assert message in capsys.readouterr().err


def test_cluster_up_passes_two_nodes_and_the_preset_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    asked: list[topology.Topology] = []
    monkeypatch.setattr(node, "up", lambda _version, _gates, nodes: asked.append(nodes))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    node_file = tmp_path / "node.yaml"
    node_file.write_text("gpus: []\n")
    monkeypatch.setenv("NODES", "2")
    monkeypatch.setenv("NODE2_PRESET", str(node_file))
    assert node.main(["up"]) == 0
    assert asked == [topology.Topology(2, str(node_file.resolve()))]


def test_the_run_file_says_how_many_nodes_up_started(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(topology, "NODES_FILE", tmp_path / "nodes")
    monkeypatch.setattr(topology, "SECOND_PRESET_FILE", tmp_path / "node2-preset")
    assert topology.recorded() == topology.Topology(1, "a10-x8")  # never started: one node
    topology.record(topology.Topology(2, "h100-x8"))
    assert (tmp_path / "nodes").read_text() == "2\n"
    assert topology.recorded() == topology.Topology(2, "h100-x8")


# --- what is node 2's own ---------------------------------------------------------------------


def test_node_2_has_its_own_name_address_bridge_pod_range_ports_and_cgroup_root() -> None:
    assert SECOND.name == f"{FIRST.name}-2"
    for field in ("name", "bridge", "pod_subnet", "ip", "kubelet", "containerd", "cgroup_root"):
        assert getattr(FIRST, field) != getattr(SECOND, field), field
    first, second = (ipaddress.ip_network(n.pod_subnet) for n in NODES)
    assert not first.overlaps(second)
    assert not first.overlaps(ipaddress.ip_network(SERVICE_SUBNET))
    assert not second.overlaps(ipaddress.ip_network(SERVICE_SUBNET))
    for each in NODES:
        assert ipaddress.ip_address(each.ip) in ipaddress.ip_network(each.pod_subnet)
    ports = [p for n in NODES for p in (n.kubelet_port, n.healthz_port)]
    control_plane = [API_PORT, 10257, 10259, 23790, 23800]
    assert len(set(ports + control_plane)) == len(ports + control_plane), ports
    assert FIRST.cgroup_root == ""  # the kubelet's default, as the single node always had
    assert SECOND.cgroup_root == "/deviceplugin-e2e-2"


def test_node_2s_files_are_its_own_and_node_1s_are_where_they_always_were() -> None:
    assert (FIRST.config_dir, FIRST.containerd_socket) == (RUN, RUNTIME_STATE / "containerd.sock")
    assert (FIRST.containerd_root, FIRST.cni_data) == (STATE / "containerd", STATE / "cni")
    assert FIRST.own_tree is None and FIRST.holder is None
    for field in (
        "config_dir",
        "containerd_socket",
        "containerd_root",
        "containerd_state",
        "cni_data",
        "image_stamps",
    ):
        assert getattr(FIRST, field) != getattr(SECOND, field), field
    assert SECOND.own_tree == STATE / "node-2"
    assert SECOND.host_path(Path("/var/lib/kubelet/pods")) == STATE / "node-2/var/lib/kubelet/pods"
    assert SECOND.host_path(Path("/etc/hosts")) == Path("/etc/hosts")  # not its own: shared
    assert FIRST.host_path(Path("/var/lib/kubelet")) == Path("/var/lib/kubelet")


def host_paths_mounted() -> set[str]:
    """Every fixed host path a DaemonSet of ours or NVIDIA's mounts: manifests, chart templates
    and values, the scenarios' values and NVIDIA's reference DaemonSet."""
    files = [
        *REPO.glob("manifests/**/*.yaml"),
        *REPO.glob("e2e/cluster/values-*.yaml"),
        *REPO.glob("e2e/reference/*.yaml"),
    ]
    found = set()
    for path in files:
        found |= set(re.findall(r"hostPath:\s*\n\s*path:\s*(/[^\s{]+)", path.read_text()))
    values = yaml.safe_load((REPO / "manifests/helm/deviceplugin/values.yaml").read_text())
    found.add(values["mps"]["root"])
    return found


def test_node_2s_own_paths_cover_every_host_path_a_daemonset_mounts() -> None:
    mounted = host_paths_mounted()
    assert {"/var/lib/kubelet/plugins_registry", "/var/run/cdi", "/run/nvidia/mps"} <= mounted
    assert "/var/lib/deviceplugin-sim/root/etc/deviceplugin-sim" in mounted
    shared = {p for p in mounted if not any(Path(p).is_relative_to(own) for own in OWN_PATHS)}
    assert shared == set(), "node 2 would see node 1's"


def test_node_2s_mount_plan_binds_its_tree_over_each_own_path_and_detaches_node_1s() -> None:
    plan = mount_plan(SECOND)
    assert plan["bind"] == [[str(SECOND.host_path(p)), str(p)] for p in OWN_PATHS]
    assert SECOND.own_tree is not None
    for source, target in plan["bind"]:
        assert Path(source) == SECOND.own_tree / target.lstrip("/")
    assert set(plan["detach"]) == {str(p) for p in (*OWN_PATHS, STATE, RUNTIME_STATE)}
    with pytest.raises(AssertionError):
        mount_plan(FIRST)  # node 1 sees the host's own


# --- command lines and configuration ----------------------------------------------------------


def test_node_1s_components_do_not_change_with_a_second_node(tmp_path: Path) -> None:
    one = components(tmp_path, {}, (FIRST,))
    two = components(tmp_path, {}, NODES)
    assert set(two) - set(one) == {"mountns-2", "containerd-2", "kubelet-2"}
    assert {name: two[name] for name in one} == one
    assert node.component_names((FIRST,)) == STOP_ORDER  # the single node's, as before
    assert node.component_names(NODES)[:3] == ("kubelet-2", "containerd-2", "mountns-2")


def test_node_2s_daemons_start_in_its_mount_namespace_with_its_own_identity(
    tmp_path: Path,
) -> None:
    every = components(tmp_path, {"DRADeviceTaints": True}, NODES)
    ready = str(SECOND.namespace_ready)
    assert every["mountns-2"].args == (
        *("unshare", "--mount", "--propagation", "private"),
        *(sys.executable, str(MOUNTNS), "hold", ready, str(RUN / "node-2" / "mounts.json")),
    )
    inside = (sys.executable, str(MOUNTNS), "enter", ready, "--")
    containerd, kubelet = every["containerd-2"].args, every["kubelet-2"].args
    assert containerd == (
        *inside,
        str(tmp_path / "containerd"),
        f"--config={RUN}/node-2/containerd.toml",
    )
    assert kubelet[: len(inside)] == inside
    assert kubelet[len(inside) :] == (
        str(tmp_path / "kubelet"),
        f"--config={RUN}/node-2/kubelet.yaml",
        f"--kubeconfig={RUN}/kubelet-2.kubeconfig",
        "--hostname-override=deviceplugin-e2e-2",
        "--node-ip=10.217.1.1",
        "--node-labels=nvidia.com/gpu.present=true",
        "--root-dir=/var/lib/kubelet",  # node 2's own, in its namespace
        "--v=2",
    )


def test_each_kubelet_has_its_own_address_ports_runtime_certificate_and_cgroup_root() -> None:
    first, second = (kubelet_config(n, {"DRADeviceTaints": False}) for n in NODES)
    assert (first["address"], first["port"], first["healthzPort"]) == ("10.217.0.1", 10250, 10248)
    assert "cgroupRoot" not in first
    assert second["address"] == "10.217.1.1"
    assert (second["port"], second["healthzPort"]) == (11250, 11248)
    assert second["cgroupRoot"] == "/deviceplugin-e2e-2"
    assert second["containerRuntimeEndpoint"] == f"unix://{RUNTIME_STATE}/containerd-2.sock"
    assert str(second["tlsCertFile"]).endswith("/pki/kubelet-2-serving.crt")
    assert second["featureGates"] == {"DRADeviceTaints": False}
    same = {k for k in first if first[k] == second[k]}
    assert not same & {"address", "port", "healthzPort", "containerRuntimeEndpoint", "tlsCertFile"}


def test_each_containerd_has_its_own_root_state_socket_and_pod_network(tmp_path: Path) -> None:
    first, second = (tomllib.loads(containerd_config(tmp_path, n)) for n in NODES)
    assert second["root"] == str(STATE / "containerd-2")
    assert second["state"] == str(RUNTIME_STATE / "containerd-2")
    assert second["grpc"]["address"] == str(RUNTIME_STATE / "containerd-2.sock")
    cni = second["plugins"]["io.containerd.cri.v1.runtime"]["cni"]
    assert cni["conf_dir"] == str(RUN / "node-2" / "cni")
    for key in ("root", "state"):
        assert first[key] != second[key]
    assert first["grpc"] != second["grpc"]


def test_each_nodes_pods_reach_the_other_nodes_pods_and_nothing_else() -> None:
    alone = cni_config(FIRST, (FIRST,))["plugins"][0]["ipam"]  # type: ignore[index]
    assert alone["routes"] == [{"dst": SERVICE_SUBNET}]  # as the single node always had
    for this, other in (NODES, NODES[::-1]):
        plugin = cni_config(this, NODES)["plugins"][0]  # type: ignore[index]
        assert plugin["bridge"] == this.bridge
        assert plugin["ipam"]["ranges"] == [[{"subnet": this.pod_subnet, "gateway": this.ip}]]
        assert plugin["ipam"]["routes"] == [{"dst": SERVICE_SUBNET}, {"dst": other.pod_subnet}]
        assert plugin["ipam"]["dataDir"] == str(this.cni_data)
        assert not plugin["isDefaultGateway"] and not plugin["ipMasq"]
    assert forward_rules(NODES) == [
        [
            "-i",
            "dpe2e0",
            "-o",
            "dpe2e1",
            "-s",
            "10.217.0.0/24",
            "-d",
            "10.217.1.0/24",
            "-j",
            "ACCEPT",
        ],
        [
            "-i",
            "dpe2e1",
            "-o",
            "dpe2e0",
            "-s",
            "10.217.1.0/24",
            "-d",
            "10.217.0.0/24",
            "-j",
            "ACCEPT",
        ],
    ]
    assert forward_rules((FIRST,)) == []


def openssl(*args: str | Path) -> str:
    done = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True, check=True)
    return done.stdout


def test_node_2s_kubelet_is_system_node_of_its_own_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """NodeRestriction holds a kubelet to the node its certificate names."""
    if not shutil.which("openssl"):
        pytest.skip("no openssl")
    monkeypatch.setattr(pki, "PKI", tmp_path / "pki")
    monkeypatch.setattr(pki, "RUN", tmp_path)
    (tmp_path / "pki").mkdir()
    ca = tmp_path / "pki" / "ca"
    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        f"{ca}.key",
        "-out",
        f"{ca}.crt",
    )
    pki.node_identity(SECOND)
    client = tmp_path / "pki" / "kubelet-2.crt"
    subject = openssl("x509", "-in", client, "-noout", "-subject")
    assert "O = system:nodes, CN = system:node:deviceplugin-e2e-2" in subject
    assert "OK" in openssl("verify", "-CAfile", f"{ca}.crt", client)
    serving = openssl(
        "x509",
        "-in",
        tmp_path / "pki" / "kubelet-2-serving.crt",
        "-noout",
        "-ext",
        "subjectAltName",
    )
    assert "IP Address:10.217.1.1" in serving and "DNS:deviceplugin-e2e-2" in serving
    config = json.loads(pki.kubeconfig(SECOND.kubelet).read_text())
    assert config["users"][0]["user"]["client-certificate"] == str(client)
    assert (tmp_path / "kubelet-2.kubeconfig").exists()


# --- the cgroup root --------------------------------------------------------------------------

MOUNTINFO = """\
25 30 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw
27 25 0:24 / /sys/fs/cgroup/cpuset rw,nosuid shared:11 - cgroup cgroup rw,cpuset
28 25 0:25 / /sys/fs/cgroup/memory rw,nosuid shared:12 - cgroup cgroup rw,memory
29 30 8:1 / /var/lib/my\\040disk rw shared:1 - ext4 /dev/sda1 rw
"""


def test_node_2s_cgroup_root_is_made_in_every_hierarchy_with_its_parents_cpuset(
    tmp_path: Path,
) -> None:
    found = cgroups.hierarchies(MOUNTINFO)
    assert found == [Path(f"/sys/fs/cgroup/{h}") for h in ("unified", "cpuset", "memory")]
    fake = [tmp_path / h.name for h in found]
    for hierarchy in fake:
        hierarchy.mkdir()
    (tmp_path / "cpuset" / "cpuset.cpus").write_text("0-3\n")
    (tmp_path / "cpuset" / "cpuset.mems").write_text("0\n")
    cgroups.make_root(SECOND.cgroup_root, fake)
    roots = cgroups.node_roots(SECOND.cgroup_root, fake)
    assert roots == [h / "deviceplugin-e2e-2" for h in fake]
    assert (tmp_path / "cpuset/deviceplugin-e2e-2/cpuset.cpus").read_text() == "0-3\n"
    assert not (tmp_path / "memory/deviceplugin-e2e-2/cpuset.cpus").exists()
    pods = tmp_path / "memory/deviceplugin-e2e-2/kubepods/besteffort/pod1"
    pods.mkdir(parents=True)
    cgroups.remove_root(roots[2])
    assert cgroups.node_roots(SECOND.cgroup_root, fake) == roots[:2]


# --- the mount namespace, for real in a user namespace ----------------------------------------


def test_beneath_lists_mounts_strictly_under_a_root_deepest_first(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    real = str(tmp_path / "real")
    points = ["/", real, f"{real}/a", f"{real}/a/b", f"{real}x/c", "/elsewhere"]
    assert mountns.beneath(points, [str(tmp_path / "link")]) == [f"{real}/a/b", f"{real}/a"]
    assert mountns.unescape(r"/var/lib/my\040disk") == "/var/lib/my disk"


def test_enter_refuses_without_a_holder_and_hold_without_a_namespace_of_its_own(
    tmp_path: Path,
) -> None:
    ready = tmp_path / "mountns"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, str(MOUNTNS), *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=30)

    done = run("enter", str(ready), "--", "true")
    assert done.returncode == 125 and f"{ready} names no holder: is the node up?" in done.stderr
    ready.write_text(f"{os.getpid()}\n")  # a live process that holds nothing
    done = run("enter", str(ready), "--", "true")
    assert done.returncode == 125 and "is not the holder of that namespace" in done.stderr
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"detach": [], "bind": [[str(tmp_path), "/var/lib/kubelet"]]}))
    done = run("hold", str(ready), str(plan))  # in its parent's namespace: refused, nothing done
    assert done.returncode == 125 and "not in a mount namespace of its own" in done.stderr
    assert run("bogus").returncode == 2


def user_namespaces() -> bool:
    if not shutil.which("unshare"):
        return False
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], check=False)
    return done.returncode == 0


# The `cluster` steps, as root in a user namespace of their own, on folders of the test: the
# host's paths are `host/...`, node 2's tree `tree/...`. Node 1's pod volume is a tmpfs mounted
# under the host's kubelet root before node 2's namespace is made.
SCRIPT = r"""
set -eu
cd "$1"
mount -t tmpfs tmpfs host/kubelet/pods/vol && echo node1 > host/kubelet/pods/vol/token
unshare --mount --propagation private "$PY" "$MOUNTNS" hold "$PWD/ready" plan.json >log 2>&1 &
holder=$!
while [ ! -s ready ]; do sleep 0.1; done
inside() { "$PY" "$MOUNTNS" enter "$PWD/ready" -- sh -c "$1"; }
echo "holder $holder $(cat ready)"
echo "inside-owner $(inside 'cat host/kubelet/owner')"
echo "inside-volume $(inside 'grep -c " $PWD/host/kubelet/pods/vol " /proc/self/mountinfo || true')"
echo "inside-shared $(inside 'grep " $PWD/host/kubelet " /proc/self/mountinfo | grep -c shared:')"
inside 'echo written > host/kubelet/written'
echo "outside-owner $(cat host/kubelet/owner)"
echo "outside-volume $(cat host/kubelet/pods/vol/token)"
echo "outside-bind $(grep -c " $PWD/host/kubelet " /proc/self/mountinfo || true)"
read -r _  # the test looks at the namespace from outside meanwhile
kill "$holder"
wait "$holder" || true
echo "ready-left $(ls ready 2>/dev/null | wc -l)"
inside true || echo "enter-after $?"
"""


@pytest.fixture
def node_2_tree(tmp_path: Path) -> Path:
    (tmp_path / "host/kubelet/pods/vol").mkdir(parents=True)
    (tmp_path / "host/kubelet/owner").write_text("node1\n")
    (tmp_path / "tree/kubelet").mkdir(parents=True)
    (tmp_path / "tree/kubelet/owner").write_text("node2\n")
    plan = {
        "detach": [str(tmp_path / "host")],
        "bind": [[str(tmp_path / "tree/kubelet"), str(tmp_path / "host/kubelet")]],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    return tmp_path


@pytest.fixture
def in_user_namespace(node_2_tree: Path) -> Iterator[subprocess.Popen[str]]:
    if not user_namespaces():
        pytest.skip("no user namespaces here (unshare --user --map-root-user)")
    script = node_2_tree / "steps.sh"
    script.write_text(SCRIPT)
    isolated = ("unshare", "--user", "--map-root-user", "--mount", "--propagation", "private")
    process = subprocess.Popen(
        [*isolated, "sh", str(script), str(node_2_tree)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PY": sys.executable, "MOUNTNS": str(MOUNTNS)},
    )
    yield process
    process.kill()
    process.wait(timeout=10)


def lines_until(process: subprocess.Popen[str], last: str) -> dict[str, str]:
    assert process.stdout is not None
    seen: dict[str, str] = {}
    while last not in seen:
        line = process.stdout.readline()
        assert line, (
            f"the steps ended early: {seen}; {process.stderr.read() if process.stderr else ''}"
        )
        key, _, value = line.rstrip("\n").partition(" ")
        seen[key] = value
    return seen


def test_node_2s_namespace_shows_its_tree_and_leaves_the_host_view_alone(
    in_user_namespace: subprocess.Popen[str], node_2_tree: Path
) -> None:
    seen = lines_until(in_user_namespace, "outside-bind")
    holder, written = seen["holder"].split()
    assert holder == written, "READY names the holder itself (unshare execs it)"
    assert seen["inside-owner"] == "node2"  # its own tree at the host path
    assert seen["inside-volume"] == "0"  # node 1's pod volume detached in its namespace only
    assert seen["inside-shared"] == "1"  # its mounts reach the containers it starts
    assert (node_2_tree / "tree/kubelet/written").read_text() == "written\n"
    assert not (node_2_tree / "host/kubelet/written").exists()
    assert seen["outside-owner"] == "node1"
    assert seen["outside-volume"] == "node1"
    assert seen["outside-bind"] == "0"  # nothing of node 2's is mounted in the view it left

    members = processes.namespace_members(
        node_2_tree / "tree/kubelet", node_2_tree / "host/kubelet"
    )
    assert int(holder) in members
    assert os.getpid() not in members and in_user_namespace.pid not in members  # the host view

    assert in_user_namespace.stdin is not None
    in_user_namespace.stdin.write("stop\n")
    in_user_namespace.stdin.flush()
    ended = lines_until(in_user_namespace, "enter-after")
    assert ended["ready-left"] == "0"
    assert ended["enter-after"] == "125"
    assert (
        processes.namespace_members(node_2_tree / "tree/kubelet", node_2_tree / "host/kubelet")
        == set()
    )


# --- cluster exec -----------------------------------------------------------------------------


def cluster(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLUSTER), *args], capture_output=True, text=True, timeout=60)


def test_exec_1_runs_the_command_in_the_hosts_view_with_its_exit_status() -> None:
    done = cluster("exec", "1", "--", "sh", "-c", 'echo "$0 $1" -l; exit 7', "a", "b")
    assert (done.returncode, done.stdout) == (7, "a b -l\n"), done.stderr


def test_exec_2_runs_the_command_through_node_2s_namespace() -> None:
    assert node.exec_argv(1, ["cat", "x"]) == ["cat", "x"]
    enter = [sys.executable, str(MOUNTNS), "enter", str(SECOND.namespace_ready), "--"]
    assert node.exec_argv(2, ["sh", "-c", "echo"]) == [*enter, "sh", "-c", "echo"]
    if SECOND.namespace_ready.exists():
        pytest.skip("a node 2 is up from this checkout")
    done = cluster("exec", "2", "--", "true")
    assert done.returncode == 125 and "names no holder: is the node up?" in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["exec", "3", "--", "true"], "invalid choice: '3'"),
        (["exec", "2"], "no command to run"),
        (["exec", "1", "--"], "no command to run"),
        (["restart", "mountns-2"], "invalid choice: 'mountns-2'"),
    ],
)
def test_exec_and_restart_refuse_what_they_cannot_run(args: list[str], message: str) -> None:
    done = cluster(*args)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_exec_2_needs_root_to_join_the_namespace(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "execvp", lambda *_: pytest.fail("it ran the command"))
    assert node.main(["exec", "2", "--", "true"]) == 2
    assert "exec 2 needs root" in capsys.readouterr().err
