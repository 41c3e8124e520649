/* PID 1 duties: mount the basic file systems, hostname, loopback, the network interface. */
#define _GNU_SOURCE
#include <errno.h>
#include <net/if.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"

static const struct {
	const char *src, *dst, *type;
	unsigned long flags;
	const char *opts;
} mounts[] = {
	{ "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL },
	{ "sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL },
	{ "devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755" },
	{ "devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "gid=5,mode=0620,ptmxmode=0666" },
	{ "tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777" },
	{ "tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777" },
	{ "tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755" },
};

void lo_up(void)
{
	struct ifreq ifr;
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (s < 0) {
		logmsg("socket: %s", strerror(errno));
		return;
	}
	memset(&ifr, 0, sizeof ifr);
	strcpy(ifr.ifr_name, "lo");
	if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0) {
		logmsg("lo: SIOCGIFFLAGS: %s", strerror(errno));
	} else {
		ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
		if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
			logmsg("lo: SIOCSIFFLAGS: %s", strerror(errno));
	}
	close(s);
}

void init_system(void)
{
	for (size_t i = 0; i < sizeof mounts / sizeof *mounts; i++) {
		mkdir(mounts[i].dst, 0755);
		if (mount(mounts[i].src, mounts[i].dst, mounts[i].type, mounts[i].flags,
			  mounts[i].opts) < 0 && errno != EBUSY)
			logmsg("mount %s: %s", mounts[i].dst, strerror(errno));
	}
	/* /dev/fd and friends: bash process substitution and many tools expect them */
	static const char *const links[][2] = {
		{ "/proc/self/fd", "/dev/fd" }, { "/proc/self/fd/0", "/dev/stdin" },
		{ "/proc/self/fd/1", "/dev/stdout" }, { "/proc/self/fd/2", "/dev/stderr" },
	};
	for (size_t i = 0; i < sizeof links / sizeof *links; i++)
		if (symlink(links[i][0], links[i][1]) < 0 && errno != EEXIST)
			logmsg("symlink %s: %s", links[i][1], strerror(errno));
	if (sethostname("forkd", 5) < 0)
		logmsg("sethostname: %s", strerror(errno));
	lo_up();
	limits_init();
	net_setup();
}
