#!/bin/sh
# forkd initramfs /init (busybox sh). Loads the virtio modules, mounts /dev/vda (ext4, rw) on
# /newroot and switch_roots into /.forkd/forkd-agent (fallbacks: /sbin/forkd-agent for images
# built before /.forkd/ existed, /sbin/init, /bin/sh).
# Never hangs: any failure prints "forkd-init: FATAL: ..." on the console and powers off.
#
# Kernel command line options it honours:
#   root=/dev/XXX        root block device (default /dev/vda)
#   forkd.rootwait=N     seconds to wait for the root device (default 30; TCG is slow)
#   forkd.boottest=1     after mounting the root: check python3 + numpy in a chroot, print
#                        "FORKD-BOOT-OK ..." (or "FORKD-BOOT-FAIL ..."), unmount, power off
#   forkd.shell=1        drop to a busybox shell in the initramfs instead of switch_root
#   forkd.init=PATH      run PATH (inside the new root) instead of /.forkd/forkd-agent
export PATH=/bin:/sbin:/usr/bin:/usr/sbin

log() { echo "forkd-init: $*"; }

poweroff_now() {
	sync
	poweroff -f
	# poweroff -f should not return; if the platform cannot power off, stop here visibly
	# instead of letting PID 1 exit (a kernel panic loop).
	echo "forkd-init: poweroff failed; halting"
	while :; do sleep 3600; done
}

fail() {
	echo "forkd-init: FATAL: $*"
	[ -f /proc/uptime ] && echo "forkd-init: uptime $(cut -d' ' -f1 /proc/uptime)s"
	poweroff_now
}

mkdir -p /proc /sys /dev /newroot /run /tmp
mount -t proc -o nosuid,nodev,noexec proc /proc || fail "mount /proc"
mount -t sysfs -o nosuid,nodev,noexec sysfs /sys || fail "mount /sys"
mount -t devtmpfs -o nosuid,mode=0755 devtmpfs /dev || fail "mount devtmpfs /dev"
# The kernel opened /dev/console from the cpio before devtmpfs existed; re-open on devtmpfs.
exec </dev/console >/dev/console 2>&1

ROOT=/dev/vda
ROOTWAIT=30
BOOTTEST=0
SHELL_ONLY=0
USER_INIT=
for arg in $(cat /proc/cmdline); do
	case "$arg" in
	root=*) ROOT="${arg#root=}" ;;
	forkd.rootwait=*) ROOTWAIT="${arg#forkd.rootwait=}" ;;
	forkd.boottest=1) BOOTTEST=1 ;;
	forkd.shell=1) SHELL_ONLY=1 ;;
	forkd.init=*) USER_INIT="${arg#forkd.init=}" ;;
	esac
done
case "$ROOTWAIT" in '' | *[!0-9]*) ROOTWAIT=30 ;; esac

# Modules, in dependency order (written at build time by build.sh).
if [ -f /lib/modules/forkd.order ]; then
	while read -r mod; do
		[ -n "$mod" ] || continue
		name="${mod##*/}"; name="${name%.ko}"
		# Already present (built in, or loaded)? /sys/module/<name> exists then.
		[ -d "/sys/module/$(echo "$name" | tr - _)" ] && continue
		insmod "/lib/modules/$mod" || fail "insmod $mod failed"
	done </lib/modules/forkd.order
fi

if [ "$SHELL_ONLY" = 1 ]; then
	log "forkd.shell=1: initramfs shell (exit to power off)"
	sh
	poweroff_now
fi

# Wait (bounded) for the root device; poll every 50 ms.
i=0
limit=$((ROOTWAIT * 20))
while [ ! -b "$ROOT" ]; do
	i=$((i + 1))
	[ "$i" -le "$limit" ] || fail "root device $ROOT did not appear within ${ROOTWAIT}s (virtio_blk loaded? devices: $(ls /sys/bus/virtio/devices 2>/dev/null | tr '\n' ' '))"
	sleep 0.05
done

mount -t ext4 -o rw,noatime "$ROOT" /newroot || fail "mount -t ext4 $ROOT /newroot failed"

# Hand the API filesystems over to the new root (busybox switch_root does not move them).
for m in dev proc sys; do
	if [ -d "/newroot/$m" ]; then
		mount --move "/$m" "/newroot/$m" || fail "mount --move /$m"
	else
		umount -l "/$m" 2>/dev/null
	fi
done

if [ "$BOOTTEST" = 1 ]; then
	# /proc and /dev now live under /newroot. Use busybox for everything outside the chroot.
	up=$(cut -d' ' -f1 /newroot/proc/uptime)
	agent=absent
	{ [ -x /newroot/.forkd/forkd-agent ] || [ -x /newroot/sbin/forkd-agent ]; } && agent=present
	echo "forkd-init: root mounted at uptime ${up}s; checking python3 + numpy"
	if out=$(chroot /newroot /usr/bin/python3 -c 'import sys, numpy; print("python", sys.version.split()[0], "numpy", numpy.__version__)' 2>&1); then
		echo "FORKD-BOOT-OK root_mounted=${up}s python_done=$(cut -d' ' -f1 /newroot/proc/uptime)s agent=$agent $out"
	else
		echo "FORKD-BOOT-FAIL root_mounted=${up}s agent=$agent python3/numpy check failed: $out"
	fi
	umount /newroot/dev /newroot/proc /newroot/sys 2>/dev/null
	mount -o remount,ro /newroot 2>/dev/null
	umount /newroot 2>/dev/null
	poweroff_now
fi

for cand in "$USER_INIT" /.forkd/forkd-agent /sbin/forkd-agent /sbin/init /bin/sh; do
	[ -n "$cand" ] || continue
	if [ -x "/newroot$cand" ] || [ -L "/newroot$cand" ]; then
		[ "$cand" = /.forkd/forkd-agent ] || log "starting fallback init $cand"
		exec switch_root /newroot "$cand"
		fail "switch_root /newroot $cand failed"
	fi
done
fail "no init found in the root filesystem (/.forkd/forkd-agent, /sbin/forkd-agent, /sbin/init, /bin/sh)"
