#!/bin/sh
# forkd's container entry point (deploy/Dockerfile): makes the container's cgroup able to hold
# forkd's per-sandbox cgroups, then runs the given command (tini, then forkd).
#
# On cgroup v2 a container of its own cgroup namespace sees its cgroup as /sys/fs/cgroup, with
# its processes in it; the kernel lets a cgroup that holds processes give no controllers to
# cgroups below it (only the real root is exempt), so the daemon's `+memory +cpu +pids` for
# /sys/fs/cgroup/forkd/<sandbox> would fail with EBUSY and sandboxes would run without host
# limits. As Docker's own docker-in-docker entry point does, every process is moved into a leaf
# cgroup, init/, first. Only a writable (privileged) v2 hierarchy at the namespace's root is
# touched; elsewhere (v1, a read-only /sys/fs/cgroup as in a gateway) this only runs the command.
set -eu
fs=${FORKD_CGROUP_FS:-/sys/fs/cgroup}
self=${FORKD_CGROUP_SELF:-/proc/self/cgroup}
if [ -f "$fs/cgroup.controllers" ] && [ -w "$fs/cgroup.subtree_control" ] && [ "$(cat "$self")" = "0::/" ]; then
  mkdir -p "$fs/init"
  # One pid a write; a process gone meanwhile (this script's own `cat`) is not an error.
  while read -r pid; do
    echo "$pid" >>"$fs/init/cgroup.procs" 2>/dev/null || :
  done <"$fs/cgroup.procs"
fi
exec "$@"
