"""Per-node configuration by node label, on a plugin running in-process on the simulator: the
kubelet emulator over real gRPC on unix sockets, the API-server stand-in over real HTTP (reached
through a kubeconfig file, as `--kubeconfig` reaches a cluster), the named configs as a
ConfigMap volume laid out as the kubelet lays it out (`..data` swapped on update).

The node's `nvidia.com/device-plugin.config` label chooses the config; a switch happens in
process within seconds; an unknown name keeps the last good config and says so in /status, in
the metric and in an Event on the Node; a lost API server is retried while the kubelet is
served; a config entry leading outside the directory is refused unread."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec

import pytest
from draplugin import write_kubeconfig
from test_http import CONFIG, GPU, MIG, get, until

import deviceplugin.runtime.nodeagent
from deviceplugin.cli import parse_options
from deviceplugin.model.configselect import CONFIG_LABEL, Selection, config_names, select_config
from deviceplugin.model.errors import ConfigError
from deviceplugin.node.configread import read_text
from deviceplugin.ops.http import HttpServer
from deviceplugin.ops.logs import JsonFormatter
from deviceplugin.ops.metrics import Metrics, NoMetrics
from deviceplugin.plugin.service import run_supervisor
from deviceplugin.plugin.supervisor import Supervisor
from deviceplugin.runtime.options import InspectOptions, ServeOptions
from deviceplugin.sim.apiserver import ApiServer
from deviceplugin.sim.kubelet import KubeletEmulator
from deviceplugin.sim.simulator import simulator_for

NODE = "gpu-node-1"
SHARED = CONFIG.format(replicas=2)  # nvidia.com/gpu: 4 whole GPUs x 2 replicas
TRIPLE = CONFIG.format(replicas=3)
DEDICATED = "version: v1\nflags:\n  migStrategy: mixed\n"
CONFIGS = {"shared": SHARED, "dedicated": DEDICATED}
# a file outside the ConfigMap that a hostile entry links to; YAML reads it as one string, which
# a parser message would quote
SECRET = "hunter2-0f1e2d3c"
SHADOW = f"root:$6${SECRET}:19000:0:99999:7:::\n"
P = ParamSpec("P")


def in_loop(test: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    """A test written as a coroutine, run on a loop of its own."""

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


def write_configmap(directory: Path, data: Mapping[str, str]) -> None:
    """Lay out or update a ConfigMap volume with several keys as the kubelet does: a new
    timestamped directory, `..data` swapped to it in one rename, a link per key."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = directory / f"..{time.monotonic_ns()}"
    stamp.mkdir()
    for key, text in data.items():
        (stamp / key).write_text(text)
    os.symlink(stamp.name, directory / "..data_tmp")
    os.replace(directory / "..data_tmp", directory / "..data")
    for key in data:
        if not (directory / key).is_symlink():
            os.symlink(f"..data/{key}", directory / key)
    for entry in directory.iterdir():
        if entry.is_symlink() and entry.name not in data and not entry.name.startswith("."):
            entry.unlink()


@dataclass
class Node:
    root: Path
    api: ApiServer
    kubelet: KubeletEmulator
    supervisor: Supervisor
    http: HttpServer
    task: asyncio.Task[None]

    @property
    def configmap(self) -> Path:
        return self.root / "config"

    def label(self, value: str | None) -> None:
        self.api.set_node_labels(NODE, {CONFIG_LABEL: value})

    def gpus(self) -> int:
        return self.kubelet.allocatable(GPU)

    async def status(self) -> dict[str, Any]:
        assert self.http.port is not None
        document: dict[str, Any] = json.loads((await get(self.http.port, "/status"))[2])
        return document

    def label_valid(self) -> float | None:
        return self.supervisor.metrics.registry.get_sample_value(
            "deviceplugin_node_config_label_valid"
        )


@contextlib.asynccontextmanager
async def running_node(
    labels: Mapping[str, str] | None = None,
    configs: Mapping[str, str] = CONFIGS,
    default: str | None = "dedicated",
    gpu_labels: bool = False,
    nfd: bool = False,
    api: ApiServer | None = None,
    named: bool = True,
    simulate: str = "a100-80gb-x8-mixed",
    metrics: Metrics | None = None,
    outside: bool = False,
) -> AsyncIterator[Node]:
    """`serve --config-dir` (`named` False: no config) on the a100 preset, its Node in the
    API-server stand-in; `outside`: the config `evil` links to SHADOW, outside the directory."""
    root = Path(tempfile.mkdtemp(prefix="dp"))
    api = api or ApiServer(nfd=nfd)
    await api.start()
    api.add_node(NODE, dict(labels or {}))
    kubelet = KubeletEmulator(root / "device-plugins")
    await kubelet.start()
    write_configmap(root / "config", configs)
    if outside:
        (root / "shadow").write_text(SHADOW)
        os.symlink("../shadow", root / "config" / "evil")
    settings = ServeOptions(
        kubelet_dir=root / "device-plugins",
        cdi_spec_dir=root / "cdi",
        simulate=simulate,
        health_recovery_after="off",
        config_dir=str(root / "config") if named else None,
        default_config=default,
        node_name=NODE,
        kubeconfig=str(write_kubeconfig(root / "kubeconfig", api.url)),
        gpu_labels=gpu_labels,
        env={"POD_NAMESPACE": "gpu-system"},
    )
    supervisor = Supervisor(settings, metrics or Metrics(), simulator_for(simulate))
    http = HttpServer("127.0.0.1:0", supervisor, root / "no-pods.sock", read_pods=_no_pods)
    task = asyncio.get_running_loop().create_task(run_supervisor(supervisor, http))
    try:
        await until(
            lambda: (supervisor.status().core.started and http.port is not None) or task.done()
        )
        if task.done():
            task.result()
        yield Node(root, api, kubelet, supervisor, http, task)
    finally:
        supervisor.engine.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 10)
        await kubelet.stop()
        await api.stop()
        shutil.rmtree(root, ignore_errors=True)


async def _no_pods(socket: Path) -> tuple[None, str]:
    return None, "not asked"


# --- selection, as the reference chooses ---------------------------------------------------------


@pytest.mark.parametrize(
    ("available", "label", "default", "expected"),
    [
        (["a", "b"], "b", "a", Selection("b", "label")),
        (["a", "b"], None, "a", Selection("a", "default")),
        (["only"], None, None, Selection("only", "single")),
        (["only"], "only", None, Selection("only", "label")),
    ],
)
def test_the_label_then_the_default_then_the_single_config(
    available: list[str], label: str | None, default: str | None, expected: Selection
) -> None:
    assert select_config(available, label, default) == expected


@pytest.mark.parametrize(
    ("available", "label", "default", "field", "fragment"),
    [
        (["a", "b"], "c", "a", CONFIG_LABEL, "'c', which does not exist (configs: a, b)"),
        (["a", "b"], None, "z", "default config", "'z' does not exist"),
        (["a", "b"], None, None, CONFIG_LABEL, "no default config and 2 configs"),
        ([], None, None, CONFIG_LABEL, "0 configs to choose from (none)"),
    ],
)
def test_no_config_to_choose_is_an_error_naming_why(
    available: list[str], label: str | None, default: str | None, field: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        select_config(available, label, default)
    assert caught.value.path == field
    assert fragment in str(caught.value)


def test_the_kubelets_own_entries_are_not_configs() -> None:
    assert config_names(["..data", "..2026_12_05", ".hidden", "b", "a"]) == ["a", "b"]


def test_config_dir_and_config_file_together_are_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as caught:
        parse_options(["serve", "--config-dir", "/d", "--config-file", "/f"], {})
    assert caught.value.code == 2
    assert "choose one" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_options(["serve", "--gpu-labels", "yes"], {})
    assert "must be on or off, got 'yes'" in capsys.readouterr().err


def serve_options(argv: list[str], env: dict[str, str]) -> ServeOptions:
    options = parse_options(argv, env)
    assert isinstance(options, ServeOptions)
    return options


def test_serve_follows_its_node_only_when_asked() -> None:
    assert not serve_options(["serve"], {}).follows_node
    settings = serve_options(["serve"], {"DP_CONFIG_DIR": "/d", "DEFAULT_CONFIG": "x"})
    assert settings.follows_node and settings.default_config == "x"
    assert serve_options(["serve", "--gpu-labels", "on"], {}).follows_node
    inspect = parse_options(["inspect"], {"DP_CONFIG_DIR": "/d"})
    assert isinstance(inspect, InspectOptions), "inspect takes no named configs"


# --- a running plugin -------------------------------------------------------------------------


@in_loop
async def test_the_label_chooses_the_config_at_start_and_switches_it_in_process() -> None:
    async with running_node({CONFIG_LABEL: "shared"}) as node:
        await until(lambda: node.gpus() == 8 and node.kubelet.allocatable(MIG) == 28)
        servers = dict(node.supervisor._servers)
        selection = (await node.status())["config"]["selection"]
        assert (selection["name"], selection["reason"], selection["error"]) == (
            "shared",
            "label",
            None,
        )

        node.label("dedicated")
        await until(lambda: node.gpus() == 4, timeout=20)
        # in process: the MIG resource kept its server (no restart, no re-registration)
        assert node.supervisor._servers[MIG] is servers[MIG]
        assert (await node.status())["config"]["source"].endswith("/dedicated")

        node.label("shared")
        await until(lambda: node.gpus() == 8)
        node.label(None)  # no label: the default
        await until(lambda: node.gpus() == 4)
        selection = (await node.status())["config"]["selection"]
        assert (selection["name"], selection["reason"]) == ("dedicated", "default")


@in_loop
async def test_an_unknown_name_keeps_the_last_good_config_and_says_so_everywhere() -> None:
    async with running_node({CONFIG_LABEL: "shared"}) as node:
        await until(lambda: node.gpus() == 8)
        node.label("no-such-config")
        await until(lambda: bool(node.api.events))
        await asyncio.sleep(0.3)
        assert node.gpus() == 8  # the last good config serves
        selection = (await node.status())["config"]["selection"]
        assert (
            "'no-such-config', which does not exist (configs: dedicated, shared)"
            in (selection["error"])
        )
        assert selection["name"] == "shared"
        assert node.label_valid() == 0
        readyz = await get(node.http.port or 0, "/readyz")
        assert readyz[0] == 200
        [event] = node.api.events
        assert event["involvedObject"]["kind"] == "Node"
        assert event["involvedObject"]["name"] == NODE
        assert event["involvedObject"]["uid"] == node.api.nodes[NODE]["metadata"]["uid"]
        assert (event["type"], event["reason"]) == ("Warning", "DevicePluginConfigUnknown")
        assert "keeping config 'shared'" in event["message"]
        assert event["metadata"]["namespace"] == "default"

        # the ConfigMap gains the config the label names: it applies
        write_configmap(node.configmap, {**CONFIGS, "no-such-config": TRIPLE})
        await until(lambda: node.gpus() == 12)
        assert node.label_valid() == 1
        assert (await node.status())["config"]["selection"]["error"] is None
        assert len(node.api.events) == 1  # one Event per wrong value, not one per look


@in_loop
async def test_a_plugin_without_metrics_follows_its_label_all_the_same() -> None:
    """serve without --http-address keeps no metrics (NoMetrics): the label's verdict is
    reported where there is somewhere to report it, and the switch happens all the same."""
    async with running_node({CONFIG_LABEL: "shared"}, metrics=NoMetrics()) as node:
        await until(lambda: node.gpus() == 8)
        node.label("no-such-config")
        await until(lambda: bool(node.api.events))
        node.label("dedicated")
        await until(lambda: node.gpus() == 4)
        assert not node.task.done()


@in_loop
async def test_an_edit_of_the_chosen_config_reloads_it() -> None:
    async with running_node({CONFIG_LABEL: "shared"}) as node:
        await until(lambda: node.gpus() == 8)
        write_configmap(node.configmap, {"shared": TRIPLE, "dedicated": DEDICATED})
        await until(lambda: node.gpus() == 12)


@in_loop
async def test_without_label_or_default_a_single_config_applies() -> None:
    async with running_node(configs={"only": SHARED}, default=None) as node:
        await until(lambda: node.gpus() == 8)
        selection = (await node.status())["config"]["selection"]
        assert (selection["name"], selection["reason"]) == ("only", "single")


@in_loop
async def test_a_lost_api_server_is_retried_and_the_kubelet_still_served() -> None:
    async with running_node({CONFIG_LABEL: "shared"}) as node:
        await until(lambda: node.gpus() == 8)
        node.api.fail_next(503, 2)
        node.api.end_watches()
        await until(lambda: node.supervisor.status().core.config_selection is not None)
        await until(
            lambda: bool((node.supervisor.status().core.config_selection or {})["api_error"])
        )
        # the kubelet is served meanwhile
        replica = sorted(node.kubelet.devices(GPU))[0]
        assert (await node.kubelet.allocate(GPU, [[replica]])).container_responses
        await until(lambda: not (node.supervisor.status().core.config_selection or {})["api_error"])
        node.label("dedicated")
        await until(lambda: node.gpus() == 4)
        # only our own Node was ever asked for, by field selector
        reads = {path for method, path in node.api.requests if method == "GET"}
        assert reads == {"/api/v1/nodes"}


@in_loop
async def test_an_unreachable_api_server_at_start_leaves_the_default_serving(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(deviceplugin.runtime.nodeagent, "FIRST_SIGHT_SECONDS", 0.2)
    api = ApiServer()
    api.fail_next(503, 1000)
    async with running_node({CONFIG_LABEL: "shared"}, api=api) as node:
        await until(lambda: node.gpus() == 4)  # the default, while the label cannot be read
        node.api._failures.clear()
        await until(lambda: node.gpus() == 8, timeout=20)  # the label, once it can


@in_loop
async def test_start_up_with_no_config_to_choose_fails_naming_why() -> None:
    with pytest.raises(ConfigError, match="no default config and 2 configs"):
        async with running_node(default=None):
            pass


def test_a_config_named_default_is_the_default() -> None:
    assert select_config(["default", "b"], None, None) == Selection("default", "default")
    assert select_config(["default", "b"], None, "b") == Selection("b", "default")


@in_loop
async def test_a_wrong_label_at_start_starts_the_default_and_reports_it() -> None:
    async with running_node({CONFIG_LABEL: "gone"}) as node:
        await until(lambda: node.gpus() == 4)  # dedicated, the default
        await until(lambda: bool(node.api.events))
        assert "keeping config 'dedicated'" in node.api.events[0]["message"]
        assert node.label_valid() == 0
        selection = (await node.status())["config"]["selection"]
        assert (selection["name"], selection["label"]) == ("dedicated", "gone")
        node.label("shared")
        await until(lambda: node.gpus() == 8)
        assert node.label_valid() == 1


# --- an entry that leads outside the directory --------------------------------------------------


def test_only_entries_resolving_inside_the_directory_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "shadow").write_text(SHADOW)
    (tmp_path / "config2").mkdir()  # a sibling whose name starts like the directory's
    (tmp_path / "config2" / "file").write_text(SHADOW)
    configmap = tmp_path / "config"
    write_configmap(configmap, {"shared": SHARED})
    os.symlink(tmp_path / "shadow", configmap / "absolute")
    os.symlink("../shadow", configmap / "dotdot")
    os.symlink("../config2/file", configmap / "sibling")
    mounted = tmp_path / "mounted"  # --config-dir may itself be a link
    os.symlink(configmap, mounted)
    opened: list[str] = []
    real_open = os.open

    def spied_open(path: str, flags: int, mode: int = 0o777) -> int:
        opened.append(path)
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", spied_open)
    assert read_text(str(mounted / "shared"), within=str(mounted)) == SHARED
    for name in ("absolute", "dotdot", "sibling"):
        with pytest.raises(ConfigError) as caught:
            read_text(str(mounted / name), within=str(mounted))
        assert str(caught.value) == (
            f"config {name!r} resolves outside --config-dir {mounted}: refused"
        )
    assert opened == [str(mounted / "shared")]  # not even opened: opening a device can act
    # serve --config-file names its file itself: wherever it leads is the operator's choice
    assert read_text(str(configmap / "absolute")) == SHADOW


def test_an_entry_swapped_outside_after_the_check_is_refused_once_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry is checked before it is opened and the open file after: a link replaced in
    between leaves nothing read."""
    (tmp_path / "shadow").write_text(SHADOW)
    configmap = tmp_path / "config"
    write_configmap(configmap, {"shared": SHARED})
    entry = str(configmap / "shared")
    os.symlink("../shadow", configmap / "..swap")
    real_open = os.open

    def swap_then_open(path: str, flags: int, mode: int = 0o777) -> int:
        if path == entry:
            os.replace(configmap / "..swap", entry)
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", swap_then_open)
    with pytest.raises(ConfigError, match="'shared' resolves outside --config-dir"):
        read_text(entry, within=str(configmap))


def shown(records: list[logging.LogRecord]) -> str:
    """Every log line as the JSON format writes it."""
    return "\n".join(JsonFormatter().format(record) for record in records)


@in_loop
async def test_a_label_naming_an_entry_linked_outside_is_refused_unread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="deviceplugin")
    async with running_node({CONFIG_LABEL: "shared"}, outside=True) as node:
        await until(lambda: node.gpus() == 8)
        node.label("evil")
        await until(lambda: bool(node.api.events))
        await asyncio.sleep(0.3)
        assert node.gpus() == 8  # the config in force stays
        status = await node.status()
        refused = f"config 'evil' resolves outside --config-dir {node.configmap}: refused"
        assert status["config"]["selection"]["error"] == refused
        assert status["config"]["selection"]["name"] == "shared"
        assert node.label_valid() == 0
        [line] = [r for r in caplog.records if r.getMessage() == "config.selection.rejected"]
        assert line.dp_fields["error"] == refused  # type: ignore[attr-defined]
        assert refused in node.api.events[0]["message"]
        assert SECRET not in json.dumps(status) + json.dumps(node.api.events)
    assert SECRET not in shown(caplog.records)


@in_loop
async def test_the_chosen_entry_relinked_outside_is_refused_on_reading(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The entry in force replaced by a link outside (by whoever can write the directory): the
    reload it causes, and SIGHUP, read nothing of the target."""
    caplog.set_level(logging.INFO, logger="deviceplugin")
    async with running_node({CONFIG_LABEL: "shared"}, outside=True) as node:
        await until(lambda: node.gpus() == 8)
        os.symlink("../shadow", node.configmap / "..relink")
        os.replace(node.configmap / "..relink", node.configmap / "shared")
        await until(lambda: node.supervisor.status().core.last_config_error is not None)
        assert await node.supervisor.reload("SIGHUP", force=True) is False
        assert node.gpus() == 8  # the config in force stays
        config = (await node.status())["config"]
        refused = f"config 'shared' resolves outside --config-dir {node.configmap}: refused"
        assert refused in config["last_error"]
        assert config["selection"]["error"] == refused
        rejected = [r for r in caplog.records if r.getMessage() == "config.rejected"]
        assert rejected and all(
            refused in r.dp_fields["error"]  # type: ignore[attr-defined]
            for r in rejected
        )
        assert SECRET not in json.dumps(config) + json.dumps(node.api.events)
    assert SECRET not in shown(caplog.records)


@in_loop
async def test_a_label_naming_an_entry_linked_outside_at_start_starts_the_default() -> None:
    async with running_node({CONFIG_LABEL: "evil"}, outside=True) as node:
        await until(lambda: node.gpus() == 4)  # dedicated, the default
        selection = (await node.status())["config"]["selection"]
        assert (selection["name"], selection["label"]) == ("dedicated", "evil")
        assert "'evil' resolves outside --config-dir" in selection["error"]
