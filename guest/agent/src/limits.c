/*
 * Guest-side limits of the workload: every process the agent starts (commands, the eval
 * server, and all they start) runs in the cgroup v2 group /sys/fs/cgroup/work, whose pids.max
 * the host sets at fork (IDENTITY's PIDS_MAX). A fork bomb then fails with EAGAIN inside that
 * group while the agent, outside it, keeps answering and can kill it. The group also has the cpu
 * controller: against the agent it weighs as one task, however many processes it has. The host's own limits
 * (the VMM's cgroup) bound what the guest as a whole can take; this keeps the sandbox usable.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"

#define CG "/sys/fs/cgroup"
#define WORK CG "/work"
/* The default until the host says otherwise: far above real use, far below what exhausts a
 * small guest's kernel memory. */
#define DEFAULT_PIDS "1024"

static int ready;

static int put(const char *path, const char *value)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = write(fd, value, strlen(value));
	int e = errno;
	close(fd);
	errno = e;
	return n == (ssize_t)strlen(value) ? 0 : -1;
}

void limits_init(void)
{
	mkdir(CG, 0755);
	/* favordynmods: every command moves into WORK as it starts; without it each move waits for an
	 * RCU grace period (~4 ms under TCG, ~2 ms with it, measured in a guest). */
	if (mount("cgroup2", CG, "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, "favordynmods") < 0 &&
	    mount("cgroup2", CG, "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0 && errno != EBUSY) {
		logmsg("mount cgroup2: %s (no workload limits)", strerror(errno));
		return;
	}
	if (put(CG "/cgroup.subtree_control", "+pids") < 0) {
		logmsg("enable pids controller: %s (no workload limits)", strerror(errno));
		return;
	}
	/* The whole workload then competes for CPU as one group with the agent (which stays in the
	 * root group): a thousand busy processes get what one would, and the agent that enforces
	 * their timeouts is not starved. */
	if (put(CG "/cgroup.subtree_control", "+cpu") < 0)
		logmsg("enable cpu controller: %s (the workload can starve the agent)", strerror(errno));
	if ((mkdir(WORK, 0755) < 0 && errno != EEXIST) || put(WORK "/pids.max", DEFAULT_PIDS) < 0) {
		logmsg("%s: %s (no workload limits)", WORK, strerror(errno));
		return;
	}
	ready = 1;
}

/* In a child the agent just forked, before exec: join the workload group. */
void limits_join(void)
{
	if (ready)
		put(WORK "/cgroup.procs", "0");
}

int limits_set_pids(int64_t max)
{
	if (!ready) {
		errno = ENOTSUP;
		return -1;
	}
	char buf[32];
	if (max <= 0)
		snprintf(buf, sizeof buf, "max");
	else
		snprintf(buf, sizeof buf, "%lld", (long long)max);
	return put(WORK "/pids.max", buf);
}
