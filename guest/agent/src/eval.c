/*
 * EVAL bridge to the warm kernels, one per language: python (guest/evalsrv/forkd_eval.py run by
 * python3) and javascript (guest/evalsrv/forkd_eval.js run by node). A kernel exists when its
 * interpreter is found (python3 on the image's PATH, then /usr/bin/python3; node, then nodejs,
 * on PATH) and its source file exists; each is started at boot and runs as the image's default
 * user with the default env and cwd. EVAL's LANGUAGE picks one (absent: python).
 *
 * Requests of a kernel run one at a time in arrival order. Pipe protocol, both directions:
 * u32 BE length (of what follows), u32 BE id, then UTF-8 code or JSON. Id 0 with empty
 * code asks the interpreter to reseed its random generators; it is sent at startup as a
 * handshake (EVAL_READY turns 1 when answered) and on IDENTITY.
 *
 * EVAL_OPTS (one line of JSON: the cell's context, env, streaming, or a context operation) is
 * passed to the kernel before the code: NUL, the line, a newline, the code. A kernel's frame
 * whose body starts with byte 0x01 is output of the running cell ("o" stdout or "e" stderr, then
 * the bytes), forwarded as EVAL_STDOUT/EVAL_STDERR {DATA}; the kernel's reply ends the request.
 * The kernel's pipe is not read while the output queue is full, so a cell printing faster than
 * the host takes it blocks on its pipe.
 *
 * A kernel that fails to start (it cannot be spawned, e.g. the default user is not in the
 * image's /etc/passwd, or it exits or misbehaves before answering the handshake) is settled:
 * it no longer holds EVAL_READY back and is left out of KERNELS until a start of it works. An
 * EVAL of it starts it again and, when that fails too, gets an ERROR saying why.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>
#include <unistd.h>

#include "agent.h"

#define RESEED_TIMEOUT_MS 30000
#define KILL_GRACE_MS 2000
#define SIGINT_AGAIN_MS 250 /* a SIGINT the kernel took before its cell started is sent again */
#define REPLY_MAX (MAX_FRAME - 256) /* the JSON must fit in one reply frame */
#define OPTS_MAX (256 * 1024)       /* EVAL_OPTS bytes (per-cell env included) */

struct ereq {
	struct stream s;  /* s.id 0: internal handshake, not in the stream table */
	int reseed;       /* id 0 + empty code; replies OK without JSON */
	uint8_t *code;
	uint32_t len;
	int64_t timeout;  /* ms, 0: none */
	struct ereq *next;
};

struct kernel {
	const char *lang;          /* LANGUAGE value */
	const char *const *names;  /* interpreter names searched on PATH */
	const char *fallback;      /* then this path (or NULL) */
	const char *const *flags;  /* interpreter arguments before the source */
	const char **interp_opt;   /* --python / --node: exact interpreter, no search */
	const char **src_opt;      /* --evalsrv / --evaljs */
	const char *legacy_src;    /* source tried when the default one is missing (old images) */
	char interp[PATH_MAX];     /* found interpreter, "" if none */
	char src[PATH_MAX];        /* source, "" if missing */
	int exists;                /* interpreter and source found */
	int failed;                /* its last start failed (k->err says why); cleared when one works */
	int reseed_pending;        /* after a fork: reseed before the next cell */
	char err[320];             /* why the last start failed */
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
	int64_t sigint_at;         /* the next SIGINT while interrupted and unanswered */
	int interrupted;
};

static const char *const py_names[] = { "python3", NULL }, *const js_names[] = { "node", "nodejs", NULL };
static const char *const py_flags[] = { "-u", NULL }, *const js_flags[] = { NULL };
static struct kernel kernels[] = {
	{ .lang = "python", .names = py_names, .fallback = "/usr/bin/python3", .flags = py_flags,
	  .interp_opt = &g_python, .src_opt = &g_evalsrv, .legacy_src = "/usr/lib/forkd/forkd_eval.py",
	  .in_fd = -1, .out_fd = -1 },
	{ .lang = "javascript", .names = js_names, .flags = js_flags, .interp_opt = &g_node,
	  .src_opt = &g_evaljs, .in_fd = -1, .out_fd = -1 },
};
#define NKERNELS (sizeof kernels / sizeof *kernels)

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

static void enqueue(struct kernel *k, struct ereq *r, int front)
{
	if (front) {
		r->next = k->head;
		k->head = r;
		if (!k->tail)
			k->tail = r;
	} else {
		r->next = NULL;
		if (k->tail)
			k->tail->next = r;
		else
			k->head = r;
		k->tail = r;
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

static void fail_queue(struct kernel *k, int err, const char *msg)
{
	while (k->head) {
		struct ereq *r = k->head;
		k->head = r->next;
		req_fail(r, err, msg);
	}
	k->tail = NULL;
}

static void server_stop(struct kernel *k)
{
	if (k->pid > 0)
		killpg(k->pid, SIGKILL); /* the reaper discards it; pid is forgotten below */
	if (k->in_fd >= 0)
		close(k->in_fd);
	if (k->out_fd >= 0)
		close(k->out_fd);
	free(k->wbuf);
	free(k->rbuf);
	k->pid = 0;
	k->in_fd = k->out_fd = -1;
	k->ready = 0;
	k->wbuf = k->rbuf = NULL;
	k->hgot = k->rgot = 0;
	k->interrupted = 0;
}

/* A regular executable file. */
static int is_exe(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* Find k's interpreter (in the default env's PATH) and source; sets k->exists. */
static void locate(struct kernel *k)
{
	struct stat st;
	k->interp[0] = k->src[0] = 0;
	if (*k->interp_opt) {
		if (is_exe(*k->interp_opt))
			snprintf(k->interp, sizeof k->interp, "%s", *k->interp_opt);
	} else {
		char **env = base_env(NULL, 0);
		const char *path = env_get(env, "PATH");
		for (const char *const *n = k->names; path && *n && !k->interp[0]; n++)
			for (const char *p = path, *end; !k->interp[0]; p = end + 1) {
				end = strchr(p, ':');
				if (!end)
					end = p + strlen(p);
				int len = (int)(end - p);
				if (len > 0 && (size_t)snprintf(k->interp, sizeof k->interp, "%.*s/%s", len, p, *n) <
						       sizeof k->interp && p[0] == '/' && is_exe(k->interp))
					break;
				k->interp[0] = 0;
				if (!*end)
					break;
			}
		free_strv(env);
		if (!k->interp[0] && k->fallback && is_exe(k->fallback))
			snprintf(k->interp, sizeof k->interp, "%s", k->fallback);
	}
	const char *src = *k->src_opt;
	if (stat(src, &st) < 0 && k->legacy_src && !strcmp(src, DEFAULT_EVALSRV))
		src = k->legacy_src;
	if (stat(src, &st) == 0 && S_ISREG(st.st_mode))
		snprintf(k->src, sizeof k->src, "%s", src);
	k->exists = k->interp[0] && k->src[0];
}

/* Why k cannot run at all (no interpreter, no source), or NULL. */
static const char *missing(struct kernel *k)
{
	if (!k->interp[0] && *k->interp_opt)
		snprintf(k->err, sizeof k->err, "no %s interpreter at %.200s", k->names[0], *k->interp_opt);
	else if (!k->interp[0])
		snprintf(k->err, sizeof k->err, "no %s interpreter in this image (eval needs %s on PATH)",
			 k->names[0], k->names[1] ? "node or nodejs" : k->names[0]);
	else if (!k->src[0])
		snprintf(k->err, sizeof k->err, "the %s kernel %.200s is missing in this image", k->lang,
			 *k->src_opt);
	else
		return NULL;
	return k->err;
}

/* Start the interpreter as the default user and queue the handshake in front of waiting
 * requests. -1 with errno and k->err on failure. */
static int server_start(struct kernel *k)
{
	if (missing(k)) {
		errno = ENOENT;
		return -1;
	}
	struct user u;
	char msg[300];
	if (user_resolve(config_user(), &u, msg, sizeof msg) < 0) {
		int e = errno;
		snprintf(k->err, sizeof k->err, "default user: %s", msg);
		logmsg("cannot start the %s kernel: %s", k->lang, k->err);
		k->failed = 1;
		errno = e;
		return -1;
	}
	int to[2], from[2];
	if (pipe2(to, O_CLOEXEC) < 0)
		goto fail;
	if (pipe2(from, O_CLOEXEC) < 0) {
		int e = errno;
		close(to[0]);
		close(to[1]);
		errno = e;
		goto fail;
	}
	fcntl(to[1], F_SETFL, O_NONBLOCK);
	fcntl(from[0], F_SETFL, O_NONBLOCK);
	char *argv[8];
	int argc = 0;
	argv[argc++] = k->interp;
	for (const char *const *f = k->flags; *f && argc < 6; f++)
		argv[argc++] = (char *)*f;
	argv[argc++] = k->src;
	argv[argc] = NULL;
	/* A kernel lives on in every child of a snapshot: its OpenSSL takes random bytes from the
	 * kernel's CRNG (reseeded at each IDENTITY), never from a generator state they share. */
	char **env = env_preload_rand(base_env(&u, 0));
	int fds[3] = { to[0], from[1], 2 };
	struct ereq *hs = new_reseed(0);
	pid_t pid = -1;
	if (env && hs)
		pid = spawn(argv, env, default_cwd(&u), fds, &u, 0);
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
		errno = e;
		goto fail;
	}
	k->pid = pid;
	k->in_fd = to[1];
	k->out_fd = from[0];
	enqueue(k, hs, 1);
	return 0;
fail:
	e = errno;
	snprintf(k->err, sizeof k->err, "cannot start the %s kernel %.200s: %s", k->lang, k->src, strerror(e));
	logmsg("%s", k->err);
	k->failed = 1;
	errno = e;
	return -1;
}

/* The interpreter is gone or misbehaved: answer the active request, kill it. Before it
 * answered its handshake (not ready), its start failed: the kernel is settled as failed and
 * everything waiting fails with the reason. */
static void server_died(struct kernel *k, const char *why)
{
	struct ereq *r = k->active;
	k->active = NULL;
	logmsg("eval server: %s", why);
	if (!k->ready) {
		snprintf(k->err, sizeof k->err, "the %s kernel failed to start: %s", k->lang, why);
		k->failed = 1;
		if (r)
			req_fail(r, EPIPE, k->err);
		fail_queue(k, EPIPE, k->err);
	} else if (r && !r->s.id) {
		/* a reseed (after a fork) failed: fail everything waiting */
		req_free(r);
		fail_queue(k, EPIPE, "eval server failed to start");
	} else if (r) {
		req_fail(r, k->interrupted ? ETIMEDOUT : EPIPE, why);
	}
	server_stop(k);
}

static void handle_reply(struct kernel *k, uint32_t id, const uint8_t *json, size_t len)
{
	struct ereq *r = k->active;
	if (!r || id != (r->reseed ? 0 : k->next_id)) {
		server_died(k, "reply id mismatch");
		return;
	}
	if (len >= 2 && json[0] == 1 && !r->reseed) {
		/* output of the running cell: forwarded, the request goes on */
		if (r->s.id && (json[1] == 'o' || json[1] == 'e')) {
			fb_begin(json[1] == 'o' ? RP_EVAL_STDOUT : RP_EVAL_STDERR, r->s.id);
			fb_bytes(F_DATA, json + 2, len - 2);
			fb_end();
		}
		return;
	}
	k->active = NULL;
	k->ready = 1;
	k->failed = 0;
	if (r->s.id && r->reseed) {
		send_simple(RP_OK, r->s.id);
	} else if (r->s.id && k->interrupted) {
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
	k->interrupted = 0;
	req_free(r);
}

static void on_server_out(void *ctx, int fd, short rev)
{
	struct kernel *k = ctx;
	(void)rev;
	for (int i = 0; i < 64 && fd == k->out_fd; i++) {
		ssize_t n;
		if (k->hgot < 8) {
			n = read(fd, k->hdr + k->hgot, 8 - k->hgot);
		} else {
			n = read(fd, k->rbuf + k->rgot, k->rlen - k->rgot);
		}
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		if (n <= 0) {
			server_died(k, n ? strerror(errno) : "exited");
			return;
		}
		if (k->hgot < 8) {
			k->hgot += (size_t)n;
			if (k->hgot < 8)
				continue;
			uint32_t len = (uint32_t)k->hdr[0] << 24 | k->hdr[1] << 16 | k->hdr[2] << 8 | k->hdr[3];
			if (len < 4 || len - 4 > REPLY_MAX) {
				server_died(k, "bad reply length");
				return;
			}
			k->rlen = len - 4;
			k->rgot = 0;
			if (!(k->rbuf = malloc(k->rlen ? k->rlen : 1))) {
				server_died(k, "out of memory");
				return;
			}
		} else {
			k->rgot += (size_t)n;
		}
		if (k->rgot == k->rlen) {
			uint32_t id = (uint32_t)k->hdr[4] << 24 | k->hdr[5] << 16 | k->hdr[6] << 8 | k->hdr[7];
			uint8_t *b = k->rbuf;
			k->rbuf = NULL;
			k->hgot = 0;
			handle_reply(k, id, b, k->rlen);
			free(b);
			return;
		}
	}
}

static void on_server_in(void *ctx, int fd, short rev)
{
	struct kernel *k = ctx;
	(void)rev;
	while (fd == k->in_fd && k->woff < k->wlen) {
		ssize_t n = write(fd, k->wbuf + k->woff, k->wlen - k->woff);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return;
		if (n < 0) {
			server_died(k, strerror(errno));
			return;
		}
		k->woff += (size_t)n;
	}
	if (fd == k->in_fd) {
		free(k->wbuf);
		k->wbuf = NULL;
		k->wlen = k->woff = 0;
	}
}

/* Send the next waiting request. */
static void activate(struct kernel *k, int64_t now)
{
	struct ereq *r = k->head;
	if (!(k->wbuf = malloc(8 + (size_t)r->len))) {
		logmsg("eval: out of memory");
		return; /* retried on the next iteration */
	}
	k->head = r->next;
	if (!k->head)
		k->tail = NULL;
	if (!r->reseed && ++k->next_id == 0)
		k->next_id = 1;
	put32(k->wbuf, 4 + r->len);
	put32(k->wbuf + 4, r->reseed ? 0 : k->next_id);
	if (r->len)
		memcpy(k->wbuf + 8, r->code, r->len);
	k->wlen = 8 + r->len;
	k->woff = 0;
	k->active = r;
	k->interrupted = 0;
	k->deadline = r->timeout > 0 ? now + r->timeout : 0;
	on_server_in(k, k->in_fd, 0);
}

static void kernel_poll(struct kernel *k, int64_t now)
{
	if (!k->pid && k->head && server_start(k) < 0)
		fail_queue(k, errno, k->err);
	if (!k->pid)
		return;
	if (!k->active && k->head)
		activate(k, now);
	if (k->active && k->deadline) {
		if (!k->interrupted && now >= k->deadline) {
			kill(k->pid, SIGINT); /* KeyboardInterrupt: globals survive */
			k->interrupted = 1;
			k->kill_at = now + KILL_GRACE_MS;
			k->sigint_at = now + SIGINT_AGAIN_MS;
		} else if (k->interrupted && now >= k->sigint_at && now < k->kill_at) {
			/* the kernels ignore a SIGINT outside a cell: one that came while the cell was
			 * still being read or parsed is lost, so it is sent again until they answer */
			kill(k->pid, SIGINT);
			k->sigint_at = now + SIGINT_AGAIN_MS;
		}
		if (k->interrupted && now >= k->kill_at) {
			/* no answer to the handshake: a start that failed (settled), not restarted */
			int starting = !k->ready;
			server_died(k, starting ? "no answer to its handshake; killed" : "timed out; killed, restarting");
			if (!starting && server_start(k) < 0)
				fail_queue(k, errno, k->err);
			return;
		}
		want_timeout(k->interrupted ? (k->sigint_at < k->kill_at ? k->sigint_at : k->kill_at) : k->deadline);
	}
	if (k->wbuf)
		poll_add(k->in_fd, POLLOUT, on_server_in, k);
	if (outq_has_room()) /* else a streaming cell waits on its pipe until the host takes more */
		poll_add(k->out_fd, POLLIN, on_server_out, k);
}

void eval_poll(int64_t now)
{
	for (size_t i = 0; i < NKERNELS; i++)
		kernel_poll(&kernels[i], now);
}

int eval_reaped(pid_t pid, int status)
{
	(void)status;
	for (size_t i = 0; i < NKERNELS; i++)
		if (kernels[i].pid && pid == kernels[i].pid) {
			server_died(&kernels[i], "exited");
			return 1;
		}
	return 0;
}

static void reseed(struct kernel *k)
{
	struct ereq *r;
	if (k->pid && (r = new_reseed(0)))
		enqueue(k, r, 0);
}

void eval_request(const struct msg *m)
{
	const uint8_t *code;
	uint32_t len;
	int64_t timeout;
	char *lang = NULL;
	struct kernel *k = &kernels[0];
	if (field_i64(m, F_TIMEOUT_MS, 0, &timeout) < 0) {
		send_error(m->stream, EINVAL, "TIMEOUT_MS must be an i64");
		return;
	}
	if (!field_get(m, F_CODE, &code, &len)) {
		send_error(m->stream, EINVAL, "missing CODE");
		return;
	}
	const uint8_t *opts = NULL;
	uint32_t olen = 0;
	if (field_get(m, F_EVAL_OPTS, &opts, &olen) &&
	    (olen > OPTS_MAX || memchr(opts, '\n', olen) || memchr(opts, 0, olen))) {
		send_error(m->stream, EINVAL, "EVAL_OPTS must be one line of JSON of at most %d bytes", OPTS_MAX);
		return;
	}
	if (field_cstr(m, F_LANGUAGE, "LANGUAGE", &lang) < 0)
		return;
	if (lang) {
		for (k = kernels; k < kernels + NKERNELS && strcmp(k->lang, lang); k++)
			;
		if (k == kernels + NKERNELS)
			send_error(m->stream, EINVAL, "unknown LANGUAGE '%.100s' (python or javascript)", lang);
		free(lang);
		if (k == kernels + NKERNELS)
			return;
	}
	if (!k->exists && !k->pid)
		locate(k); /* installed since boot? */
	if (missing(k)) {
		send_error(m->stream, ENOENT, "%s", k->err);
		return;
	}
	size_t head = opts ? (size_t)olen + 2 : 0, total = head + len;
	struct ereq *r = calloc(1, sizeof *r);
	if (!r || total > UINT32_MAX - 16 || !(r->code = malloc(total ? total : 1))) {
		free(r);
		send_error(m->stream, ENOMEM, "out of memory");
		return;
	}
	r->s = (struct stream){ .id = m->stream, .kind = K_EVAL };
	if (opts) {
		r->code[0] = 0;
		memcpy(r->code + 1, opts, olen);
		r->code[olen + 1] = '\n';
	}
	memcpy(r->code + head, code, len);
	r->len = (uint32_t)total;
	r->timeout = timeout > 0 && timeout < INT32_MAX * 1000LL ? timeout : 0;
	if (stream_add(&r->s) < 0) {
		free(r->code);
		free(r);
		return;
	}
	if (k->reseed_pending) { /* after a fork: the interpreter reseeds before its first cell */
		k->reseed_pending = 0;
		reseed(k);
	}
	enqueue(k, r, 0);
}

/* The host gave up the cell on m's stream (its client left): a waiting one is dropped, the
 * running one is interrupted as at its timeout (SIGINT now, killed 2 s later if it does not
 * answer; the reply follows as for a timeout). No reply of its own; an unknown stream is ignored. */
void eval_interrupt(const struct msg *m)
{
	for (size_t i = 0; i < NKERNELS; i++) {
		struct kernel *k = &kernels[i];
		if (k->active && k->active->s.id == m->stream) {
			if (!k->interrupted)
				k->deadline = now_ms(); /* kernel_poll sends the SIGINT */
			return;
		}
		for (struct ereq **pp = &k->head; *pp; pp = &(*pp)->next) {
			struct ereq *r = *pp;
			if (r->s.id != m->stream)
				continue;
			*pp = r->next;
			if (k->tail == r) {
				k->tail = NULL;
				for (struct ereq *t = k->head; t; t = t->next)
					k->tail = t;
			}
			req_fail(r, ECANCELED, "the host gave up the cell");
			return;
		}
	}
}

/* Set by IDENTITY: waking the interpreters on the fork path would cost every child a burst of
 * CPU (under TCG, translating the interpreter's code anew), so each kernel's reseed waits for
 * its first cell, which it precedes. */
void eval_reseed_later(void)
{
	for (size_t i = 0; i < NKERNELS; i++)
		kernels[i].reseed_pending = 1;
}

int eval_ready(void)
{
	for (size_t i = 0; i < NKERNELS; i++)
		if (kernels[i].exists && !kernels[i].failed && !(kernels[i].pid && kernels[i].ready))
			return 0;
	return 1;
}

size_t eval_kernels(char *buf, size_t cap)
{
	size_t n = 0;
	buf[0] = 0;
	for (size_t i = 0; i < NKERNELS; i++)
		if (kernels[i].exists && !kernels[i].failed)
			n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%s", n ? "," : "",
					      kernels[i].lang);
	return n < cap ? n : cap - 1;
}

void eval_init(void)
{
	for (size_t i = 0; i < NKERNELS; i++) {
		locate(&kernels[i]);
		if (kernels[i].exists)
			server_start(&kernels[i]);
		else
			logmsg("no %s kernel: %s", kernels[i].lang, missing(&kernels[i]));
	}
}
