"""Kubernetes' protobuf encoding of built-in objects, read back as the JSON object it stands for.

client-go's typed clients send built-in kinds as `application/vnd.kubernetes.protobuf`, so
NVIDIA's DRA driver creates its ResourceSlices that way; the API-server stand-in
(`deviceplugin/sim/apiserver.py`) takes a decoder for such bodies and validates the result as
it validates JSON. The message types are compiled, when a decoder is made, from the
`generated.proto` files of the k8s.io/api and k8s.io/apimachinery modules that NVIDIA's driver
is built with (e2e/reference/dra-driver/go.mod, found in Go's module cache), so they are the
ones it encodes with.

The JSON is Kubernetes' (the field names of generated.proto are the JSON names): every field
the message carries, with the types whose JSON form is not their message written as the API
server writes them (Quantity and Time as strings, IntOrString as either, RawExtension as the
JSON it holds).
"""

from __future__ import annotations

import base64
import json
import subprocess
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from grpc_tools import protoc  # type: ignore[import-untyped]

REPO = Path(__file__).resolve().parent.parent
DRA_DRIVER_MODULE = REPO / "e2e" / "reference" / "dra-driver"
CONTENT_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"  # before every protobuf-encoded object (k8s.io/apimachinery's serializer)
PROTOS = ("k8s.io/api/resource/v1/generated.proto",)
MODULES = ("k8s.io/api", "k8s.io/apimachinery")
_META = "k8s.io.apimachinery.pkg.apis.meta.v1."
_UNKNOWN = "k8s.io.apimachinery.pkg.runtime.Unknown"

JsonObject = dict[str, Any]


def _time(message: Message) -> str | None:
    seconds, nanos = message.seconds, getattr(message, "nanos", 0)  # type: ignore[attr-defined]
    if not seconds and not nanos:
        return None  # Go writes a zero Time as null; the API server drops it
    moment = datetime.fromtimestamp(seconds + nanos / 1e9, UTC)
    if nanos:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _int_or_string(message: Message) -> object:
    kind: int = message.type  # type: ignore[attr-defined]
    return message.strVal if kind else message.intVal  # type: ignore[attr-defined]


def _quantity(message: Message) -> str:
    text: str = message.string  # type: ignore[attr-defined]
    return text


def _raw(message: Message) -> object:
    return json.loads(message.raw or b"null")  # type: ignore[attr-defined]


_SPECIAL: dict[str, Callable[[Message], object]] = {
    "k8s.io.apimachinery.pkg.api.resource.Quantity": _quantity,
    _META + "Time": _time,
    _META + "MicroTime": _time,
    "k8s.io.apimachinery.pkg.util.intstr.IntOrString": _int_or_string,
    "k8s.io.apimachinery.pkg.runtime.RawExtension": _raw,
}


def to_json(message: Message) -> JsonObject:
    """The JSON object of a decoded message: each field it carries, by its JSON name."""
    out: JsonObject = {}
    for field, value in message.ListFields():
        converted = _field(field, value)
        if converted is not None:
            out[field.name] = converted
    return out


def _field(field: FieldDescriptor, value: Any) -> object:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        inner = field.message_type.fields_by_name["value"]
        return {key: _single(inner, item) for key, item in value.items()}
    if field.is_repeated:
        return [_single(field, item) for item in value]
    return _single(field, value)


def _single(field: FieldDescriptor, value: Any) -> object:
    if field.message_type is not None:
        special = _SPECIAL.get(field.message_type.full_name)
        return special(value) if special else to_json(value)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode()
    return value


class Decoder:
    """Turns a protobuf request body into the JSON object it encodes."""

    def __init__(self, pool: descriptor_pool.DescriptorPool) -> None:
        self._pool = pool

    def message(self, name: str) -> Message:
        """An empty message of the compiled type `name` (its protobuf full name)."""
        descriptor: Descriptor = self._pool.FindMessageTypeByName(name)
        return message_factory.GetMessageClass(descriptor)()

    def __call__(self, body: bytes) -> JsonObject:
        """The object in `body` (the magic, then a runtime.Unknown holding apiVersion, kind and
        the object's own message); ValueError if it is not one of the compiled kinds."""
        if not body.startswith(MAGIC):
            raise ValueError("not a Kubernetes protobuf object (no k8s\\0 prefix)")
        unknown = self.message(_UNKNOWN)
        unknown.ParseFromString(body[len(MAGIC) :])
        api_version = unknown.typeMeta.apiVersion  # type: ignore[attr-defined]
        kind = unknown.typeMeta.kind  # type: ignore[attr-defined]
        group, _, version = api_version.rpartition("/")
        name = f"k8s.io.api.{group.split('.')[0] or 'core'}.{version}.{kind}"
        try:
            message = self.message(name)
        except KeyError:
            raise ValueError(f"{api_version} {kind}: no protobuf message {name} here") from None
        message.ParseFromString(unknown.raw)  # type: ignore[attr-defined]
        return {"apiVersion": api_version, "kind": kind, **to_json(message)}


def module_dirs(module: Path = DRA_DRIVER_MODULE) -> dict[str, Path]:
    """Where Go's module cache holds MODULES at the versions `module`'s go.mod pins."""
    done = subprocess.run(
        ["go", "list", "-m", "-f", "{{.Path}} {{.Dir}}", *MODULES],
        cwd=module,
        capture_output=True,
        text=True,
        check=False,
    )
    found = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    missing = [name for name in MODULES if not found.get(name)]
    if done.returncode != 0 or missing:
        raise RuntimeError(f"go list -m {' '.join(MODULES)}: {done.stderr.strip() or missing}")
    return {name: Path(found[name]) for name in MODULES}


def decoder(dirs: dict[str, Path]) -> Decoder:
    """A decoder for the kinds of PROTOS, compiled from the modules in `dirs` (by module
    path, as `module_dirs` finds them)."""
    with tempfile.TemporaryDirectory(prefix="kubeproto-") as scratch:
        root = Path(scratch) / "include"
        for name, directory in dirs.items():
            link = root / name
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(directory)
        out = Path(scratch) / "set.pb"
        args = ["protoc", f"-I{root}", f"--descriptor_set_out={out}", "--include_imports"]
        if protoc.main([*args, *PROTOS]) != 0:
            raise RuntimeError(f"protoc could not compile {PROTOS} from {dirs}")
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    return Decoder(pool)
