#!/usr/bin/env bash
# Builds the forkd guest image for a template or a given root tree, with per-stage caching.
#
#   guest/image/build.sh --template python --cache DIR [--agent PATH | --no-agent]
#                        [--evalsrv PATH] [--mirror URI] [--base-only]
#   guest/image/build.sh --rootfs-dir DIR --rootfs-key KEY --cache DIR [--forkd-files DIR] [...]
# Without --agent: `make -C guest/agent` if guest/agent/Makefile exists (-> guest/agent/forkd-agent),
# else no agent (the initramfs then falls back to /sbin/init or /bin/sh). --no-agent forces none.
#
# stderr: progress for the TypeScript CLI, one event per line:
#   STEP i/N <name> ...           a step starts
#   ... <name> <seconds>s         heartbeat of a long step (every ~10 s)
#   DONE <name> <seconds>s [cached]
#   INFO <text>                   informational (safe to show or ignore)
#   build.sh: error: <text>       fatal error (exit status != 0)
# stdout: exactly one line on success: the absolute path of the image directory
#   DIR/images/<image-hash>/{vmlinuz,initrd.img,rootfs.ext4,manifest.json,provenance}
#
# Stages (each cached in DIR/stages/<stage>-<hash>, built in DIR/tmp-XXXX and renamed):
#   kernel       key: resolved linux-image package name+version, module list, stage code
#   initramfs    key: kernel hash, /init script, busybox binary, stage code
#   rootfs-base  key: template package list, suite, mirror URI, stage code   (template mode)
#   final        key: rootfs-base hash, the /.forkd files' sha256s, stage code
# image hash = sha256 over (format, template, the four stage hashes).
#
# Image mode (--rootfs-dir): the rootfs-base stage is replaced by a given root tree (a flattened
# OCI image: read only, never modified), named by --rootfs-key (e.g. the image's manifest digest:
# the caller promises the same key always means the same tree). Its final stage (final-image)
# copies the tree as it is, adds /.forkd/ and the empty mount points the boot needs where the
# tree has none (proc sys dev run tmp etc), and makes the ext4 from it.
#   final-image  key: rootfs key, the /.forkd files' sha256s (agent, kernels, env, config), code
# image hash = sha256 over (format, "rootfs", the rootfs key, the kernel/initramfs/final hashes).
# --base-only (template mode): make (or find) the template's rootfs-base stage only and print its
# directory (it holds rootfs-base.tar.zst, the debootstrap tree): what tests build images from.
# --forkd-files DIR: a folder with the image's `env` (KEY=VALUE entries each ended by NUL)
# and `config` (key=value lines); both optional, nothing else in it is read.
#
# Everything forkd adds to a guest lives under /.forkd/ (both modes): forkd-agent (PID 1),
# forkd_eval.py, forkd_eval.js and guest/evalsrv/vendor/*.js when those exist, env, config.
#
# Only this script writes DIR/images/ (and DIR/stages/). An image directory is trusted only with
# the `provenance` record this script writes into it (a file no pack can carry: packs install
# their images under DIR/imported/<content address>, see src/image/content.ts). An image
# directory without it (installed by an older forkd that trusted a pack's claimed hash, or made
# by hand) is never used: it is moved to DIR/untrusted/ and the image built again. Format 2:
# the first with provenance records, so no image of format 1 is ever looked up.
#
# Requires root (debootstrap, chroot, mknod; image mode: to keep the tree's owners). Uses only packages from scripts/setup-host.sh.
set -euo pipefail
umask 022
export LC_ALL=C

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/../.." && pwd)

FORMAT=2
SUITE=bookworm
KERNEL_META=linux-image-cloud-amd64
# Modules the initramfs loads; their dependencies are added in dependency order.
MODULES=(virtio virtio_ring virtio_mmio virtio_blk virtio_console virtio_net)
HEADROOM_MIB=256
ROUND_MIB=64
STEPS=(agent kernel initramfs rootfs-base final image) # image mode: rootfs-base is not a step
NSTEPS=${#STEPS[@]}

# ---------------------------------------------------------------------------------------
# output helpers. Everything except the final path goes to stderr (fd 3 = real stdout).
exec 3>&1 1>&2

die() { echo "build.sh: error: $*" >&2; exit 1; }
info() { echo "INFO $*" >&2; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

STEP_I=0 STEP_NAME= STEP_T0=
step_start() {
	STEP_I=$((STEP_I + 1)); STEP_NAME=$1; STEP_T0=$EPOCHREALTIME
	echo "STEP $STEP_I/$NSTEPS $STEP_NAME ..." >&2
}
step_done() { echo "DONE $STEP_NAME $(since "$STEP_T0")s${1:+ $1}" >&2; }

sha_str() { printf '%s' "$1" | sha256sum | cut -c1-64; }
sha_file() { sha256sum "$1" | cut -c1-64; }
fsize() { stat -c %s "$1"; }

# ---------------------------------------------------------------------------------------
# cleanup: temp dirs we created (after unmounting anything below them) and a running child.
TMPDIRS=()
CHILD_PGID=

unmount_below() { # dir: unmount every mount point at or below dir, deepest first
	local dir=$1 m
	for m in $(awk -v d="$dir" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/self/mounts | sort -r); do
		umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
	done
}

safe_rm() { # dir: remove a temp tree, never crossing into a mounted filesystem
	local dir=$1
	[ -e "$dir" ] || return 0
	unmount_below "$dir"
	if awk -v d="$dir" '$2 == d || index($2, d "/") == 1 { found = 1 } END { exit !found }' /proc/self/mounts; then
		echo "build.sh: warning: mounts remain below $dir; not removing it" >&2
		return 1
	fi
	rm -rf --one-file-system "$dir"
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM HUP
	if [ -n "$CHILD_PGID" ]; then
		kill -TERM -- "-$CHILD_PGID" 2>/dev/null || true
		sleep 0.5
		kill -KILL -- "-$CHILD_PGID" 2>/dev/null || true
		local n=0 # wait until the whole group is gone before removing its files
		while kill -0 -- "-$CHILD_PGID" 2>/dev/null && [ $n -lt 50 ]; do sleep 0.1; n=$((n + 1)); done
	fi
	local d
	for d in "${TMPDIRS[@]}"; do safe_rm "$d" || true; done
	if [ "$rc" -ne 0 ]; then echo "build.sh: failed (exit $rc)${STEP_NAME:+ in step $STEP_NAME}" >&2; fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

new_tmp() { # sets NEW_TMP to a fresh temp dir in the cache (same filesystem as the final rename)
	# (not via $(...): the subshell would lose the TMPDIRS registration used by cleanup)
	NEW_TMP=$(mktemp -d "$CACHE/tmp-XXXXXXXX")
	TMPDIRS+=("$NEW_TMP")
}

# run_logged LABEL LOG CMD...: runs CMD in its own process group with output to LOG, prints a
# heartbeat line "... <step> <seconds since the step started>s" every 10 s; on failure shows
# the end of LOG and returns the exit status.
run_logged() {
	local label=$1 log=$2 t0=${STEP_T0:-$EPOCHREALTIME} next=10 rc=0 s
	shift 2
	setsid "$@" >"$log" 2>&1 </dev/null &
	CHILD_PGID=$!
	while kill -0 "$CHILD_PGID" 2>/dev/null; do
		sleep 0.2
		s=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%d", b - a }')
		if [ "$s" -ge "$next" ]; then
			echo "... ${STEP_NAME:-$label} ${s}s" >&2
			next=$((next + 10))
		fi
	done
	wait "$CHILD_PGID" || rc=$?
	CHILD_PGID=
	if [ "$rc" -ne 0 ]; then
		echo "build.sh: $label ('$1') failed (exit $rc); last lines of its output:" >&2
		tail -n 30 "$log" | sed 's/^/  | /' >&2
	fi
	return "$rc"
}

# commit_dir TMP DEST: fsync TMP's files and TMP, rename to DEST (atomic), fsync the parent.
commit_dir() {
	local tmp=$1 dest=$2
	find "$tmp" -type f -exec sync {} +
	sync "$tmp"
	if ! mv -T "$tmp" "$dest" 2>/dev/null; then
		[ -d "$dest" ] || die "cannot rename $tmp to $dest"
		safe_rm "$tmp" # someone else finished it first (should not happen under the lock)
	fi
	sync "$(dirname "$dest")"
}

# ---------------------------------------------------------------------------------------
# arguments
TEMPLATE= CACHE= AGENT= EVALSRV= NO_AGENT=0 MIRROR=${FORKD_MIRROR:-}
ROOTFS_DIR= ROOTFS_KEY= FORKD_FILES= BASE_ONLY=0
usage() { sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; }
while [ $# -gt 0 ]; do
	case "$1" in
	--template) TEMPLATE=${2:?--template needs a value}; shift 2 ;;
	--cache) CACHE=${2:?--cache needs a value}; shift 2 ;;
	--agent) AGENT=${2:?--agent needs a value}; shift 2 ;;
	--evalsrv) EVALSRV=${2:?--evalsrv needs a value}; shift 2 ;;
	--mirror) MIRROR=${2:?--mirror needs a value}; shift 2 ;;
	--no-agent) NO_AGENT=1; shift ;;
	--base-only) BASE_ONLY=1; shift ;;
	--rootfs-dir) ROOTFS_DIR=${2:?--rootfs-dir needs a value}; shift 2 ;;
	--rootfs-key) ROOTFS_KEY=${2:?--rootfs-key needs a value}; shift 2 ;;
	--forkd-files) FORKD_FILES=${2:?--forkd-files needs a value}; shift 2 ;;
	-h | --help) usage; exit 0 ;;
	*) usage; die "unknown argument: $1" ;;
	esac
done
[ -n "$CACHE" ] || { usage; die "--cache is required"; }
if [ -n "$ROOTFS_DIR" ]; then
	[ -z "$TEMPLATE" ] || die "--template and --rootfs-dir exclude each other"
	[ "$BASE_ONLY" = 0 ] || die "--base-only goes with --template"
	[[ "$ROOTFS_KEY" =~ ^[A-Za-z0-9:._-]{1,200}$ ]] || die "--rootfs-dir needs --rootfs-key (letters, digits, :._-)"
	[ -d "$ROOTFS_DIR" ] || die "--rootfs-dir $ROOTFS_DIR: no such directory"
	ROOTFS_DIR=$(cd "$ROOTFS_DIR" && pwd -P)
	if [ -n "$FORKD_FILES" ]; then
		[ -d "$FORKD_FILES" ] || die "--forkd-files $FORKD_FILES: no such directory"
		FORKD_FILES=$(cd "$FORKD_FILES" && pwd -P)
	fi
	TEMPLATE=image
	STEPS=(agent kernel initramfs final-image image)
	NSTEPS=${#STEPS[@]}
else
	[ -n "$TEMPLATE" ] || { usage; die "--template or --rootfs-dir is required"; }
	[ -z "$ROOTFS_KEY$FORKD_FILES" ] || die "--rootfs-key and --forkd-files go with --rootfs-dir"
	[[ "$TEMPLATE" =~ ^[a-z0-9][a-z0-9_-]*$ ]] || die "bad template name: $TEMPLATE"
	TEMPLATE_PKGS_FILE="$SCRIPT_DIR/templates/$TEMPLATE.packages"
	[ -f "$TEMPLATE_PKGS_FILE" ] || die "unknown template '$TEMPLATE' (no $TEMPLATE_PKGS_FILE)"
fi
INIT_SCRIPT="$SCRIPT_DIR/initramfs-init.sh"
[ -f "$INIT_SCRIPT" ] || die "missing $INIT_SCRIPT"

[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, chroot, mknod)"
for t in apt-get apt-cache dpkg-deb debootstrap depmod modprobe cpio zstd gzip mkfs.ext4 e2fsck \
	flock setsid tar sha256sum chroot mknod truncate; do
	command -v "$t" >/dev/null || die "missing tool '$t' (run scripts/setup-host.sh)"
done
[ -x /bin/busybox ] || die "missing /bin/busybox (busybox-static; run scripts/setup-host.sh)"
# Not `| grep -q`: grep exits at the first match, busybox then dies of SIGPIPE, and with
# pipefail the check fails now and then (it did, in CI).
grep -qx switch_root <(/bin/busybox --list) || die "/bin/busybox has no switch_root applet"

mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd -P)
[[ "$CACHE" =~ ^[A-Za-z0-9/._+-]+$ ]] || die "cache path must not contain spaces or special characters: $CACHE"
# stages/ and images/ hold the ext4 images of the root trees (a private image's files, setuid
# binaries) and tmp-XXXX (mktemp -d: 0700) the trees being copied: only root may look inside.
# Made 0700 also when an earlier forkd made them 0755. Jailed VMMs get their image files
# bind-mounted (native/jailer), never through these directories.
mkdir -p -m 0700 "$CACHE/stages" "$CACHE/images"
chmod 0700 "$CACHE/stages" "$CACHE/images"

# One builder per cache at a time. Holding the lock, leftovers of interrupted runs are ours.
exec 9>"$CACHE/.lock"
if ! flock -n 9; then
	info "waiting for another build holding $CACHE/.lock"
	flock 9
fi
for d in "$CACHE"/tmp-*; do
	[ -e "$d" ] || continue
	info "removing leftover $d from an interrupted run"
	safe_rm "$d" || die "cannot clean up $d"
done

# Mirror: the archive apt already uses for bookworm (deb822 .sources or one-line .list).
if [ -z "$MIRROR" ]; then
	MIRROR=$(awk '
		/^URIs:/ { uri = $2 }
		/^Suites:/ { for (i = 2; i <= NF; i++) if ($i == "bookworm") ok = 1 }
		/^$/ { if (ok && uri ~ /\/debian\/?$/ && !found) { print uri; found = 1 } uri = ""; ok = 0 }
		END { if (ok && uri ~ /\/debian\/?$/ && !found) print uri }
	' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)
fi
if [ -z "$MIRROR" ]; then
	MIRROR=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
		awk '$1 == "deb" && $3 == "bookworm" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }')
fi
[ -n "$MIRROR" ] || MIRROR=http://deb.debian.org/debian
MIRROR=${MIRROR%/}

# ---------------------------------------------------------------------------------------
# stage implementations. Their text (declare -f) is part of their cache key.

stage_kernel() { # OUT WORK
	local out=$1 work=$2 kv m f rel
	mkdir -p "$work/dl" "$out/modules"
	# apt drops privileges to _apt for downloads; let it write into the download dir.
	chown _apt "$work/dl" 2>/dev/null || true
	(cd "$work/dl" && apt-get download -q "$KPKG=$KVER") >"$work/download.log" 2>&1 || {
		tail -n 20 "$work/download.log" >&2
		die "apt-get download $KPKG=$KVER failed"
	}
	dpkg-deb -x "$work"/dl/*.deb "$work/x"
	kv=$(ls "$work/x/lib/modules")
	[ "$(echo "$kv" | wc -l)" = 1 ] || die "expected exactly one kernel in $KPKG, found: $kv"
	cp "$work/x/boot/vmlinuz-$kv" "$out/vmlinuz"
	cp "$work/x/boot/config-$kv" "$out/config"
	echo "$kv" >"$out/kernel_version"
	# Things the initramfs relies on being built in (not modules).
	for f in CONFIG_BLK_DEV_INITRD CONFIG_DEVTMPFS CONFIG_EXT4_FS CONFIG_JBD2 CONFIG_CRYPTO_CRC32C \
		CONFIG_SERIAL_8250_CONSOLE CONFIG_ACPI; do
		grep -qx "$f=y" "$out/config" || die "$KPKG: $f is not built in (=y)"
	done
	depmod -b "$work/x" "$kv"
	# Dependency closure of $MODULES, in load order, deduplicated.
	for m in "${MODULES[@]}"; do
		modprobe -d "$work/x" -S "$kv" --show-depends "$m" ||
			die "module $m not found in $KPKG"
	done | awk '$1 == "insmod" && !seen[$2]++ { print $2 }' >"$work/order.abs"
	: >"$out/modules.order"
	while read -r f; do
		rel=${f#"$work/x/lib/modules/$kv/"}
		mkdir -p "$out/modules/$(dirname "$rel")"
		case "$f" in
		*.ko) cp "$f" "$out/modules/$rel" ;;
		*.ko.zst) zstd -dq "$f" -o "$out/modules/${rel%.zst}"; rel=${rel%.zst} ;;
		*.ko.xz) xz -dc "$f" >"$out/modules/${rel%.xz}"; rel=${rel%.xz} ;;
		*.ko.gz) gzip -dc "$f" >"$out/modules/${rel%.gz}"; rel=${rel%.gz} ;;
		*) die "unexpected module file $f" ;;
		esac
		echo "$rel" >>"$out/modules.order"
	done <"$work/order.abs"
	[ -s "$out/modules.order" ] || die "no modules resolved"
	sha_file "$out/vmlinuz" >"$out/vmlinuz.sha256"
}

stage_initramfs() { # OUT WORK
	local out=$1 work=$2 r=$2/root a
	mkdir -p "$r"/{bin,dev,proc,sys,newroot,run,tmp,lib/modules}
	ln -s bin "$r/sbin"
	cp /bin/busybox "$r/bin/busybox"
	for a in $("$r/bin/busybox" --list); do
		[ -e "$r/bin/$a" ] || ln -s busybox "$r/bin/$a"
	done
	mknod -m 600 "$r/dev/console" c 5 1
	mknod -m 666 "$r/dev/null" c 1 3
	install -m 0755 "$INIT_SCRIPT" "$r/init"
	cp -a "$KERNEL_DIR/modules/." "$r/lib/modules/"
	cp "$KERNEL_DIR/modules.order" "$r/lib/modules/forkd.order"
	find "$r" -exec touch -h -d @0 {} +
	if grep -qx 'CONFIG_RD_ZSTD=y' "$KERNEL_DIR/config"; then
		echo zstd >"$out/compression"
		(cd "$r" && find . -print0 | sort -z | cpio --null -o -H newc -R 0:0 --reproducible --quiet) |
			zstd -q -19 -T0 >"$out/initrd.img"
	else
		echo gzip >"$out/compression"
		(cd "$r" && find . -print0 | sort -z | cpio --null -o -H newc -R 0:0 --reproducible --quiet) |
			gzip -9 -n >"$out/initrd.img"
	fi
	sha_file "$out/initrd.img" >"$out/initrd.img.sha256"
}

trim_rootfs() { # ROOT: drop docs, man pages, locales (keep C.UTF-8), apt lists and caches
	local r=$1
	rm -rf "$r"/usr/share/doc/* "$r"/usr/share/man/* "$r"/usr/share/info/* \
		"$r"/usr/share/lintian "$r"/usr/share/linda "$r"/usr/share/groff/*
	find "$r/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} + 2>/dev/null || true
	find "$r/usr/lib/locale" -mindepth 1 -maxdepth 1 ! -name C.utf8 -exec rm -rf {} + 2>/dev/null || true
	rm -rf "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/* "$r"/var/cache/debconf/*-old \
		"$r"/var/lib/dpkg/*-old "$r"/tmp/* "$r"/var/tmp/*
	mkdir -p "$r/var/lib/apt/lists/partial" "$r/var/cache/apt/archives/partial"
	find "$r/var/log" -type f -delete
	# numpy's own test suites (~15 MB) are not needed to run numpy (templates without python have none).
	if [ -d "$r/usr/lib/python3/dist-packages" ]; then
		find "$r/usr/lib/python3/dist-packages" -depth -type d -name tests -path '*/numpy/*' -exec rm -rf {} +
	fi
	# Keep later apt-get installs inside the guest from bringing the docs back.
	mkdir -p "$r/etc/dpkg/dpkg.cfg.d"
	cat >"$r/etc/dpkg/dpkg.cfg.d/01-forkd-nodoc" <<-'EOF'
		path-exclude /usr/share/doc/*
		path-exclude /usr/share/man/*
		path-exclude /usr/share/info/*
		path-exclude /usr/share/locale/*
		path-include /usr/share/locale/locale.alias
	EOF
}

stage_rootfs_base() { # OUT WORK
	local out=$1 work=$2 r=$2/root
	run_logged debootstrap "$work/debootstrap.log" \
		debootstrap --variant=minbase --include="$PKGS_CSV" "$SUITE" "$r" "$MIRROR"
	# debootstrap unmounts its /proc and /sys on success; make sure nothing is left mounted.
	unmount_below "$r"
	# Debian's postinst (py3compile) already byte-compiles packaged modules; this catches
	# anything it skipped so the first import in a fresh VM never writes .pyc files.
	if [ -x "$r/usr/bin/python3" ]; then
		chroot "$r" /usr/bin/python3 -m compileall -q -x '/tests?/' /usr/lib/python3 >/dev/null 2>&1 ||
			info "compileall reported errors (ignored)"
	fi
	trim_rootfs "$r"
	chroot "$r" dpkg-query -W -f '${Package}=${Version}\n' >"$out/packages.txt"
	tar --numeric-owner --xattrs --xattrs-include='*' --acls -C "$r" -cf - . |
		zstd -q -3 -T0 >"$out/rootfs-base.tar.zst"
	du -sm "$r" | cut -f1 >"$out/used_mib"
}

stage_final() { # OUT WORK
	local out=$1 work=$2 r=$2/root used size
	mkdir -p "$r"
	zstd -dcq "$BASE_DIR/rootfs-base.tar.zst" |
		tar --numeric-owner --xattrs --xattrs-include='*' --acls -xpf - -C "$r"
	mkdir -p "$r/root" "$r/tmp" "$r/run"
	chmod 0700 "$r/root"
	chmod 1777 "$r/tmp"
	install_forkd_dir "$r"
	echo forkd >"$r/etc/hostname"
	printf '127.0.0.1\tlocalhost\n127.0.1.1\tforkd\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$r/etc/hosts"
	rm -f "$r/etc/resolv.conf"
	printf '# forkd: placeholder; the agent writes nameservers here when a network is attached\n' >"$r/etc/resolv.conf"
	make_ext4 "$r" "$out" "$work"
}

# install_forkd_dir ROOT: forkd's own files, all under ROOT/.forkd/ (the image's are not touched).
install_forkd_dir() {
	local r=$1 f
	rm -rf "$r/.forkd"
	mkdir -p "$r/.forkd"
	chmod 0755 "$r/.forkd"
	if [ -n "$AGENT" ]; then install -m 0755 "$AGENT" "$r/.forkd/forkd-agent"; fi
	for f in "${KERNEL_FILES[@]}"; do install -m 0644 "$f" "$r/.forkd/$(basename "$f")"; done
	if [ -n "$FORKD_FILES" ]; then
		for f in env config; do
			if [ -f "$FORKD_FILES/$f" ]; then install -m 0644 "$FORKD_FILES/$f" "$r/.forkd/$f"; fi
		done
	fi
}

# make_ext4 ROOT OUT WORK: ROOT as OUT/rootfs.ext4, sized used + its inode tables + headroom
# rounded up to a multiple of ROUND_MIB (a sparse file), checked with e2fsck. Inodes: the
# tree's entries + 25% + 16384, at least mkfs's default (one per 16 KiB): a tree of many small
# files (or symlinks, which du hardly counts) would run out of the default's in `mkfs -d`.
make_ext4() {
	local r=$1 out=$2 work=$3 used size entries inodes itab
	used=$(du -sm "$r" | cut -f1)
	entries=$(find "$r" | wc -l)
	inodes=$((entries + entries / 4 + 16384))
	itab=$(((inodes * 256 + 1048575) / 1048576)) # 256-byte inodes
	size=$(((used + itab + HEADROOM_MIB + ROUND_MIB - 1) / ROUND_MIB * ROUND_MIB))
	if [ "$inodes" -lt $((size * 64)) ]; then inodes=$((size * 64)); fi # 1 MiB / 16 KiB
	truncate -s "${size}M" "$out/rootfs.ext4"
	mkfs.ext4 -F -q -d "$r" -L forkd-root -m 0 -N "$inodes" "$out/rootfs.ext4" "${size}M"
	e2fsck -fn "$out/rootfs.ext4" >"$work/fsck.log" 2>&1 || {
		cat "$work/fsck.log" >&2
		die "e2fsck found errors in the fresh rootfs.ext4"
	}
	echo "$size" >"$out/size_mib"
	echo "$used" >"$out/used_mib"
	sha_file "$out/rootfs.ext4" >"$out/rootfs.ext4.sha256"
}

stage_final_image() { # OUT WORK: the given tree as it is, plus /.forkd/ and missing mount points
	local out=$1 work=$2 r=$2/root d
	mkdir -p "$r"
	tar --numeric-owner --xattrs --xattrs-include='*' --acls -C "$ROOTFS_DIR" -cf - . |
		tar --numeric-owner --xattrs --xattrs-include='*' --acls -xpf - -C "$r"
	# The boot moves /dev, /proc and /sys into the root and the agent mounts /run and /tmp;
	# the agent writes /etc/resolv.conf when a network is attached. Only where the image has
	# none (a symlink of the image's counts as its own and stays).
	for d in proc sys dev run etc; do
		if [ ! -e "$r/$d" ] && [ ! -L "$r/$d" ]; then mkdir -m 0755 "$r/$d"; fi
	done
	if [ ! -e "$r/tmp" ] && [ ! -L "$r/tmp" ]; then mkdir -m 1777 "$r/tmp"; fi
	install_forkd_dir "$r"
	make_ext4 "$r" "$out" "$work"
}

# run_stage NAME HASH FUNC: if DIR/stages/NAME-HASH exists, it is cached; else build it.
# Sets STAGE_DIR.
run_stage() {
	local name=$1 hash=$2 fn=$3 dest tmp
	dest="$CACHE/stages/$name-$hash"
	step_start "$name"
	if [ -d "$dest" ]; then
		touch -c "$dest" # its last use (the cache collector evicts the least recently used)
		STAGE_DIR=$dest
		step_done cached
		return
	fi
	new_tmp
	tmp=$NEW_TMP
	mkdir -p "$tmp/out" "$tmp/work"
	"$fn" "$tmp/out" "$tmp/work"
	unmount_below "$tmp"
	printf '%s\n' "$hash" >"$tmp/out/stage.hash"
	printf '%s\n' "$KEY" >"$tmp/out/stage.key"
	commit_dir "$tmp/out" "$dest"
	safe_rm "$tmp"
	STAGE_DIR=$dest
	step_done
}

# ---------------------------------------------------------------------------------------
# Step 1: agent (+ eval server). Resolve inputs; build the agent with make if needed.
step_start agent
if [ "$NO_AGENT" = 1 ]; then
	AGENT=
elif [ -z "$AGENT" ] && [ -f "$REPO_DIR/guest/agent/Makefile" ]; then
	info "building the agent: make -C guest/agent"
	make -s --no-print-directory -C "$REPO_DIR/guest/agent" >&2 || die "make -C guest/agent failed"
	AGENT="$REPO_DIR/guest/agent/forkd-agent"
	[ -f "$AGENT" ] || die "make -C guest/agent did not produce $AGENT"
fi
# abs_input FLAG PATH: the absolute path of an input file given with FLAG, or die.
abs_input() {
	[ -f "$2" ] || die "$1 $2: no such file"
	echo "$(cd "$(dirname "$2")" && pwd -P)/$(basename "$2")"
}
if [ -n "$AGENT" ]; then
	AGENT=$(abs_input --agent "$AGENT")
	AGENT_SHA=$(sha_file "$AGENT")
else
	info "no agent (--no-agent, or no --agent and no guest/agent/Makefile): the image boots into /sbin/init or /bin/sh"
	AGENT_SHA=none
fi
if [ -z "$EVALSRV" ] && [ -f "$REPO_DIR/guest/evalsrv/forkd_eval.py" ]; then
	EVALSRV="$REPO_DIR/guest/evalsrv/forkd_eval.py"
fi
KERNEL_FILES=()
if [ -n "$EVALSRV" ]; then
	EVALSRV=$(abs_input --evalsrv "$EVALSRV")
	EVALSRV_SHA=$(sha_file "$EVALSRV")
	[ "$(basename "$EVALSRV")" = forkd_eval.py ] || {
		# installed under its fixed name: copy it to one
		new_tmp
		cp "$EVALSRV" "$NEW_TMP/forkd_eval.py"
		EVALSRV="$NEW_TMP/forkd_eval.py"
	}
	KERNEL_FILES+=("$EVALSRV")
else
	info "no eval server (no --evalsrv, no guest/evalsrv/forkd_eval.py)"
	EVALSRV_SHA=none
fi
# The JavaScript kernel and the single-file modules it loads, when the repository has them.
for f in "$REPO_DIR/guest/evalsrv/forkd_eval.js" "$REPO_DIR"/guest/evalsrv/vendor/*.js; do
	if [ -f "$f" ]; then KERNEL_FILES+=("$f"); fi
done
# OpenSSL's random bytes from getrandom(2), preloaded into the processes children inherit
# (guest/rand/forkd-rand.c): built here like the agent when the repository has it.
if [ "$NO_AGENT" != 1 ] && [ -f "$REPO_DIR/guest/rand/Makefile" ]; then
	make -s --no-print-directory -C "$REPO_DIR/guest/rand" >&2 || die "make -C guest/rand failed"
	[ -f "$REPO_DIR/guest/rand/forkd-rand.so" ] || die "make -C guest/rand did not produce forkd-rand.so"
	KERNEL_FILES+=("$REPO_DIR/guest/rand/forkd-rand.so")
fi
# One line per file installed into /.forkd/ (name and sha256): part of the final stage's key.
FORKD_SUMS=$(
	if [ -n "$AGENT" ]; then echo "forkd-agent $AGENT_SHA"; fi
	for f in "${KERNEL_FILES[@]}"; do echo "$(basename "$f") $(sha_file "$f")"; done
	if [ -n "$FORKD_FILES" ]; then
		for f in env config; do
			if [ -f "$FORKD_FILES/$f" ]; then echo "$f $(sha_file "$FORKD_FILES/$f")"; fi
		done
	fi
)
step_done

# ---------------------------------------------------------------------------------------
# Compute every stage key up front (cheap), so a finished image is found without touching
# the stages at all.
# Kernel package resolution. apt-cache takes ~1 s per call here (the host's apt config disables
# pkgcache.bin), so memoize the answer keyed on the state of apt's lists and configuration: it
# only changes after an apt-get update or a change under /etc/apt.
APT_STATE=$({
	find /var/lib/apt/lists -maxdepth 1 -type f ! -name lock -printf '%f %s %T@\n'
	find /etc/apt -type f -printf '%p %s %T@\n'
} 2>/dev/null | sort | sha256sum | cut -c1-64)
RESOLVE_FILE="$CACHE/resolve/$KERNEL_META-$APT_STATE"
if [ -s "$RESOLVE_FILE" ]; then
	read -r KPKG KVER <"$RESOLVE_FILE"
else
	KPKG=$(apt-cache depends "$KERNEL_META" 2>/dev/null | awk '$1 == "Depends:" && $2 ~ /^linux-image-/ { print $2; exit }')
	[ -n "$KPKG" ] || die "cannot resolve $KERNEL_META with apt-cache depends (run apt-get update?)"
	KVER=$(apt-cache policy "$KPKG" | awk '$1 == "Candidate:" { print $2 }')
	[ -n "$KVER" ] && [ "$KVER" != "(none)" ] || die "no installable version of $KPKG (run apt-get update?)"
	mkdir -p "$CACHE/resolve"
	rm -f "$CACHE/resolve/$KERNEL_META-"*
	printf '%s %s\n' "$KPKG" "$KVER" >"$RESOLVE_FILE.tmp"
	mv -f "$RESOLVE_FILE.tmp" "$RESOLVE_FILE"
fi

if [ -z "$ROOTFS_DIR" ]; then
	PKGS_CSV=$(sed 's/#.*//' "$TEMPLATE_PKGS_FILE" | tr -s ' \t\n' '\n' | sed '/^$/d' | sort -u | paste -sd, -)
	[ -n "$PKGS_CSV" ] || die "$TEMPLATE_PKGS_FILE lists no packages"
else
	PKGS_CSV=
fi

KEY_KERNEL="kernel
package=$KPKG=$KVER
modules=${MODULES[*]}
code=$(declare -f stage_kernel)"
H_KERNEL=$(sha_str "$KEY_KERNEL")

KEY_INITRAMFS="initramfs
kernel=$H_KERNEL
init=$(sha_file "$INIT_SCRIPT")
busybox=$(sha_file /bin/busybox)
code=$(declare -f stage_initramfs)"
H_INITRAMFS=$(sha_str "$KEY_INITRAMFS")

if [ -z "$ROOTFS_DIR" ]; then
	KEY_BASE="rootfs-base
suite=$SUITE
mirror=$MIRROR
packages=$PKGS_CSV
code=$(declare -f stage_rootfs_base trim_rootfs)"
	H_BASE=$(sha_str "$KEY_BASE")

	KEY_FINAL="final
base=$H_BASE
forkd=$FORKD_SUMS
headroom=$HEADROOM_MIB/$ROUND_MIB
code=$(declare -f stage_final install_forkd_dir make_ext4)"
	H_FINAL=$(sha_str "$KEY_FINAL")

	IMAGE_HASH=$(sha_str "format=$FORMAT
template=$TEMPLATE
kernel=$H_KERNEL
initramfs=$H_INITRAMFS
rootfs-base=$H_BASE
final=$H_FINAL")
else
	H_BASE=none
	KEY_FINAL="final-image
rootfs=$ROOTFS_KEY
forkd=$FORKD_SUMS
headroom=$HEADROOM_MIB/$ROUND_MIB
code=$(declare -f stage_final_image install_forkd_dir make_ext4)"
	H_FINAL=$(sha_str "$KEY_FINAL")

	IMAGE_HASH=$(sha_str "format=$FORMAT
source=rootfs
rootfs=$ROOTFS_KEY
kernel=$H_KERNEL
initramfs=$H_INITRAMFS
final=$H_FINAL")
fi
IMAGE_DIR="$CACHE/images/$IMAGE_HASH"

if [ "$BASE_ONLY" = 1 ]; then
	KEY=$KEY_BASE run_stage rootfs-base "$H_BASE" stage_rootfs_base
	echo "$STAGE_DIR" >&3
	exit 0
fi

if [ -f "$IMAGE_DIR/manifest.json" ] && [ -f "$IMAGE_DIR/provenance" ] &&
	grep -qx "image_hash=$IMAGE_HASH" "$IMAGE_DIR/provenance"; then
	for s in "${STEPS[@]:1}"; do step_start "$s"; step_done cached; done
	touch -c "$IMAGE_DIR" # its last use, under the lock (see src/cache/: a collection keeps it)
	echo "$IMAGE_DIR" >&3
	exit 0
fi
if [ -e "$IMAGE_DIR" ]; then
	mkdir -p "$CACHE/untrusted"
	info "$IMAGE_DIR has no provenance record of this builder: moved to $CACHE/untrusted/, building the image"
	mv -T "$IMAGE_DIR" "$CACHE/untrusted/$IMAGE_HASH-$(date -u +%Y%m%dT%H%M%SZ)-$$" ||
		die "cannot move the untrusted $IMAGE_DIR aside"
fi

# ---------------------------------------------------------------------------------------
KEY=$KEY_KERNEL run_stage kernel "$H_KERNEL" stage_kernel
KERNEL_DIR=$STAGE_DIR
KERNEL_VERSION=$(cat "$KERNEL_DIR/kernel_version")

KEY=$KEY_INITRAMFS run_stage initramfs "$H_INITRAMFS" stage_initramfs
INITRAMFS_DIR=$STAGE_DIR

if [ -z "$ROOTFS_DIR" ]; then
	KEY=$KEY_BASE run_stage rootfs-base "$H_BASE" stage_rootfs_base
	BASE_DIR=$STAGE_DIR
	KEY=$KEY_FINAL run_stage final "$H_FINAL" stage_final
else
	KEY=$KEY_FINAL run_stage final-image "$H_FINAL" stage_final_image
fi
FINAL_DIR=$STAGE_DIR

# ---------------------------------------------------------------------------------------
# Step 6: assemble the image directory (hard links into the stages; read-only files).
step_start image
new_tmp
TMP_IMG=$NEW_TMP
link_or_copy() { ln "$1" "$2" 2>/dev/null || cp --sparse=always "$1" "$2"; }
link_or_copy "$KERNEL_DIR/vmlinuz" "$TMP_IMG/vmlinuz"
link_or_copy "$INITRAMFS_DIR/initrd.img" "$TMP_IMG/initrd.img"
link_or_copy "$FINAL_DIR/rootfs.ext4" "$TMP_IMG/rootfs.ext4"
chmod 0444 "$TMP_IMG/vmlinuz" "$TMP_IMG/initrd.img" "$TMP_IMG/rootfs.ext4"

json_file() { # name sha256file path
	printf '    "%s": {"sha256": "%s", "size": %s}' "$1" "$(cat "$2")" "$(fsize "$3")"
}
json_list() { # words -> JSON array of strings
	local first=1 w
	printf '['
	for w in "$@"; do
		[ $first = 1 ] || printf ', '
		first=0
		printf '"%s"' "$w"
	done
	printf ']'
}
json_opt() { [ "$1" = none ] && printf 'null' || printf '"%s"' "$1"; }
MODNAMES=$(sed 's#.*/##; s#\.ko$##' "$KERNEL_DIR/modules.order" | tr '\n' ' ')
# shellcheck disable=SC2086
{
	printf '{\n'
	printf '  "format": %s,\n' "$FORMAT"
	printf '  "template": "%s",\n' "$TEMPLATE"
	printf '  "kernel_version": "%s",\n' "$KERNEL_VERSION"
	printf '  "kernel_package": "%s",\n' "$KPKG=$KVER"
	printf '  "image_hash": "%s",\n' "$IMAGE_HASH"
	printf '  "created": "%s",\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
	printf '  "files": {\n'
	json_file vmlinuz "$KERNEL_DIR/vmlinuz.sha256" "$TMP_IMG/vmlinuz"; printf ',\n'
	json_file initrd.img "$INITRAMFS_DIR/initrd.img.sha256" "$TMP_IMG/initrd.img"; printf ',\n'
	json_file rootfs.ext4 "$FINAL_DIR/rootfs.ext4.sha256" "$TMP_IMG/rootfs.ext4"; printf '\n'
	printf '  },\n'
	printf '  "rootfs_size_mib": %s,\n' "$(cat "$FINAL_DIR/size_mib")"
	printf '  "rootfs_used_mib": %s,\n' "$(cat "$FINAL_DIR/used_mib")"
	printf '  "initrd_compression": "%s",\n' "$(cat "$INITRAMFS_DIR/compression")"
	printf '  "initrd_modules": %s,\n' "$(json_list $MODNAMES)"
	if [ -z "$ROOTFS_DIR" ]; then printf '  "suite": "%s",\n' "$SUITE"; fi
	printf '  "packages": %s,\n' "$(json_list ${PKGS_CSV//,/ })"
	printf '  "agent_sha256": %s,\n' "$(json_opt "$AGENT_SHA")"
	printf '  "evalsrv_sha256": %s,\n' "$(json_opt "$EVALSRV_SHA")"
	if [ -n "$ROOTFS_DIR" ]; then printf '  "rootfs_key": "%s",\n' "$ROOTFS_KEY"; fi
	printf '  "stages": {"kernel": "%s", "initramfs": "%s", "rootfs-base": "%s", "final": "%s"}\n' \
		"$H_KERNEL" "$H_INITRAMFS" "$H_BASE" "$H_FINAL"
	printf '}\n'
} >"$TMP_IMG/manifest.json"
chmod 0444 "$TMP_IMG/manifest.json"
# The builder's mark: only an image directory with this record is ever trusted by a lookup.
printf 'built-by=guest/image/build.sh\nimage_hash=%s\nstages=kernel-%s initramfs-%s rootfs-base-%s %s-%s\n' \
	"$IMAGE_HASH" "$H_KERNEL" "$H_INITRAMFS" "$H_BASE" "$(basename "$FINAL_DIR" | sed 's/-[0-9a-f]*$//')" "$H_FINAL" >"$TMP_IMG/provenance"
chmod 0444 "$TMP_IMG/provenance"
commit_dir "$TMP_IMG" "$IMAGE_DIR"
step_done

echo "$IMAGE_DIR" >&3
