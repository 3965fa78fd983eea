"""A running plugin against a hostile or careless operator's config file: a FIFO, /dev/zero, an
emptied file, a 1 MiB file, a deleted directory, a symlink into another directory, a huge value,
a rename that would merge GPUs and MIG devices, what the reference refuses. Each keeps the last
good config serving, answers Allocate, /healthz and /readyz meanwhile, and says what is wrong
in /status, in `deviceplugin_config_last_reload_successful` and in a `config.rejected` line.

The plugin runs in-process on the simulator against the kubelet emulator (real gRPC on unix
sockets, real HTTP, real watchers on real files); one test runs `deviceplugin serve` as a process
to send it SIGTERM."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import shutil
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from test_http import CONFIG, GPU, MIG, WAIT, Plugin, get, running_plugin, until

from deviceplugin.model.config_keys import MAX_CONFIG_BYTES

SEED = CONFIG.format(replicas=2)
DEVICEPLUGIN = str(Path(sys.executable).with_name("deviceplugin"))


def last_reload_successful(plugin: Plugin) -> float | None:
    return plugin.supervisor.metrics.registry.get_sample_value(
        "deviceplugin_config_last_reload_successful"
    )


def reloads(plugin: Plugin, result: str) -> float:
    value = plugin.supervisor.metrics.registry.get_sample_value(
        "deviceplugin_config_reloads_total", {"result": result}
    )
    return value or 0.0


async def rejected(plugin: Plugin, fragment: str) -> dict[str, object]:
    """Wait for the reload that refuses the file; the last good config must still serve, and
    /readyz, /healthz and /status must say so. Returns /status's config section."""
    await until(lambda: fragment in (plugin.supervisor.status().core.last_config_error or ""))
    await still_serving_the_seed(plugin)
    assert last_reload_successful(plugin) == 0
    readyz = await get(plugin.port, "/readyz")
    assert (readyz[0], readyz[2]) == (200, b"ready\n")
    status = json.loads((await get(plugin.port, "/status"))[2])
    config: dict[str, object] = status["config"]
    assert fragment in str(config["last_error"])
    return config


async def still_serving_the_seed(plugin: Plugin) -> None:
    """The seed config's resources, and an Allocate and /healthz answered now."""
    kubelet = plugin.kubelet
    assert kubelet.allocatable(GPU) == 8 and kubelet.allocatable(MIG) == 28
    assert all("::" in device for device in kubelet.devices(GPU))
    replica = sorted(kubelet.devices(GPU))[0]
    assert (await kubelet.allocate(GPU, [[replica]])).container_responses
    assert (await get(plugin.port, "/healthz"))[2] == b"ok\n"


def swap_in(path: Path, make: Callable[[Path], None]) -> None:
    """Put what `make` creates at `path` in one rename, as `ln -sf X t && mv -T t path` does."""
    staged = path.with_name(".staged")
    make(staged)
    os.replace(staged, path)


def rejected_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == "config.rejected"]


def test_a_fifo_is_refused_and_nothing_waits_for_a_writer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        async with running_plugin() as plugin:
            await plugin.advertised()
            plugin.config.unlink()
            os.mkfifo(plugin.config)
            config = await rejected(plugin, "it is a named pipe (FIFO), not a regular file")
            assert config["last_error_field"] == str(plugin.config)
            assert await plugin.supervisor.reload("SIGHUP", force=True) is False
            plugin.config.unlink()
            plugin.config.write_text(CONFIG.format(replicas=3))
            await until(lambda: plugin.supervisor.status().core.last_config_error is None)
            assert await plugin.kubelet.wait_for(
                lambda: plugin.kubelet.allocatable(GPU) == 12, WAIT
            )
            assert last_reload_successful(plugin) == 1

    asyncio.run(scenario())
    line = rejected_lines(caplog)[0]
    assert line.levelno == logging.ERROR
    assert line.dp_fields["keeping"] == "last good config"  # type: ignore[attr-defined]
    assert line.dp_fields["file"].endswith("config.yaml")  # type: ignore[attr-defined]


def test_dev_zero_is_refused_without_reading_it() -> None:
    async def scenario() -> None:
        async with running_plugin() as plugin:
            await plugin.advertised()
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            swap_in(plugin.config, lambda staged: staged.symlink_to("/dev/zero"))
            await rejected(plugin, "it is a character device, not a regular file")
            grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
            assert grown_kib < 64 * 1024, "nothing of /dev/zero was read"

    asyncio.run(scenario())


def test_an_emptied_file_is_an_error_and_version_v1_gives_the_defaults() -> None:
    async def scenario() -> None:
        async with running_plugin() as plugin:
            await plugin.advertised()
            with plugin.config.open("w"):  # `: > config.yaml`
                pass
            config = await rejected(plugin, "the config is empty")
            assert "'version: v1' gives the defaults" in str(config["last_error"])
            assert config["active"]["flags"]["migStrategy"] == "mixed"  # type: ignore[index]
            plugin.config.write_text("version: v1\n")
            kubelet = plugin.kubelet
            assert await kubelet.wait_for(
                lambda: (
                    kubelet.allocatable(MIG) == 0
                    and kubelet.allocatable(GPU) == 8
                    and not any("::" in device for device in kubelet.devices(GPU))
                ),
                WAIT,
            )
            assert last_reload_successful(plugin) == 1

    asyncio.run(scenario())


def big_config() -> str:
    """The seed config plus `resources.gpus` rules that match no GPU, up to 1 MiB."""
    lines = [SEED.rstrip("\n"), "resources:", "  gpus:"]
    size = sum(len(line) + 1 for line in lines)
    n = 0
    while size < MAX_CONFIG_BYTES - 64:
        rule = f"  - {{pattern: 'x{n}', name: g{n}}}"
        lines.append(rule)
        size += len(rule) + 1
        n += 1
    assert n > 25_000
    return "\n".join(lines) + "\n"


def test_a_1_mib_config_is_parsed_while_everything_is_served() -> None:
    text = big_config()

    async def scenario() -> None:
        async with running_plugin() as plugin:
            await plugin.advertised()
            plugin.config.write_text(text)

            def parsing() -> bool:
                return any(
                    t.name.startswith("deviceplugin: parsing") for t in threading.enumerate()
                )

            await until(parsing)  # the parse runs on a thread of its own, not on the loop
            await still_serving_the_seed(plugin)
            assert reloads(plugin, "applied") == 0, "served while the parse was still going on"
            await until(lambda: reloads(plugin, "applied") == 1)
            await still_serving_the_seed(plugin)

    asyncio.run(scenario())


def test_a_file_over_1_mib_is_refused_unread() -> None:
    async def scenario() -> None:
        async with running_plugin() as plugin:
            await plugin.advertised()
            with plugin.config.open("a") as file:
                file.write("#" * (5 * 1024 * 1024))
            await rejected(plugin, "the limit is 1048576 bytes (1 MiB")

    asyncio.run(scenario())


def test_a_deleted_and_recreated_directory_is_watched_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="deviceplugin")

    def logged(event: str) -> bool:
        return any(r.getMessage() == event for r in caplog.records)

    async def scenario() -> None:
        async with running_plugin(config_dir="etc") as plugin:
            await plugin.advertised()
            kubelet = plugin.kubelet
            directory = plugin.config.parent
            shutil.rmtree(directory)
            await rejected(plugin, "No such file or directory")
            await until(lambda: logged("watch.config.lost"))
            directory.mkdir()
            plugin.config.write_text(CONFIG.format(replicas=3))
            assert await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 12, WAIT)
            await until(lambda: logged("watch.config.restored"))
            plugin.config.write_text(CONFIG.format(replicas=4))  # edited in the new directory
            assert await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 16, WAIT)
            assert last_reload_successful(plugin) == 1

    asyncio.run(scenario())


def test_the_target_of_a_symlink_in_another_directory_is_followed() -> None:
    async def scenario() -> None:
        async with running_plugin() as plugin:
            await plugin.advertised()
            kubelet = plugin.kubelet
            other = Path(tempfile.mkdtemp(prefix="dpo"))
            try:
                target = other / "real.yaml"
                target.write_text(SEED)
                swap_in(plugin.config, lambda staged: staged.symlink_to(target))
                target.write_text(CONFIG.format(replicas=3))  # an edit in the other directory
                assert await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 12, WAIT)
            finally:
                shutil.rmtree(other, ignore_errors=True)

    asyncio.run(scenario())


def test_a_huge_value_is_quoted_short_everywhere(caplog: pytest.LogCaptureFixture) -> None:
    huge = "x" * (MAX_CONFIG_BYTES - 100)

    async def scenario() -> None:
        async with running_plugin() as plugin:
            await plugin.advertised()
            plugin.config.write_text(f"version: v1\nflags: {{migStrategy: {huge}}}\n")
            config = await rejected(plugin, f"({len(huge)} characters)")
            assert config["last_error_field"] == "flags.migStrategy"
            assert len(str(config["last_error"])) < 600
            assert len((await get(plugin.port, "/status"))[2]) < 20_000

    asyncio.run(scenario())
    line = rejected_lines(caplog)[0]
    assert len(json.dumps(line.dp_fields)) < 1000  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("addition", "field", "fragment"),
    [
        pytest.param(
            "resources: {gpus: [{pattern: '*', name: mig-1g.10gb}]}",
            "resources.gpus[0].name",
            "renames whole GPUs to nvidia.com/mig-1g.10gb",
            id="gpus-renamed-onto-mig",
        ),
        pytest.param("imex: {channelIDs: [1]}", "imex.channelIDs", "must be [] or [0]", id="imex"),
    ],
)
def test_what_the_reference_or_a_collision_refuses_is_refused_on_reload(
    addition: str, field: str, fragment: str
) -> None:
    async def scenario() -> None:
        async with running_plugin() as plugin:
            await plugin.advertised()
            plugin.config.write_text(SEED + addition + "\n")
            config = await rejected(plugin, fragment)
            assert config["last_error_field"] == field

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param(
            SEED.replace("  migStrategy: mixed\n", "  migStrategy: mixed\n  mpsRoot: /dev\n"),
            "not / or under /dev, /proc, /sys",
            id="dev",
        ),
        pytest.param(
            "version: v1\n"
            f"flags: {{mpsRoot: /run/{'m' * 80}}}\n"
            "sharing: {mps: {resources: [{name: gpu, replicas: 2}]}}\n",
            "too long for the MPS control socket of sharing.mps.resources[0]",
            id="socket-too-long",
        ),
    ],
)
def test_a_bad_mps_root_is_refused_on_reload(text: str, fragment: str) -> None:
    async def scenario() -> None:
        async with running_plugin() as plugin:
            await plugin.advertised()
            plugin.config.write_text(text)
            config = await rejected(plugin, fragment)
            assert config["last_error_field"] == "flags.mpsRoot"

    asyncio.run(scenario())


def test_sigterm_and_healthz_are_answered_with_a_fifo_as_config(tmp_path: Path) -> None:
    """`deviceplugin serve` as a process, as in the report: the FIFO costs it nothing."""

    async def scenario() -> None:
        from deviceplugin.sim.kubelet import KubeletEmulator

        kubelet_dir = Path(tempfile.mkdtemp(prefix="dpf"))
        kubelet = KubeletEmulator(kubelet_dir)
        await kubelet.start()
        config = tmp_path / "config.yaml"
        config.write_text(SEED)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        proc = await asyncio.create_subprocess_exec(
            DEVICEPLUGIN,
            "serve",
            "--kubelet-dir",
            str(kubelet_dir),
            "--cdi-spec-dir",
            str(tmp_path / "cdi"),
            "--simulate",
            "a100-80gb-x8-mixed",
            "--config-file",
            str(config),
            "--http-address",
            f"127.0.0.1:{port}",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            assert await kubelet.wait_for(lambda: kubelet.allocatable(MIG) == 28, WAIT)
            config.unlink()
            os.mkfifo(config)

            async def status_error() -> str:
                body = (await get(port, "/status"))[2]
                return str(json.loads(body)["config"]["last_error"])

            error = ""
            deadline = asyncio.get_running_loop().time() + WAIT
            while "named pipe" not in error:
                assert asyncio.get_running_loop().time() < deadline, error
                await asyncio.sleep(0.05)
                error = await status_error()
            assert (await get(port, "/healthz"))[2] == b"ok\n"
            replica = sorted(kubelet.devices(GPU))[0]
            assert (await kubelet.allocate(GPU, [[replica]])).container_responses
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), WAIT) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
            await kubelet.stop()
            shutil.rmtree(kubelet_dir, ignore_errors=True)

    asyncio.run(scenario())


def test_a_large_applied_config_is_logged_by_size_and_digest() -> None:
    # Tens of thousands of rename rules fit in 1 MiB: config.applied must not repeat them all.
    from deviceplugin.model.config import load_config_text
    from deviceplugin.runtime.configfile import LOGGED_CONFIG_LIMIT, logged

    rules = "".join(f"    - pattern: 'GPU {n}*'\n      name: gpu-{n}\n" for n in range(2000))
    large = load_config_text(f"version: v1\nresources:\n  gpus:\n{rules}", "c.yaml", {}, {})
    fields = logged(large)
    assert "config" not in fields
    assert fields["config_bytes"] > LOGGED_CONFIG_LIMIT and len(fields["config_sha256"]) == 64
    small = logged(load_config_text("version: v1\n", "c.yaml", {}, {}))
    assert small["config"]["version"] == "v1"
