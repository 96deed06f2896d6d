# Inserted into kind's entrypoint between fix_mount and fix_cgroup (by base.sh).
# Without --privileged (see ../docker) docker mounts the cgroup v1 controllers
# read-only in the node, and the kubelet cannot create its cgroups
# ("mkdir /sys/fs/cgroup/cpu//kubelet: read-only file system"). A plain
# `remount,rw` is EBUSY; a bind remount of each controller works. No-op on cgroup v2
# and where they are writable already.
remount_cgroups_rw() {
  [[ -f /sys/fs/cgroup/cgroup.controllers ]] && return 0
  local target options
  while read -r target options; do
    if [[ ",$options," == *,ro,* ]]; then
      log_info "remounting $target read-write"
      mount -o remount,bind,rw "$target"
    fi
  done < <(findmnt -lun -o target,options -t cgroup)
}
