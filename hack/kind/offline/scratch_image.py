"""Write a docker-archive image tarball (what `docker save` writes) without a daemon.

Why: the offline kind node needs its component images (kube-apiserver, etcd, pause, ...)
under the exact names kubeadm asks for, in the node's containerd only. Building them
here, from files and optional base-layer tarballs, keeps them out of the shared Docker
daemon; `ctr images import` reads this format. Layers are uncompressed, files owned by
root with mtime 0, so equal inputs give equal digests.

    scratch_image.py --tag registry.k8s.io/pause:3.10.2 --out pause.tar \\
        --file build/pause:/pause:0755 --entrypoint '["/pause"]' --user 65535:65535
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import tarfile
from pathlib import Path


def _files_layer(files: list[str], dirs: list[str]) -> bytes:
    """One layer: DEST directories (parents created) and SRC:DEST:MODE files."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        seen: set[str] = set()

        def add_dir(path: str, mode: int = 0o755) -> None:
            parts = path.strip("/").split("/")
            for i in range(1, len(parts) + 1):
                name = "/".join(parts[:i])
                if name and name not in seen:
                    seen.add(name)
                    info = tarfile.TarInfo(name)
                    info.type = tarfile.DIRTYPE
                    info.mode = mode if i == len(parts) else 0o755
                    tar.addfile(info)

        for spec in dirs:
            dest, _, mode = spec.partition(":")
            add_dir(dest, int(mode or "755", 8))
        for spec in files:
            src, dest, mode = spec.split(":")
            parent = dest.strip("/").rpartition("/")[0]
            if parent:
                add_dir(parent)
            data = Path(src).read_bytes()
            info = tarfile.TarInfo(dest.strip("/"))
            info.size = len(data)
            info.mode = int(mode, 8)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", required=True, help="image name:tag as it will be imported")
    parser.add_argument("--out", required=True, type=Path, help="the tarball to write")
    parser.add_argument("--base-layer", action="append", default=[], type=Path,
                        help="a rootfs tarball used as a lower layer (repeatable)")
    parser.add_argument("--file", action="append", default=[], help="SRC:DEST:MODE")
    parser.add_argument("--dir", action="append", default=[], help="DEST[:MODE] (e.g. /tmp:1777)")
    parser.add_argument("--entrypoint", default="null", help="JSON list")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE")
    parser.add_argument("--user", default="")
    args = parser.parse_args()

    layers = [path.read_bytes() for path in args.base_layer]
    layers.append(_files_layer(args.file, args.dir))
    diff_ids = ["sha256:" + hashlib.sha256(layer).hexdigest() for layer in layers]
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": json.loads(args.entrypoint), "Env": args.env,
                   "User": args.user, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created_by": f"hack/kind/offline/scratch_image.py layer {i}"}
                    for i in range(len(layers))],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    layer_names = [f"{diff_id.removeprefix('sha256:')}/layer.tar" for diff_id in diff_ids]
    manifest = [{"Config": config_name, "RepoTags": [args.tag], "Layers": layer_names}]

    with tarfile.open(args.out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def put(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))

        put(config_name, config_bytes)
        for name, layer in zip(layer_names, layers, strict=True):
            put(name, layer)
        put("manifest.json", json.dumps(manifest).encode())


if __name__ == "__main__":
    main()
