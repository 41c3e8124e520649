/*
 * EVAL bridge to the warm Python interpreter (guest/evalsrv/forkd_eval.py).
 *
 * Requests run one at a time in arrival order. Pipe protocol, both directions:
 * u32 BE length (of what follows), u32 BE id, then UTF-8 code or JSON. Id 0 with empty
 * code asks the interpreter to reseed its random generators; it is sent at startup as a
 * handshake (EVAL_READY turns 1 when answered) and on IDENTITY.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent.h"

#define RESEED_TIMEOUT_MS 30000
#define KILL_GRACE_MS 2000
#define REPLY_MAX (MAX_FRAME - 256) /* the JSON must fit in one reply frame */

struct ereq {
	struct stream s;  /* s.id 0: internal handshake, not in the stream table */
	int reseed;       /* id 0 + empty code; replies OK without JSON */
	uint8_t *code;
	uint32_t len;
	int64_t timeout;  /* ms, 0: none */
	struct ereq *next;
};

static struct {
	pid_t pid;                 /* 0: not running */
	int in_fd, out_fd;         /* interpreter's stdin (we write), stdout (we read) */
	int ready;                 /* answered a request since it started */
	struct ereq *head, *tail;  /* waiting requests */
	struct ereq *active;       /* sent, awaiting the reply */
	uint32_t next_id;
	uint8_t *wbuf;             /* request being written */
	size_t wlen, woff;
	uint8_t hdr[8];            /* reply being read */
	size_t hgot;
	uint32_t rlen;
	uint8_t *rbuf;
	size_t rgot;
	int64_t deadline, kill_at; /* timeout, then SIGKILL after SIGINT */
	int interrupted;
} sv = { .in_fd = -1, .out_fd = -1 };

static void put32(uint8_t *p, uint32_t v)
{
	p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

static void req_free(struct ereq *r)
{
	if (r->s.id)
		stream_del(&r->s);
	free(r->code);
	free(r);
}

/* Answer a request that got no JSON: reseeds succeed anyway (a new interpreter seeds
 * itself from the kernel), cells fail. */
static void req_fail(struct ereq *r, int err, const char *msg)
{
	if (r->s.id && r->reseed)
		send_simple(RP_OK, r->s.id);
	else if (r->s.id)
		send_error(r->s.id, err, "%s", msg);
	req_free(r);
}

static void enqueue(struct ereq *r, int front)
{
	if (front) {
		r->next = sv.head;
		sv.head = r;
		if (!sv.tail)
			sv.tail = r;
	} else {
		r->next = NULL;
		if (sv.tail)
			sv.tail->next = r;
		else
			sv.head = r;
		sv.tail = r;
	}
}

static struct ereq *new_reseed(uint32_t stream)
{
	struct ereq *r = calloc(1, sizeof *r);
	if (r)
		*r = (struct ereq){ .s = { .id = stream, .kind = K_EVAL }, .reseed = 1,
				    .timeout = RESEED_TIMEOUT_MS };
	return r;
}

static void fail_queue(int err, const char *msg)
{
	while (sv.head) {
		struct ereq *r = sv.head;
		sv.head = r->next;
		req_fail(r, err, msg);
	}
	sv.tail = NULL;
}

static void server_stop(void)
{
	if (sv.pid > 0)
		killpg(sv.pid, SIGKILL); /* the reaper discards it; pid is forgotten below */
	if (sv.in_fd >= 0)
		close(sv.in_fd);
	if (sv.out_fd >= 0)
		close(sv.out_fd);
	free(sv.wbuf);
	free(sv.rbuf);
	sv.pid = 0;
	sv.in_fd = sv.out_fd = -1;
	sv.ready = 0;
	sv.wbuf = sv.rbuf = NULL;
	sv.hgot = sv.rgot = 0;
	sv.interrupted = 0;
}

/* Start the interpreter and queue the handshake in front of waiting requests. */
static int server_start(void)
{
	int to[2], from[2];
	if (pipe2(to, O_CLOEXEC) < 0)
		return -1;
	if (pipe2(from, O_CLOEXEC) < 0) {
		int e = errno;
		close(to[0]);
		close(to[1]);
		errno = e;
		return -1;
	}
	fcntl(to[1], F_SETFL, O_NONBLOCK);
	fcntl(from[0], F_SETFL, O_NONBLOCK);
	char *argv[] = { (char *)g_python, "-u", (char *)g_evalsrv, NULL };
	char **env = default_env();
	int fds[3] = { to[0], from[1], 2 };
	struct ereq *hs = new_reseed(0);
	pid_t pid = -1;
	if (env && hs)
		pid = spawn(argv, env, access("/root", X_OK) == 0 ? "/root" : "/", fds);
	else
		errno = ENOMEM;
	int e = errno;
	free_strv(env);
	close(to[0]);
	close(from[1]);
	if (pid < 0) {
		close(to[1]);
		close(from[0]);
		free(hs);
		logmsg("cannot start eval server %s: %s", g_evalsrv, strerror(e));
		errno = e;
		return -1;
	}
	sv.pid = pid;
	sv.in_fd = to[1];
	sv.out_fd = from[0];
	enqueue(hs, 1);
	return 0;
}

/* The interpreter is gone or misbehaved: answer the active request, kill it. */
static void server_died(const char *why)
{
	struct ereq *r = sv.active;
	sv.active = NULL;
	logmsg("eval server: %s", why);
	if (r && !r->s.id) {
		/* the handshake failed: it cannot start, so fail everything waiting */
		req_free(r);
		fail_queue(EPIPE, "eval server failed to start");
	} else if (r) {
		req_fail(r, sv.interrupted ? ETIMEDOUT : EPIPE, why);
	}
	server_stop();
}

static void handle_reply(uint32_t id, const uint8_t *json, size_t len)
{
	struct ereq *r = sv.active;
	if (!r || id != (r->reseed ? 0 : sv.next_id)) {
		server_died("reply id mismatch");
		return;
	}
	sv.active = NULL;
	sv.ready = 1;
	if (r->s.id && r->reseed) {
		send_simple(RP_OK, r->s.id);
	} else if (r->s.id && sv.interrupted) {
		fb_begin(RP_ERROR, r->s.id);
		fb_i64(F_ERRNO, ETIMEDOUT);
		const char *msg = "eval timed out; interrupted, interpreter state kept";
		fb_bytes(F_MESSAGE, msg, strlen(msg));
		fb_bytes(F_JSON, json, len);
		fb_end();
	} else if (r->s.id) {
		fb_begin(RP_OK, r->s.id);
		fb_bytes(F_JSON, json, len);
		fb_end();
	}
	sv.interrupted = 0;
	req_free(r);
}

static void on_server_out(void *ctx, int fd, short rev)
{
	(void)ctx; (void)rev;
	for (int i = 0; i < 64 && fd == sv.out_fd; i++) {
		ssize_t n;
		if (sv.hgot < 8) {
			n = read(fd, sv.hdr + sv.hgot, 8 - sv.hgot);
		} else {
			n = read(fd, sv.rbuf + sv.rgot, sv.rlen - sv.rgot);
		}
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		if (n <= 0) {
			server_died(n ? strerror(errno) : "exited");
			return;
		}
		if (sv.hgot < 8) {
			sv.hgot += (size_t)n;
			if (sv.hgot < 8)
				continue;
			uint32_t len = (uint32_t)sv.hdr[0] << 24 | sv.hdr[1] << 16 | sv.hdr[2] << 8 | sv.hdr[3];
			if (len < 4 || len - 4 > REPLY_MAX) {
				server_died("bad reply length");
				return;
			}
			sv.rlen = len - 4;
			sv.rgot = 0;
			if (!(sv.rbuf = malloc(sv.rlen ? sv.rlen : 1))) {
				server_died("out of memory");
				return;
			}
		} else {
			sv.rgot += (size_t)n;
		}
		if (sv.rgot == sv.rlen) {
			uint32_t id = (uint32_t)sv.hdr[4] << 24 | sv.hdr[5] << 16 | sv.hdr[6] << 8 | sv.hdr[7];
			uint8_t *b = sv.rbuf;
			sv.rbuf = NULL;
			sv.hgot = 0;
			handle_reply(id, b, sv.rlen);
			free(b);
			return;
		}
	}
}

static void on_server_in(void *ctx, int fd, short rev)
{
	(void)ctx; (void)rev;
	while (fd == sv.in_fd && sv.woff < sv.wlen) {
		ssize_t n = write(fd, sv.wbuf + sv.woff, sv.wlen - sv.woff);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return;
		if (n < 0) {
			server_died(strerror(errno));
			return;
		}
		sv.woff += (size_t)n;
	}
	if (fd == sv.in_fd) {
		free(sv.wbuf);
		sv.wbuf = NULL;
		sv.wlen = sv.woff = 0;
	}
}

/* Send the next waiting request. */
static void activate(int64_t now)
{
	struct ereq *r = sv.head;
	if (!(sv.wbuf = malloc(8 + (size_t)r->len))) {
		logmsg("eval: out of memory");
		return; /* retried on the next iteration */
	}
	sv.head = r->next;
	if (!sv.head)
		sv.tail = NULL;
	if (!r->reseed && ++sv.next_id == 0)
		sv.next_id = 1;
	put32(sv.wbuf, 4 + r->len);
	put32(sv.wbuf + 4, r->reseed ? 0 : sv.next_id);
	if (r->len)
		memcpy(sv.wbuf + 8, r->code, r->len);
	sv.wlen = 8 + r->len;
	sv.woff = 0;
	sv.active = r;
	sv.interrupted = 0;
	sv.deadline = r->timeout > 0 ? now + r->timeout : 0;
	on_server_in(NULL, sv.in_fd, 0);
}

void eval_poll(int64_t now)
{
	if (!sv.pid && sv.head && server_start() < 0) {
		int e = errno;
		fail_queue(e, strerror(e));
	}
	if (!sv.pid)
		return;
	if (!sv.active && sv.head)
		activate(now);
	if (sv.active && sv.deadline) {
		if (!sv.interrupted && now >= sv.deadline) {
			kill(sv.pid, SIGINT); /* KeyboardInterrupt: globals survive */
			sv.interrupted = 1;
			sv.kill_at = now + KILL_GRACE_MS;
		}
		if (sv.interrupted && now >= sv.kill_at) {
			server_died("timed out; killed, restarting");
			if (server_start() < 0)
				fail_queue(errno, strerror(errno));
			return;
		}
		want_timeout(sv.interrupted ? sv.kill_at : sv.deadline);
	}
	if (sv.wbuf)
		poll_add(sv.in_fd, POLLOUT, on_server_in, NULL);
	poll_add(sv.out_fd, POLLIN, on_server_out, NULL);
}

int eval_reaped(pid_t pid, int status)
{
	(void)status;
	if (!sv.pid || pid != sv.pid)
		return 0;
	server_died("exited");
	return 1;
}

/* Set by IDENTITY: waking the interpreter on the fork path would cost every child a burst of
 * CPU (under TCG, translating the interpreter's code anew), so the reseed waits for the first
 * cell, which it precedes. */
static int reseed_pending;

void eval_request(const struct msg *m)
{
	const uint8_t *code;
	uint32_t len;
	int64_t timeout;
	if (field_i64(m, F_TIMEOUT_MS, 0, &timeout) < 0) {
		send_error(m->stream, EINVAL, "TIMEOUT_MS must be an i64");
		return;
	}
	if (!field_get(m, F_CODE, &code, &len)) {
		send_error(m->stream, EINVAL, "missing CODE");
		return;
	}
	struct ereq *r = calloc(1, sizeof *r);
	if (!r || !(r->code = malloc(len ? len : 1))) {
		free(r);
		send_error(m->stream, ENOMEM, "out of memory");
		return;
	}
	r->s = (struct stream){ .id = m->stream, .kind = K_EVAL };
	memcpy(r->code, code, len);
	r->len = len;
	r->timeout = timeout > 0 && timeout < INT32_MAX * 1000LL ? timeout : 0;
	if (stream_add(&r->s) < 0) {
		free(r->code);
		free(r);
		return;
	}
	if (reseed_pending) { /* after a fork: the interpreter reseeds before its first cell */
		reseed_pending = 0;
		eval_reseed(0);
	}
	enqueue(r, 0);
}

void eval_reseed_later(void)
{
	reseed_pending = 1;
}

int eval_reseed(uint32_t stream)
{
	if (!sv.pid)
		return 1;
	struct ereq *r = new_reseed(stream);
	if (!r)
		return 1;
	if (stream && stream_add(&r->s) < 0) {
		free(r);
		return 0; /* EBUSY sent */
	}
	enqueue(r, 0);
	return 0;
}

int eval_ready(void)
{
	return sv.pid && sv.ready;
}

void eval_init(void)
{
	server_start();
}
