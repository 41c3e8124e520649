#!/usr/bin/env bash
# Boots a forkd guest image once (QEMU microvm) and proves kernel + initramfs + rootfs come up.
#
#   guest/image/boot-test.sh IMAGE_DIR [--timeout SECONDS] [--accel tcg|kvm]
#                            [--no-tsc-khz] [--append "EXTRA KERNEL ARGS"] [--keep]
#
# The guest boots with forkd.boottest=1: the initramfs /init mounts the root disk, runs
# `python3 -c 'import numpy'` in a chroot, prints "FORKD-BOOT-OK ..." on the serial console
# and powers off. The disk is a throwaway qcow2 overlay over rootfs.ext4 (never modified).
# Prints one summary line to stdout; exits 0 only if the marker was seen.
set -euo pipefail
export LC_ALL=C

die() { echo "boot-test: error: $*" >&2; exit 1; }
usage() { sed -n '2,4p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; }

IMAGE= TIMEOUT=120 ACCEL=tcg TSC=1 EXTRA= KEEP=0
while [ $# -gt 0 ]; do
	case "$1" in
	--timeout) TIMEOUT=${2:?}; shift 2 ;;
	--accel) ACCEL=${2:?}; shift 2 ;;
	--no-tsc-khz) TSC=0; shift ;;
	--append) EXTRA=${2?}; shift 2 ;;
	--keep) KEEP=1; shift ;;
	-h | --help) usage; exit 0 ;;
	-*) usage; die "unknown option $1" ;;
	*) [ -z "$IMAGE" ] || die "only one IMAGE_DIR"; IMAGE=$1; shift ;;
	esac
done
[ -n "$IMAGE" ] || { usage; die "IMAGE_DIR is required"; }
IMAGE=$(cd "$IMAGE" && pwd -P) || die "no such directory: $IMAGE"
for f in vmlinuz initrd.img rootfs.ext4; do [ -f "$IMAGE/$f" ] || die "$IMAGE/$f missing"; done
[[ "$TIMEOUT" =~ ^[0-9]+$ ]] || die "--timeout must be whole seconds"

# Prefer the microvm-only binary (starts faster), but Debian builds it KVM-only: it has no TCG.
QEMU=qemu-system-x86_64
if command -v qemu-system-x86_64-microvm >/dev/null &&
	grep -qx "$ACCEL" <(qemu-system-x86_64-microvm -accel help 2>/dev/null); then
	QEMU=qemu-system-x86_64-microvm
fi
command -v "$QEMU" >/dev/null || die "no $QEMU (run scripts/setup-host.sh)"
grep -qx "$ACCEL" <("$QEMU" -accel help 2>/dev/null) || die "$QEMU does not support -accel $ACCEL"
command -v qemu-img >/dev/null || die "no qemu-img (run scripts/setup-host.sh)"

APPEND="console=ttyS0 root=/dev/vda rw quiet panic=-1 forkd.boottest=1"
if [ "$TSC" = 1 ]; then
	# Under TCG the guest cannot calibrate the TSC against microvm's (absent) PIT/HPET and hangs
	# at "Marking TSC unstable"; tell it the host's frequency.
	khz=$(awk -F: '/^cpu MHz/ { printf "%d", $2 * 1000; exit }' /proc/cpuinfo)
	[ -n "$khz" ] && [ "$khz" -gt 0 ] || die "cannot read cpu MHz from /proc/cpuinfo"
	APPEND="$APPEND tsc_early_khz=$khz"
fi
[ -z "$EXTRA" ] || APPEND="$APPEND $EXTRA"

WORK=$(mktemp -d /tmp/forkd-boottest-XXXXXXXX)
QPID=
cleanup() {
	local rc=$?
	trap - EXIT INT TERM HUP
	if [ -n "$QPID" ] && kill -0 "$QPID" 2>/dev/null; then
		kill -TERM "$QPID" 2>/dev/null || true
		sleep 0.3
		kill -KILL "$QPID" 2>/dev/null || true
	fi
	if [ "$KEEP" = 1 ]; then echo "boot-test: kept $WORK" >&2; else rm -rf "$WORK"; fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

qemu-img create -q -f qcow2 -b "$IMAGE/rootfs.ext4" -F raw "$WORK/overlay.qcow2"
SERIAL="$WORK/serial.log"
: >"$SERIAL"

T0=$EPOCHREALTIME
"$QEMU" -M microvm,acpi=on -accel "$ACCEL" -m 512M -smp 2 \
	-nodefaults -no-user-config -display none -no-reboot \
	-kernel "$IMAGE/vmlinuz" -initrd "$IMAGE/initrd.img" -append "$APPEND" \
	-serial "file:$SERIAL" \
	-drive "file=$WORK/overlay.qcow2,if=none,id=d0,format=qcow2,cache=writeback" \
	-device virtio-blk-device,drive=d0 \
	-device virtio-serial-device \
	-chardev "socket,id=agent,path=$WORK/agent.sock,server=on,wait=off" \
	-device virtserialport,chardev=agent,name=forkd.agent \
	>"$WORK/qemu.log" 2>&1 &
QPID=$!

ms_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%d", (b - a) * 1000 }'; }
deadline=$((TIMEOUT * 1000))
T_MARK= RESULT=
while :; do
	if [ -z "$T_MARK" ] && grep -q 'FORKD-BOOT-\(OK\|FAIL\)' "$SERIAL"; then
		T_MARK=$(ms_since "$T0")
		RESULT=$(grep -m1 -a 'FORKD-BOOT-' "$SERIAL" | tr -d '\r')
	fi
	if ! kill -0 "$QPID" 2>/dev/null; then break; fi
	if [ "$(ms_since "$T0")" -ge "$deadline" ]; then
		echo "boot-test: timeout after ${TIMEOUT}s; last console lines:" >&2
		tail -n 25 "$SERIAL" | sed 's/^/  | /' >&2
		exit 1
	fi
	sleep 0.02
done
T_EXIT=$(ms_since "$T0")
QRC=0
wait "$QPID" || QRC=$?
QPID=
if [ -z "$T_MARK" ] && grep -q 'FORKD-BOOT-' "$SERIAL"; then
	T_MARK=$T_EXIT
	RESULT=$(grep -m1 -a 'FORKD-BOOT-' "$SERIAL" | tr -d '\r')
fi

if [ -z "$RESULT" ]; then
	echo "boot-test: QEMU exited (status $QRC) after ${T_EXIT} ms without a FORKD-BOOT marker" >&2
	echo "  qemu: $(tr '\n' ' ' <"$WORK/qemu.log")" >&2
	tail -n 25 "$SERIAL" | sed 's/^/  | /' >&2
	exit 1
fi
case "$RESULT" in
FORKD-BOOT-OK*)
	echo "boot-test: OK marker_ms=$T_MARK qemu_exit_ms=$T_EXIT qemu=$QEMU accel=$ACCEL | $RESULT"
	;;
*)
	echo "boot-test: FAIL marker_ms=$T_MARK | $RESULT" >&2
	grep -a 'forkd-init' "$SERIAL" | sed 's/^/  | /' >&2 || true
	exit 1
	;;
esac
