"""Build the simulated `libnvidia-ml.so.1` (C sources in `sim/native/`) with gcc against NVIDIA's
own `nvml.h` (the pinned `nvidia-nvml-dev` wheel), once per source version.

Every function `nvml.h` declares is exported: those `native/*.c` define are modelled, the rest
are generated here as stubs answering NVML_ERROR_NOT_SUPPORTED (a consumer that binds symbols
lazily, as go-nvml does, would die on a missing one). Builds are cached under
`${XDG_CACHE_HOME:-~/.cache}/deviceplugin/nvml-sim/<hash of sources, header and flags>/`.
An installed package that carries a prebuilt library (the container image) uses that one.

The DRA driver's memory-limit hook (`node/native/memory_limit_hook.c`, a createContainer hook
that calls NVML, so it is C compiled against the same header) is built the same way, cached
beside the library, and packaged the same way (`hook_program()`). So is the simulated MPS
control program (`native/mpscontrol.c`, installed by `sim-root` as the driver root's
`usr/bin/nvidia-cuda-mps-control`), linked statically so that it runs in any container or mount
namespace that NVIDIA's own binaries run it from, and the simulated `nvidia-smi`
(`native/nvidiasmi.c`: setting a compute mode through the driver root's library, as NVIDIA's MPS
daemon does).

`python -m deviceplugin.sim.libbuild [--into DIR] [--hook-into DIR]` builds the library, the
MPS control program and `nvidia-smi` and prints their paths (with `--into`, copies them there first:
`image/build.sh` ships them inside the wheel; `--hook-into` does the same for the hook).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

NATIVE_DIR = Path(__file__).parent / "native"
LIBRARY_NAME = "libnvidia-ml.so.1"
PACKAGED = NATIVE_DIR / LIBRARY_NAME
HEADER_IN_WHEEL = Path("nvidia/cu13/include/nvml.h")
MPS_CONTROL_NAME = "nvidia-cuda-mps-control"
PACKAGED_MPS_CONTROL = NATIVE_DIR / MPS_CONTROL_NAME
MPS_CONTROL_SOURCE = "mpscontrol.c"
NVIDIA_SMI_NAME = "nvidia-smi"
PACKAGED_NVIDIA_SMI = NATIVE_DIR / NVIDIA_SMI_NAME
NVIDIA_SMI_SOURCE = "nvidiasmi.c"
SOURCES = (
    "json.c",
    "node.c",
    "view.c",
    "check.c",
    "eventline.c",
    "events.c",
    "system.c",
    "device.c",
    "mig.c",
    "state.c",
    "limits.c",
    "compute.c",
)
# The cgroup rule the simulation shares with the memory-limit hook (deviceplugin/node/native/).
SHARED_DIR = NATIVE_DIR.parent.parent / "node" / "native"
SHARED_SOURCES = ("cgroup.c",)
HOOK_NAME = "memory-limit-hook"
HOOK_SOURCE = "memory_limit_hook.c"
PACKAGED_HOOK = SHARED_DIR / HOOK_NAME
CFLAGS = ("-std=c11", "-O2", "-g", "-fPIC", "-pthread", "-Wall", "-Wextra", "-Werror")
FUZZ_FLAGS = ("-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=all")
SANITIZERS = {
    "address": ("-fsanitize=address,undefined", "-fno-sanitize-recover=all"),
    "thread": ("-fsanitize=thread",),
}
_DECLARATION = re.compile(r"\bnvmlReturn_t\s+(nvml\w+)\s*\(([^;{]*?)\)\s*;")
_DEFINED = re.compile(r"^[^\n;]*\bDECLDIR\b[^\n(]*?\b(nvml\w+)\(", re.MULTILINE)


class BuildError(Exception):
    """The library cannot be built here (no header, no gcc, a compile error)."""


def nvml_header() -> Path:
    """nvml.h from the nvidia-nvml-dev wheel installed beside this package."""
    for entry in sys.path:
        candidate = Path(entry or ".") / HEADER_IN_WHEEL
        if candidate.is_file():
            return candidate
    raise BuildError(
        f"no {HEADER_IN_WHEEL} on sys.path: pip install nvidia-nvml-dev==13.4.92 "
        "(the dev extra of this package pins it)"
    )


def library_path() -> Path:
    """The simulated library: the one packaged with this install, else a cached build. A
    packaged library built for another architecture is no use here (the dynamic loader would
    say only "No such file or directory"): a build replaces it, or the error says why."""
    if not PACKAGED.is_file():
        return build()
    theirs, ours = elf_machine(PACKAGED), _MACHINES.get(platform.machine())
    if theirs == ours or ours is None:
        return PACKAGED
    try:
        return build()
    except BuildError as err:
        raise BuildError(
            f"{PACKAGED} is built for {_machine_name(theirs)}, this machine is "
            f"{platform.machine()}; building one here failed too: {err}"
        ) from None


# ELF e_machine values of the architectures NVIDIA ships drivers for.
_MACHINES = {"x86_64": 62, "aarch64": 183, "arm64": 183}


def elf_machine(path: Path) -> int | None:
    """The ELF e_machine of a shared library; None when it is no ELF file."""
    with open(path, "rb") as stream:
        header = stream.read(20)
    if len(header) < 20 or header[:4] != b"\x7fELF":
        return None
    return int.from_bytes(header[18:20], "little" if header[5] == 1 else "big")


def _machine_name(machine: int | None) -> str:
    names = {62: "x86_64", 183: "aarch64"}
    return "no ELF machine" if machine is None else names.get(machine, f"ELF machine {machine}")


def build() -> Path:
    """The cached library for the current sources, built first if missing."""
    header = nvml_header()

    def compile_into(output: Path) -> None:
        _compile(
            header,
            output.parent,
            CFLAGS,
            "-shared",
            f"-Wl,--version-script={NATIVE_DIR / 'exports.map'}",
            f"-Wl,-soname,{LIBRARY_NAME}",
            "-Wl,-z,nodelete",
            "-o",
            str(output),
        )

    return _cached(_key(header, CFLAGS), LIBRARY_NAME, compile_into)


def mps_control_path() -> Path:
    """The simulated `nvidia-cuda-mps-control`: the one packaged with this install when it is
    built for this machine, else a cached build."""
    if PACKAGED_MPS_CONTROL.is_file() and elf_machine(PACKAGED_MPS_CONTROL) == _MACHINES.get(
        platform.machine()
    ):
        return PACKAGED_MPS_CONTROL
    return build_mps_control()


def build_mps_control() -> Path:
    """The cached control program for the current source, built first if missing."""
    source = NATIVE_DIR / MPS_CONTROL_SOURCE
    flags = (*CFLAGS, "-static")
    digest = hashlib.sha256(source.read_bytes() + Path(__file__).read_bytes())
    digest.update(" ".join(flags).encode())

    def compile_into(output: Path) -> None:
        _gcc(*flags, str(source), "-o", str(output))

    return _cached(digest.hexdigest()[:20], MPS_CONTROL_NAME, compile_into)


def nvidia_smi_path() -> Path:
    """The simulated `nvidia-smi`: the one packaged with this install when it is built for this
    machine, else a cached build."""
    if PACKAGED_NVIDIA_SMI.is_file() and elf_machine(PACKAGED_NVIDIA_SMI) == _MACHINES.get(
        platform.machine()
    ):
        return PACKAGED_NVIDIA_SMI
    return build_nvidia_smi()


def build_nvidia_smi() -> Path:
    """The cached `nvidia-smi` for the current source and header, built first if missing. It
    loads the library at run time (dlopen), as NVIDIA's loads the driver's."""
    header = nvml_header()
    source = NATIVE_DIR / NVIDIA_SMI_SOURCE
    digest = hashlib.sha256(source.read_bytes() + header.read_bytes() + Path(__file__).read_bytes())

    def compile_into(output: Path) -> None:
        _gcc(*CFLAGS, f"-I{header.parent}", str(source), "-ldl", "-o", str(output))

    return _cached(f"smi-{digest.hexdigest()[:20]}", NVIDIA_SMI_NAME, compile_into)


def _cached(key: str, name: str, compile_into: Callable[[Path], None]) -> Path:
    """`<cache>/<key>/<name>`, compiled first by `compile_into(output)` in a scratch folder
    renamed into place, so a reader never sees half a build and two builders race harmlessly."""
    target = _cache_dir() / key / name
    if target.is_file():
        return target
    target.parent.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent.parent) as scratch:
        work = Path(scratch)
        output = work / name
        compile_into(output)
        built = work / "done"
        built.mkdir()
        output.rename(built / name)
        try:
            built.rename(target.parent)
        except OSError:
            if not target.is_file():  # not another process finishing the same build first
                raise
    return target


def hook_program() -> Path:
    """The memory-limit hook: the one packaged with this install, else a cached build."""
    if PACKAGED_HOOK.is_file():
        return PACKAGED_HOOK
    header = nvml_header()
    sources = tuple(SHARED_DIR / name for name in (HOOK_SOURCE, *SHARED_SOURCES))
    digest = hashlib.sha256()
    for path in (header, Path(__file__), *sources, *sorted(SHARED_DIR.glob("*.h"))):
        digest.update(path.read_bytes())

    def compile_into(output: Path) -> None:
        _gcc(
            *CFLAGS, f"-I{header.parent}", f"-I{SHARED_DIR}", *map(str, sources), "-ldl",
            "-o", str(output),
        )  # fmt: skip

    return _cached(f"hook-{digest.hexdigest()[:20]}", HOOK_NAME, compile_into)


def sanitized_program(main_source: Path, output: Path, sanitizer: str = "address") -> Path:
    """`main_source` linked with the library's sources under AddressSanitizer and UBSan
    ("address") or ThreadSanitizer ("thread"): an executable that tests the simulation with
    every memory, undefined-behaviour or data-race check on."""
    flags = (*CFLAGS, "-fno-omit-frame-pointer", *SANITIZERS[sanitizer])
    _compile(nvml_header(), output.parent, flags, str(main_source), "-o", str(output))
    return output


def fuzz_target(main_source: Path, output: Path, *defines: str) -> Path:
    """`main_source` (a libFuzzer target) linked with the library's sources by clang, under
    libFuzzer, AddressSanitizer and UBSan."""
    flags = (*CFLAGS, "-fno-omit-frame-pointer", *FUZZ_FLAGS, *defines)
    _compile(nvml_header(), output.parent, flags, str(main_source), "-o", str(output), cc="clang")
    return output


def _compile(
    header: Path, work: Path, flags: tuple[str, ...], *arguments: str, cc: str | None = None
) -> None:
    """gcc (or `cc`) over the library's sources and the stubs generated from `header` (into
    `work`)."""
    stubs = work / "stubs.c"
    stubs.write_text(stub_source(header))
    _gcc(
        *flags,
        f"-I{header.parent}",
        f"-I{NATIVE_DIR}",
        f"-I{SHARED_DIR}",
        *(str(NATIVE_DIR / name) for name in SOURCES),
        *(str(SHARED_DIR / name) for name in SHARED_SOURCES),
        str(stubs),
        *arguments,
        compiler=cc,
    )


def declared_functions(header: Path) -> dict[str, str]:
    """Every function nvml.h declares (with the unversioned names), name -> parameter list."""
    text = _gcc("-E", "-P", "-DNVML_NO_UNVERSIONED_FUNC_DEFS=1", "-x", "c", str(header))
    flat = " ".join(text.split())
    found: dict[str, str] = {}
    for match in _DECLARATION.finditer(flat):
        found.setdefault(match.group(1), match.group(2).strip())
    return found


def modelled_functions() -> set[str]:
    """The NVML functions `native/*.c` define."""
    names: set[str] = set()
    for name in SOURCES:
        names.update(_DEFINED.findall((NATIVE_DIR / name).read_text()))
    return names


def stub_source(header: Path) -> str:
    """C definitions answering NOT_SUPPORTED for every declared function not modelled."""
    modelled = modelled_functions()
    lines = [
        "/* Generated by deviceplugin.sim.libbuild from nvml.h: not modelled by the simulation. */",
        "#define NVML_NO_UNVERSIONED_FUNC_DEFS 1",
        "#include <nvml.h>",
        '#pragma GCC diagnostic ignored "-Wunused-parameter"',
        '#pragma GCC diagnostic ignored "-Wdeprecated-declarations"',
    ]
    for name, parameters in sorted(declared_functions(header).items()):
        if name not in modelled:
            lines.append(
                f"nvmlReturn_t {name}({parameters}) {{ return NVML_ERROR_NOT_SUPPORTED; }}"
            )
    return "\n".join(lines) + "\n"


def _key(header: Path, flags: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for path in (
        header,
        Path(__file__),
        NATIVE_DIR / "exports.map",
        *(NATIVE_DIR / n for n in SOURCES),
        *(SHARED_DIR / n for n in SHARED_SOURCES),
    ):
        digest.update(path.read_bytes())
    for path in sorted([*NATIVE_DIR.glob("*.h"), *SHARED_DIR.glob("*.h")]):
        digest.update(path.read_bytes())
    digest.update(" ".join(flags).encode())
    return digest.hexdigest()[:20]


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "deviceplugin" / "nvml-sim"


def _gcc(*arguments: str, compiler: str | None = None) -> str:
    compiler = compiler or os.environ.get("CC", "gcc")
    try:
        done = subprocess.run(
            [compiler, *arguments], capture_output=True, text=True, check=False, timeout=300
        )
    except OSError as err:
        raise BuildError(f"cannot run {compiler}: {err}") from err
    if done.returncode != 0:
        raise BuildError(f"{compiler} failed:\n{done.stderr[-4000:]}")
    return done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deviceplugin.sim.libbuild")
    parser.add_argument("--into", help="copy the built library and program into this folder")
    parser.add_argument("--hook-into", help="copy the built memory-limit hook into this folder")
    options = parser.parse_args(argv)
    try:
        paths = [build(), build_mps_control(), build_nvidia_smi()]
        hook = hook_program() if options.hook_into else None
    except BuildError as err:
        print(f"libbuild: {err}", file=sys.stderr)
        return 1
    for path in paths:
        if options.into:
            path = Path(shutil.copy2(path, Path(options.into) / path.name))
        print(path)
    if hook is not None and hook != Path(options.hook_into) / HOOK_NAME:
        shutil.copy2(hook, Path(options.hook_into) / HOOK_NAME)
    return 0


if __name__ == "__main__":  # a build step's entry point, apart from the daemon's __main__
    raise SystemExit(main())
