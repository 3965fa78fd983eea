"""Client-go's protobuf bodies read back as JSON (testbed/kubeproto.py), as the API-server
stand-in of `make bench-reference` reads NVIDIA's DRA driver's ResourceSlices. Needs Go and
the k8s.io modules of e2e/reference/dra-driver in Go's module cache (skipped without them)."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from testbed import kubeproto

RESOURCE = "k8s.io.api.resource.v1."


@pytest.fixture(scope="module")
def decoder() -> kubeproto.Decoder:
    if shutil.which("go") is None:
        pytest.skip("Go is not installed")
    try:
        return kubeproto.decoder(kubeproto.module_dirs())
    except RuntimeError as exc:
        pytest.skip(f"the k8s.io modules are not at hand: {exc}")


def _encoded(decoder: kubeproto.Decoder) -> bytes:
    """A ResourceSlice as client-go sends it: the magic, then runtime.Unknown around it."""
    piece: Any = decoder.message(RESOURCE + "ResourceSlice")
    piece.metadata.generateName = "node-a-gpu.nvidia.com-"
    piece.metadata.labels["team"] = "a"
    piece.metadata.creationTimestamp.SetInParent()  # a zero Time, as Go sends one
    piece.spec.driver = "gpu.nvidia.com"
    piece.spec.nodeName = "node-a"
    piece.spec.pool.name = "node-a"
    piece.spec.pool.generation = 0
    piece.spec.pool.resourceSliceCount = 1
    device = piece.spec.devices.add()
    device.name = "gpu-0"
    device.attributes["index"].int = 0
    device.attributes["uuid"].string = "GPU-0"
    device.capacity["memory"].value.string = "80Gi"
    unknown: Any = decoder.message("k8s.io.apimachinery.pkg.runtime.Unknown")
    unknown.typeMeta.apiVersion = "resource.k8s.io/v1"
    unknown.typeMeta.kind = "ResourceSlice"
    unknown.raw = piece.SerializeToString()
    unknown.contentType = kubeproto.CONTENT_TYPE
    return kubeproto.MAGIC + unknown.SerializeToString()


def test_a_resource_slice_reads_as_its_json(decoder: kubeproto.Decoder) -> None:
    assert decoder(_encoded(decoder)) == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "node-a-gpu.nvidia.com-", "labels": {"team": "a"}},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "node-a",
            "pool": {"name": "node-a", "generation": 0, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": "gpu-0",
                    "attributes": {"index": {"int": 0}, "uuid": {"string": "GPU-0"}},
                    "capacity": {"memory": {"value": "80Gi"}},
                }
            ],
        },
    }


def test_what_is_not_a_known_protobuf_object_is_a_value_error(
    decoder: kubeproto.Decoder,
) -> None:
    with pytest.raises(ValueError, match="no k8s"):
        decoder(b'{"kind": "ResourceSlice"}')
    unknown: Any = decoder.message("k8s.io.apimachinery.pkg.runtime.Unknown")
    unknown.typeMeta.apiVersion = "example.com/v1"
    unknown.typeMeta.kind = "Widget"
    with pytest.raises(ValueError, match="no protobuf message"):
        decoder(kubeproto.MAGIC + unknown.SerializeToString())
