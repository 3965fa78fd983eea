"""The images the node runs, from local archives only: the plugin's and the workloads' (built by
`make cluster-images`), and the pause image made here from the built pause binary, imported into
containerd's CRI namespace; no registry is ever asked."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

from e2e.cluster.layout import FIRST, IMAGE_ARCHIVES, PAUSE_IMAGE, REPO, RUN, Node
from e2e.cluster.shell import ClusterError, log, run


def ensure_images() -> None:
    """The plugin's two images and the workload image, built here if missing or stale (podman,
    from the local Debian base) and saved as archives for containerd (`make cluster-images`)."""
    if os.environ.get("E2E_CLUSTER_SKIP_IMAGES") == "1":
        return
    done = subprocess.run(["make", "-C", str(REPO), "--no-print-directory", "cluster-images"])
    if done.returncode != 0:
        raise ClusterError("make cluster-images failed (its output is above)")


def ctr(bin_dir: Path, *args: str | Path, node: Node = FIRST) -> str:
    return run([bin_dir / "ctr", "--address", node.containerd_socket, "-n", "k8s.io", *args])


def import_images(bin_dir: Path, node: Node = FIRST) -> None:
    """The pause image (made here from the built pause binary) and every archive in
    IMAGE_ARCHIVES, into the namespace the CRI uses of the node's containerd (each node has its
    own store); no registry is ever asked."""
    present = ctr(bin_dir, "images", "ls", "-q", node=node).split()
    if PAUSE_IMAGE not in present:
        archive = RUN / "pause.tar"
        write_single_binary_image(bin_dir / "pause", PAUSE_IMAGE, archive)
        ctr(bin_dir, "images", "import", archive, node=node)
        log(f"images: imported {PAUSE_IMAGE} into {node.containerd}")
    stamps = node.image_stamps
    stamps.mkdir(parents=True, exist_ok=True)
    if IMAGE_ARCHIVES.is_dir():
        for archive in sorted(IMAGE_ARCHIVES.glob("*.tar")):
            seen = f"{archive.stat().st_mtime_ns} {archive.stat().st_size}"
            stamp = stamps / archive.name
            if stamp.exists() and stamp.read_text() == seen:
                continue
            ctr(bin_dir, "images", "import", archive, node=node)
            stamp.write_text(seen)
            log(f"images: imported {archive.name} into {node.containerd}")


def write_single_binary_image(binary: Path, name: str, archive: Path) -> None:
    """An OCI image archive holding one static binary as its entrypoint."""
    layer_buffer = io.BytesIO()
    with tarfile.open(fileobj=layer_buffer, mode="w") as layer:
        info = layer.gettarinfo(str(binary), arcname=binary.name)
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        with open(binary, "rb") as content:
            layer.addfile(info, content)
    layer_bytes = layer_buffer.getvalue()
    blobs: dict[str, bytes] = {}

    def blob(data: bytes) -> dict[str, object]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"digest": digest, "size": len(data)}

    layer_desc = {"mediaType": "application/vnd.oci.image.layer.v1.tar", **blob(layer_bytes)}
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": [f"/{binary.name}"]},
            "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
        }
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **blob(config)},
            "layers": [layer_desc],
        }
    ).encode()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    **blob(manifest),
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                    },
                }
            ],
        }
    ).encode()
    with tarfile.open(archive, "w") as out:
        entries = {"oci-layout": b'{"imageLayoutVersion": "1.0.0"}', "index.json": index}
        entries.update({f"blobs/sha256/{d.removeprefix('sha256:')}": b for d, b in blobs.items()})
        for path, data in entries.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
