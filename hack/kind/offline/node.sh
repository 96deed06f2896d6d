#!/usr/bin/env bash
# The offline kind node image: what `kind build node-image` does, without a registry.
#
#   hack/kind/offline/node.sh        prints the image name (built unless present)
#
# kind's own build fetches pause, etcd, coredns, kindnetd and local-path images from
# registries; here every image is built locally and side-loaded into the node's
# containerd (pinned, so the kubelet never garbage-collects them):
#   * kubelet, kubeadm, kubectl, kube-* and etcd from hack/kube's Go module
#     (`hack/kube/build.sh node`, the Kubernetes version of its go.mod);
#   * the images kubeadm asks for (`kubeadm config images list`), FROM scratch around
#     those static binaries; kube-proxy on a Debian minbase rootfs (it runs iptables);
#     coredns from its Go module at kubeadm's version; pause compiled from the C source
#     in the k8s.io/kubernetes module;
#   * on the base image of base.sh (Debian packages, kind's images/base files).
# No kindnetd and no local-path provisioner: the cluster config disables the default
# CNI (a static bridge config is in the base) and the base has a no-provisioner
# default StorageClass. The tag is a hash of every input, so a present image is reused.
# Progress goes to stderr; stdout is the image name only.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
kube="$repo/hack/kube"
: "${KIND_IMAGE_PREFIX:=himitsu-kind}"
: "${DEBIAN_SUITE:=bookworm}"
: "${KIND_CACHE_DIR:=$repo/.local/kind-cache}"
export KIND_IMAGE_PREFIX DEBIAN_SUITE KIND_CACHE_DIR
bin="${KUBE_BIN_DIR:-$kube/bin}"

log() { echo "node.sh: $*" >&2; }

kube_version="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v1\./ {print $2; exit}' "$kube/go.mod")"
base="$(bash "$here/base.sh")"

inputs_hash() {
  {
    printf '%s\n' "$base" "$kube_version"
    cat "$here/node.sh" "$here/scratch_image.py" "$kube/go.mod" "$kube/go.sum" "$kube/build.sh"
    find "$kube/cmd" -type f | LC_ALL=C sort | xargs cat
  } | sha256sum | cut -c1-12
}

image="$KIND_IMAGE_PREFIX/node:$kube_version-$(inputs_hash)"
if docker image inspect "$image" >/dev/null 2>&1; then
  log "$image is present"
  echo "$image"
  exit 0
fi

start=$SECONDS
work="$(mktemp -d "${TMPDIR:-/tmp}/himitsu-kind-node.XXXXXX")"
container=""
cleanup() {
  [[ -z "$container" ]] || docker rm -f -v "$container" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

log "Kubernetes $kube_version binaries (hack/kube/build.sh node)"
KUBE_BIN_DIR="$bin" bash "$kube/build.sh" node >&2

mapfile -t wanted < <("$bin/kubeadm" config images list --kubernetes-version "$kube_version" 2>/dev/null)
log "kubeadm wants: ${wanted[*]}"
image_for() { printf '%s\n' "${wanted[@]}" | grep -E "^registry.k8s.io/$1:" ; }
pause_image="$(image_for pause)"
coredns_image="$(image_for coredns/coredns)"
etcd_image="$(image_for etcd)"
coredns_version="${coredns_image##*:}"
pause_version="${pause_image##*:}"

mkdir -p "$KIND_CACHE_DIR"
tools="$(cd "$KIND_CACHE_DIR" && pwd)"
if [[ "$("$tools/coredns" -version 2>/dev/null)" != *"CoreDNS-${coredns_version#v}"* ]]; then
  log "building coredns $coredns_version"
  CGO_ENABLED=0 GOBIN="$tools" go install -trimpath -ldflags "-s -w" \
    "github.com/coredns/coredns@$coredns_version" >&2
fi
pause_src="$(cd "$kube" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c"
if [[ ! -x "$tools/pause-$pause_version" ]]; then
  log "compiling pause $pause_version from $pause_src"
  gcc -Os -Wall -Werror -static -DVERSION="v$pause_version-0" -o "$tools/pause-$pause_version" "$pause_src"
fi
proxy_packages=iptables,nftables,conntrack,kmod
minbase="$tools/minbase-$DEBIAN_SUITE-${proxy_packages//,/-}.tar"
if [[ ! -s "$minbase" ]]; then
  log "mmdebstrap minbase rootfs for kube-proxy"
  mmdebstrap --quiet --variant=minbase --include="$proxy_packages" \
    "$DEBIAN_SUITE" "$work/minbase.tar" >&2
  mv "$work/minbase.tar" "$minbase"
fi

log "component images"
mkdir -p "$work/images"
path_env=PATH=/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin:/bin:/sbin
scratch() { python3 "$here/scratch_image.py" --env "$path_env" "$@"; }
for component in kube-apiserver kube-controller-manager kube-scheduler; do
  scratch --tag "registry.k8s.io/$component:$kube_version" --out "$work/images/$component.tar" \
    --file "$bin/$component:/usr/local/bin/$component:0755" --dir /tmp:1777 \
    --entrypoint "[\"/usr/local/bin/$component\"]"
done
scratch --tag "$etcd_image" --out "$work/images/etcd.tar" \
  --file "$bin/etcd:/usr/local/bin/etcd:0755" --dir /tmp:1777 --dir /var/lib/etcd:0700 \
  --entrypoint '["/usr/local/bin/etcd"]'
scratch --tag "registry.k8s.io/kube-proxy:$kube_version" --out "$work/images/kube-proxy.tar" \
  --base-layer "$minbase" --file "$bin/kube-proxy:/usr/local/bin/kube-proxy:0755" \
  --entrypoint '["/usr/local/bin/kube-proxy"]'
scratch --tag "$coredns_image" --out "$work/images/coredns.tar" \
  --file "$tools/coredns:/coredns:0755" --entrypoint '["/coredns"]'
scratch --tag "$pause_image" --out "$work/images/pause.tar" \
  --file "$tools/pause-$pause_version:/pause:0755" --entrypoint '["/pause"]' --user 65535:65535

log "assembling the node in a build container"
container="$KIND_IMAGE_PREFIX-node-build-$$"
# --init: containerd, started and stopped below, is reaped (sleep would leave a zombie).
docker run -d --init --name "$container" --entrypoint=sleep \
  --security-opt seccomp=unconfined "$base" infinity >/dev/null
for b in kubelet kubeadm kubectl; do
  docker cp "$bin/$b" "$container:/usr/bin/$b"
done
docker exec "$container" chown root:root /usr/bin/kubelet /usr/bin/kubeadm /usr/bin/kubectl
docker exec "$container" sh -c "printf %s '$kube_version' >/kind/version"
docker exec "$container" sed -i "s|^  sandbox_image = .*|  sandbox_image = \"$pause_image\"|" \
  /etc/containerd/config.toml
docker cp "$work/images" "$container:/kind/images-import"
docker exec -d "$container" sh -c 'containerd >/var/log/containerd-build.log 2>&1'
deadline=$((SECONDS + 60))
until docker exec "$container" ctr version >/dev/null 2>&1; do
  ((SECONDS < deadline)) || { log "containerd did not come up"; docker exec "$container" cat /var/log/containerd-build.log >&2; exit 1; }
  sleep 0.5
done
for tarball in "$work"/images/*.tar; do
  docker exec "$container" ctr --namespace=k8s.io images import \
    --label=io.cri-containerd.pinned=pinned --all-platforms --no-unpack --digests \
    "/kind/images-import/${tarball##*/}" >&2
done
docker exec "$container" ctr --namespace=k8s.io images list -q >&2
docker exec "$container" pkill -x containerd
deadline=$((SECONDS + 60))
while docker exec "$container" pgrep -x containerd >/dev/null 2>&1; do
  ((SECONDS < deadline)) || { log "containerd did not stop"; exit 1; }
  sleep 0.5
done
docker exec "$container" rm -rf /kind/images-import /var/log/containerd-build.log

docker commit \
  --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' \
  --change 'CMD []' \
  --change 'ENV HTTP_PROXY="" HTTPS_PROXY="" NO_PROXY=""' \
  --change "LABEL io.himitsu.kind.cache=$KIND_IMAGE_PREFIX io.himitsu.kind.kubernetes=$kube_version" \
  "$container" "$image" >/dev/null
log "built $image in $((SECONDS - start)) s"
echo "$image"
