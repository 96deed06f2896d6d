#!/usr/bin/env bash
# The offline kind node's base image, from Debian packages (no registry needed):
# what kind's images/base Dockerfile does, with Debian bookworm's systemd, containerd
# 1.6, runc and CNI plugins instead of kind's own builds, and crictl from its Go module.
#
#   hack/kind/offline/base.sh        prints the image name (built unless present)
#
# The tag is a hash of this script, files/ and the versions below, so an unchanged
# input reuses the image and any change builds a new one. Needs mmdebstrap, docker,
# go (crictl) and the kind module in the Go module cache (`go install sigs.k8s.io/kind@...`
# puts it there). Progress goes to stderr; stdout is the image name only.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${KIND_VERSION:=v0.33.0}"
: "${CRICTL_VERSION:=v1.37.0}"
: "${DEBIAN_SUITE:=bookworm}"
: "${KIND_IMAGE_PREFIX:=himitsu-kind}"
: "${KIND_CACHE_DIR:=$here/../../../.local/kind-cache}"
packages=(
  systemd containerd runc containernetworking-plugins
  conntrack iptables nftables iproute2 ethtool util-linux mount kmod hostname
  libseccomp2 pigz e2fsprogs bash ca-certificates jq procps
)

log() { echo "base.sh: $*" >&2; }

inputs_hash() {
  {
    printf '%s\n' "$KIND_VERSION" "$CRICTL_VERSION" "$DEBIAN_SUITE" "${packages[*]}"
    cat "$here/base.sh"
    find "$here/files" -type f | LC_ALL=C sort | xargs cat
  } | sha256sum | cut -c1-12
}

image="$KIND_IMAGE_PREFIX/base:$DEBIAN_SUITE-$(inputs_hash)"
if docker image inspect "$image" >/dev/null 2>&1; then
  log "$image is present"
  echo "$image"
  exit 0
fi

kind_files="$(go env GOMODCACHE)/sigs.k8s.io/kind@$KIND_VERSION/images/base/files"
if [[ ! -d "$kind_files" ]]; then
  log "kind's base files are not in the Go module cache; fetching sigs.k8s.io/kind@$KIND_VERSION"
  go mod download "sigs.k8s.io/kind@$KIND_VERSION"
fi
[[ -d "$kind_files" ]] || { log "missing $kind_files"; exit 1; }

start=$SECONDS
mkdir -p "$KIND_CACHE_DIR"
KIND_CACHE_DIR="$(cd "$KIND_CACHE_DIR" && pwd)"
if [[ "$("$KIND_CACHE_DIR/crictl" --version 2>/dev/null)" != *"${CRICTL_VERSION#v}"* ]]; then
  log "building crictl $CRICTL_VERSION"
  CGO_ENABLED=0 GOBIN="$KIND_CACHE_DIR" go install -trimpath -ldflags "-s -w" \
    "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/himitsu-kind-base.XXXXXX")"
trap 'rm -rf "$work"' EXIT
root="$work/rootfs"

log "mmdebstrap $DEBIAN_SUITE (${#packages[@]} packages)"
mmdebstrap --quiet --variant=minbase --include="$(IFS=,; echo "${packages[*]}")" "$DEBIAN_SUITE" "$root" >&2

log "kind's images/base files"
install -m 0755 "$kind_files"/usr/local/bin/entrypoint "$root/usr/local/bin/entrypoint"
install -d -m 0755 "$root/kind" "$root/kind/bin" "$root/kind/manifests"
install -m 0644 "$kind_files"/kind/README.txt "$root/kind/"
install -m 0755 "$kind_files"/kind/bin/* "$root/kind/bin/"
install -m 0644 "$kind_files"/etc/crictl.yaml "$root/etc/"
install -m 0644 "$kind_files"/etc/default/kubelet "$root/etc/default/"
install -m 0644 "$kind_files"/etc/sysctl.d/* "$here/files/99-bridge-nf.conf" "$root/etc/sysctl.d/"
install -m 0644 "$kind_files"/etc/systemd/system/{containerd.service,kubelet.service,kubelet.slice,undo-mount-hacks.service} \
  "$root/etc/systemd/system/"
install -d -m 0755 "$root/etc/systemd/system/kubelet.service.d"
install -m 0644 "$kind_files"/etc/systemd/system/kubelet.service.d/* "$root/etc/systemd/system/kubelet.service.d/"
# Debian installs containerd in /usr/bin, kind's unit expects its own in /usr/local/bin.
sed -i 's|^ExecStart=/usr/local/bin/containerd|ExecStart=/usr/bin/containerd|' \
  "$root/etc/systemd/system/containerd.service"
install -d -m 0755 "$root/etc/containerd"
install -m 0644 "$here/files/containerd-config.toml" "$root/etc/containerd/config.toml"
install -m 0755 "$KIND_CACHE_DIR/crictl" "$root/usr/local/bin/crictl"
# Debian's CNI plugins live in /usr/lib/cni; containerd looks in /opt/cni/bin.
install -d -m 0755 "$root/opt/cni" "$root/etc/cni/net.d"
ln -sfn /usr/lib/cni "$root/opt/cni/bin"
install -m 0644 "$here/files/10-bridge.conflist" "$root/etc/cni/net.d/"
install -m 0644 "$here/files/default-storage.yaml" "$root/kind/manifests/"

log "entrypoint: remount the cgroup v1 controllers read-write before fix_cgroup"
python3 - "$root/usr/local/bin/entrypoint" "$here/files/remount-cgroups.sh" <<'EOF'
import sys
path, extra = sys.argv[1], open(sys.argv[2]).read()
text = open(path).read()
call, anchor = "\nfix_mount\nfix_cgroup\n", "\n# validate state\n"
if text.count(call) != 1 or text.count(anchor) != 1:
    sys.exit("base.sh: kind's entrypoint changed: cannot place remount_cgroups_rw")
text = text.replace(anchor, "\n" + extra + anchor)
text = text.replace(call, "\nfix_mount\nremount_cgroups_rw\nfix_cgroup\n")
open(path, "w").write(text)
EOF

log "systemd units (as kind's Dockerfile)"
find "$root/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
rm -f "$root"/lib/systemd/system/multi-user.target.wants/* "$root"/etc/systemd/system/*.wants/* \
  "$root"/lib/systemd/system/local-fs.target.wants/* \
  "$root"/lib/systemd/system/sockets.target.wants/*udev* \
  "$root"/lib/systemd/system/sockets.target.wants/*initctl* \
  "$root"/lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >>"$root/etc/systemd/journald.conf"
ln -sfn /usr/lib/systemd/systemd "$root/sbin/init"
chroot "$root" systemctl enable kubelet.service containerd.service undo-mount-hacks.service >&2
chroot "$root" systemctl mask systemd-binfmt.service >&2
mkdir -p "$root/etc/kubernetes/manifests"
chroot "$root" ctr oci spec \
  | jq '.hooks.createContainer[.hooks.createContainer|length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
  | jq 'del(.process.rlimits)' >"$root/etc/containerd/cri-base.json"

log "docker import $image"
tar -C "$root" --numeric-owner -cf - . | docker import \
  --change 'ENV container=docker' \
  --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' \
  --change "LABEL io.himitsu.kind.cache=$KIND_IMAGE_PREFIX" \
  - "$image" >/dev/null
log "built $image in $((SECONDS - start)) s"
echo "$image"
