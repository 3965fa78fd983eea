"""Reading a config file from the host: the only I/O of the config (`model.config` parses).

The file is untrusted input that a reload reads while the plugin serves: `read_text` reads only a
regular file of at most `MAX_CONFIG_BYTES` (a FIFO would block the reader, `/dev/zero` never
ends); a file that cannot be read is a ConfigError naming it and why.

A config of `--config-dir` is read only where it resolves inside that directory (`within`): a
ConfigMap volume's entries are links into its own `..data`, and an entry leading elsewhere (a
link to /etc/shadow) would otherwise have its content quoted by the parser's messages in the
log and `/status`. Such an entry is refused unopened, naming the problem and nothing it holds.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from deviceplugin.model.config import ParsedConfig, load_config_text
from deviceplugin.model.config_keys import MAX_CONFIG_BYTES
from deviceplugin.model.errors import ConfigError
from deviceplugin.node.regularfile import not_regular, read_at_most


def read_text(path: str, only_regular: bool = True, within: str | None = None) -> str:
    """A config file's text; a file that cannot be read is an error naming it and why.

    Only a regular file (after following symlinks) of at most MAX_CONFIG_BYTES is read. It is
    opened without blocking and checked on the open descriptor, so a FIFO or device swapped in
    at any moment is refused instead of read. `only_regular` False lets a one-shot command read
    a pipe or terminal too (`validate-config /dev/stdin`), as much as a file may hold. With
    `within` (a `--config-dir`), the file must resolve inside that directory: checked before it
    is opened, and again on the open descriptor, so an entry swapped in between is refused too."""
    if within is not None:
        check_inside(path, within)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(path, f"cannot read config file: {exc.strerror}") from None
    try:
        if within is not None:  # Linux's /proc names the file opened, not where the entry leads now
            check_inside(f"/proc/self/fd/{fd}", within, os.path.basename(path))
        size = _regular_size(fd, path) if only_regular else 0
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(path, _too_big(size))
        os.set_blocking(fd, True)
        data = read_at_most(fd, MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(path, f"cannot read config file: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_CONFIG_BYTES:  # it grew while being read
        raise ConfigError(path, _too_big(None))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(path, "cannot read config file: not UTF-8 text") from None


def check_inside(path: str, directory: str, name: str | None = None) -> None:
    """Raise ConfigError unless `path`, symlinks followed, lies inside `directory` (itself
    resolved: `--config-dir` may be a link). The message names the config (`name`, else the
    last part of `path`) and the directory, never the target, let alone its content."""
    root = os.path.realpath(directory)
    if os.path.commonpath([root, os.path.realpath(path)]) != root:
        config = name or os.path.basename(path)
        outside = f"resolves outside --config-dir {directory}: refused"
        raise ConfigError("", f"config {config!r} {outside}")


def _regular_size(fd: int, path: str) -> int:
    """The size of the open file; an error unless it is a regular file."""
    info = os.fstat(fd)
    kind = not_regular(info.st_mode)
    if kind is not None:
        raise ConfigError(path, f"cannot read config file: it is {kind}, not a regular file")
    return info.st_size


def _too_big(size: int | None) -> str:
    """`size` None: more came than the limit (a pipe, a file growing while read)."""
    limit = f"the limit is {MAX_CONFIG_BYTES} bytes (1 MiB, the most a ConfigMap holds)"
    if size is None:
        return f"config file holds more than {MAX_CONFIG_BYTES} bytes; {limit}"
    return f"config file is {size} bytes; {limit}"


def load_config(
    path: str | None, cli: Mapping[str, str | None], env: Mapping[str, str]
) -> ParsedConfig:
    """Read the file at `path` (none: defaults), then apply overrides, flag > env > file.

    `cli` maps the keys of ENV_OVERRIDES to a flag's value, None when the flag was not given
    (other keys are ignored); an empty environment variable counts as unset."""
    return load_config_text(None if path is None else read_text(path), path, cli, env)
