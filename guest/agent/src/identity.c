/* IDENTITY: make a freshly forked VM distinct from its siblings. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/random.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"

#define ID_DIR "/run/forkd"
#define ID_FILE ID_DIR "/sandbox-id"

/* Mix the host's seed into the kernel pool and force a CRNG reseed, so forks that share
 * the snapshot's pool state diverge. */
static int add_entropy(const uint8_t *seed, uint32_t len, const char **step)
{
	union {
		struct rand_pool_info info;
		uint8_t raw[sizeof(struct rand_pool_info) + 512];
	} u;
	int fd = open("/dev/urandom", O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		*step = "open /dev/urandom";
		return -1;
	}
	u.info.entropy_count = (int)len * 8;
	u.info.buf_size = (int)len;
	memcpy(u.info.buf, seed, len);
	int r = ioctl(fd, RNDADDENTROPY, &u.info);
	*step = "RNDADDENTROPY";
	if (r == 0) {
		r = ioctl(fd, RNDRESEEDCRNG);
		*step = "RNDRESEEDCRNG";
	}
	int e = errno;
	close(fd);
	errno = e;
	return r;
}

/* Write the sandbox id atomically (temp file + rename). */
static int write_id(const uint8_t *id, uint32_t len)
{
	if (mkdir_p(ID_DIR, 0755) < 0)
		return -1;
	int fd = open(ID_FILE ".tmp", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -1;
	ssize_t n = write(fd, id, len);
	int e = errno;
	close(fd);
	if (n != (ssize_t)len) {
		errno = n < 0 ? e : EIO;
		return -1;
	}
	return rename(ID_FILE ".tmp", ID_FILE);
}

void identity(const struct msg *m)
{
	const uint8_t *seed, *host, *id;
	uint32_t slen, hlen, ilen;
	int64_t tns;
	int err = 0;
	const char *step = NULL;

	if (!field_get(m, F_SEED, &seed, &slen) || slen < 32 || slen > 512) {
		send_error(m->stream, EINVAL, "IDENTITY needs a SEED of 32-512 bytes");
		return;
	}
	int has_time = field_i64(m, F_TIME_NS, 0, &tns);
	if (has_time < 0) {
		send_error(m->stream, EINVAL, "TIME_NS must be an i64");
		return;
	}
	int64_t net_up = 0; /* ms to wait for eth0's carrier (0: do not) */
	if (field_i64(m, F_NET_UP, 0, &net_up) < 0) {
		send_error(m->stream, EINVAL, "NET_UP must be an i64");
		return;
	}
	/* every step is attempted; the first failure is reported */
	if (add_entropy(seed, slen, &step) < 0)
		err = errno;
	if (has_time) {
		struct timespec ts = { .tv_sec = tns / 1000000000, .tv_nsec = tns % 1000000000 };
		if (clock_settime(CLOCK_REALTIME, &ts) < 0 && !err) {
			err = errno;
			step = "clock_settime";
		}
	}
	if (field_get(m, F_HOSTNAME, &host, &hlen) && sethostname((const char *)host, hlen) < 0 && !err) {
		err = errno;
		step = "sethostname";
	}
	/* The host set the NIC's link up: the reply means the network is usable. */
	if (net_up > 0 && net_wait_up(net_up > 5000 ? 5000 : net_up) < 0 && !err) {
		err = errno;
		step = "waiting for eth0 carrier";
	}
	if (err)
		send_error(m->stream, err, "%s: %s", step, strerror(err));
	else
		send_simple(RP_OK, m->stream);
	port_flush();
	/* After the reply, off the fork's critical path (under TCG the first file creation in a
	 * child costs ~50 ms of code translation): the agent handles nothing else until this is
	 * done, so no later request can miss the file; a failure is logged. */
	if (field_get(m, F_SANDBOX_ID, &id, &ilen) && write_id(id, ilen) < 0)
		logmsg("identity: write %s: %s", ID_FILE, strerror(errno));
	int64_t pids;
	if (field_i64(m, F_PIDS_MAX, 0, &pids) > 0 && limits_set_pids(pids) < 0)
		logmsg("identity: pids.max %lld: %s", (long long)pids, strerror(errno));
	/* The interpreter reseeds before its next cell (cells run in FIFO order), so no cell can see
	 * the shared pre-fork state; waking it here would cost every child CPU on the fork path. */
	eval_reseed_later();
}
