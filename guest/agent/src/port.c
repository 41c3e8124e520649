/*
 * The host port: discovery, frame reader, writer, and disconnect handling.
 *
 * virtio-serial quirk: while the host end is disconnected, poll() reports POLLHUP at once
 * and read() returns 0. We then leave the port out of the poll set for a backoff period
 * (1 ms doubling to 50 ms) and look again, so the loop keeps serving children without
 * spinning. While disconnected, output frames are discarded and partial input is dropped.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "agent.h"

#define BACKOFF_MAX 50
#define STAGE_SIZE (64 * 1024)

static const char *path; /* --port, or NULL for virtio discovery */
static int fd = -1;
static int is_socket;    /* --port names a unix socket: reconnect after HUP */
static int backoff;      /* ms; 0 while connected */
static int64_t retry_at;
static int logged_missing;

/* Reader state machine. */
static struct {
	uint8_t hdr[9];   /* length, type, stream */
	size_t hgot;
	uint32_t len;     /* bytes after the length word */
	uint8_t *body;    /* payload being assembled */
	size_t bcap, bgot;
	uint64_t skip;    /* bytes of an oversized/short frame still to discard */
	uint8_t *stage;   /* read staging buffer, allocated on first read */
} rd;

static void reader_reset(void)
{
	rd.hgot = rd.bgot = 0;
	rd.skip = 0;
	if (rd.bcap > CHUNK) { /* do not keep a 1 MiB buffer dirty */
		free(rd.body);
		rd.body = NULL;
		rd.bcap = 0;
	}
}

static uint32_t be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Find the virtio port named forkd.agent and open it. */
static int open_virtio(void)
{
	DIR *d = opendir("/sys/class/virtio-ports");
	if (!d)
		return -1;
	struct dirent *de;
	int out = -1;
	while (out < 0 && (de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		char p[512], name[64] = "";
		snprintf(p, sizeof p, "/sys/class/virtio-ports/%s/name", de->d_name);
		int nfd = open(p, O_RDONLY | O_CLOEXEC);
		if (nfd < 0)
			continue;
		ssize_t n = read(nfd, name, sizeof name - 1);
		close(nfd);
		if (n <= 0)
			continue;
		name[n] = 0;
		name[strcspn(name, "\n")] = 0;
		if (strcmp(name, "forkd.agent"))
			continue;
		snprintf(p, sizeof p, "/dev/%s", de->d_name);
		out = open(p, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
		if (out < 0)
			logmsg("open %s: %s", p, strerror(errno));
	}
	closedir(d);
	return out;
}

static int open_path(void)
{
	struct stat st;
	if (stat(path, &st) < 0)
		return -1;
	if (!S_ISSOCK(st.st_mode))
		return open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof sa.sun_path) {
		errno = ENAMETOOLONG;
		return -1;
	}
	strcpy(sa.sun_path, path);
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -1;
	if (connect(s, (struct sockaddr *)&sa, sizeof sa) < 0 ||
	    fcntl(s, F_SETFL, O_NONBLOCK) < 0) {
		close(s);
		return -1;
	}
	is_socket = 1;
	return s;
}

void port_setup(const char *p, int f)
{
	path = p;
	if (f >= 0) {
		fd = f;
		fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
		fcntl(fd, F_SETFD, FD_CLOEXEC);
	}
}

static void disconnected(void)
{
	if (g_connected || !backoff)
		backoff = 1;
	else if ((backoff *= 2) > BACKOFF_MAX)
		backoff = BACKOFF_MAX;
	g_connected = 0;
	retry_at = now_ms() + backoff;
	reader_reset();
	outq_clear();
	flow_disconnected();
	if (is_socket) {
		close(fd);
		fd = -1;
	}
}

/* Feed bytes to the frame state machine. Complete frames are dispatched. */
static void consume(const uint8_t *p, size_t n)
{
	while (n) {
		if (rd.skip) {
			size_t k = rd.skip < n ? (size_t)rd.skip : n;
			rd.skip -= k; p += k; n -= k;
			continue;
		}
		if (rd.hgot < 9) {
			size_t need = (rd.hgot < 4 ? 4 : 9) - rd.hgot;
			size_t k = need < n ? need : n;
			memcpy(rd.hdr + rd.hgot, p, k);
			rd.hgot += k; p += k; n -= k;
			if (rd.hgot == 4) {
				rd.len = be32(rd.hdr);
				if (rd.len < 5) { /* cannot even name a stream: drop it */
					rd.skip = rd.len;
					rd.hgot = 0;
				}
			} else if (rd.hgot == 9 && rd.len > MAX_FRAME) {
				rd.skip = rd.len - 5;
				rd.hgot = 0;
				send_error(be32(rd.hdr + 5), E2BIG, "frame of %u bytes exceeds %d",
					   rd.len, MAX_FRAME);
			} else if (rd.hgot == 9) {
				rd.bgot = 0;
			}
			if (rd.hgot < 9)
				continue;
		}
		struct msg m = { .type = rd.hdr[4], .stream = be32(rd.hdr + 5) };
		size_t plen = rd.len - 5;
		if (rd.bgot == 0 && n >= plen) { /* whole payload in the staging buffer */
			m.p = p;
			m.n = plen;
			p += plen; n -= plen;
		} else {
			if (rd.bcap < plen) {
				uint8_t *b = realloc(rd.body, plen);
				if (!b) { /* cannot hold it: skip it like an oversized frame */
					send_error(m.stream, ENOMEM, "no memory for frame");
					rd.skip = plen;
					rd.hgot = 0;
					continue;
				}
				rd.body = b;
				rd.bcap = plen;
			}
			size_t k = plen - rd.bgot < n ? plen - rd.bgot : n;
			memcpy(rd.body + rd.bgot, p, k);
			rd.bgot += k; p += k; n -= k;
			if (rd.bgot < plen)
				continue;
			m.p = rd.body;
			m.n = plen;
		}
		rd.hgot = 0;
		rd.bgot = 0;
		dispatch(&m);
		if (rd.bcap > CHUNK && m.p == rd.body)
			reader_reset();
	}
}

static void on_port(void *ctx, int pfd, short rev)
{
	(void)ctx;
	if (pfd != fd)
		return;
	if (rev & POLLNVAL) {
		logmsg("port fd %d invalid", fd);
		fd = -1;
		disconnected();
		return;
	}
	if (rev & (POLLHUP | POLLERR)) {
		if (g_connected)
			logmsg("port: host disconnected (revents 0x%x)", rev);
		disconnected();
		return;
	}
	g_connected = 1;
	backoff = 0;
	if (rev & POLLIN) {
		if (!rd.stage && !(rd.stage = malloc(STAGE_SIZE)))
			return;
		/* bounded per wakeup so other streams get their turn */
		for (int i = 0; i < 16 && port_can_read(); i++) {
			ssize_t n = read(fd, rd.stage, STAGE_SIZE);
			if (n > 0) {
				consume(rd.stage, (size_t)n);
				continue;
			}
			if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
				disconnected();
				return;
			}
			if (errno == EAGAIN)
				break;
		}
	}
	if ((rev & POLLOUT) && outq_flush(fd) < 0)
		disconnected();
}

/* Write queued output now (replies on the fork path should not wait for the next loop turn,
 * by which time another process may hold the vCPU). */
void port_flush(void)
{
	if (g_connected && fd >= 0 && outq_len())
		outq_flush(fd);
}

void port_poll(int64_t now)
{
	if (!g_connected && backoff && now < retry_at) {
		want_timeout(retry_at);
		return;
	}
	if (fd < 0) {
		fd = path ? open_path() : open_virtio();
		if (fd < 0) {
			if (!logged_missing++)
				logmsg("waiting for port %s", path ? path : "forkd.agent");
			disconnected();
			want_timeout(retry_at);
			return;
		}
		logmsg("port open");
	}
	if (g_connected && outq_len())
		outq_flush(fd); /* opportunistic write; errors show up as POLLERR/POLLHUP */
	short ev = (port_can_read() ? POLLIN : 0) | (outq_len() ? POLLOUT : 0);
	poll_add(fd, ev, on_port, NULL);
}
