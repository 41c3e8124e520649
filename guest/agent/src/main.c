/* Entry point, the poll() event loop, the stream table, request dispatch and reaping. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"

const char *g_python = NULL; /* NULL: python3 on PATH, then /usr/bin/python3 */
const char *g_evalsrv = "/.forkd/forkd_eval.py";
const char *g_node = NULL; /* NULL: node, then nodejs, on PATH */
const char *g_evaljs = "/.forkd/forkd_eval.js";
const char *g_config_dir = "/.forkd";
const char *g_etc_dir = "/etc";
struct stream *g_streams[MAX_STREAMS];
static int64_t t_start;

int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void logmsg(const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n > sizeof buf - 2)
		n = sizeof buf - 2;
	buf[n++] = '\n';
	dprintf(2, "forkd-agent: %.*s", n, buf);
}

/* ---- stream table ---- */

int stream_add(struct stream *s)
{
	int slot = -1;
	for (int i = 0; i < MAX_STREAMS; i++) {
		if (!g_streams[i])
			slot = slot < 0 ? i : slot;
		else if (g_streams[i]->id == s->id) {
			send_error(s->id, EBUSY, "stream %u already in use", s->id);
			return -1;
		}
	}
	if (slot < 0) {
		send_error(s->id, EBUSY, "too many streams in flight (max %d)", MAX_STREAMS);
		return -1;
	}
	g_streams[slot] = s;
	return 0;
}

void stream_del(struct stream *s)
{
	for (int i = 0; i < MAX_STREAMS; i++)
		if (g_streams[i] == s)
			g_streams[i] = NULL;
}

struct stream *stream_find(uint32_t id, uint8_t kind)
{
	for (int i = 0; i < MAX_STREAMS; i++)
		if (g_streams[i] && g_streams[i]->id == id && g_streams[i]->kind == kind)
			return g_streams[i];
	return NULL;
}

/* ---- poll set, rebuilt every iteration by the modules ---- */

#define MAX_PFD (3 * MAX_STREAMS + 8)
static struct pollfd pfd[MAX_PFD];
static struct { poll_cb cb; void *ctx; } pcb[MAX_PFD];
static int npfd;
static int64_t wake_at;

void poll_add(int fd, short events, poll_cb cb, void *ctx)
{
	if (npfd == MAX_PFD)
		return;
	pfd[npfd] = (struct pollfd){ .fd = fd, .events = events };
	pcb[npfd].cb = cb;
	pcb[npfd].ctx = ctx;
	npfd++;
}

void want_timeout(int64_t deadline_ms)
{
	if (wake_at < 0 || deadline_ms < wake_at)
		wake_at = deadline_ms;
}

/* ---- children ---- */

static int sig_fd = -1;
static int reap_more; /* the last round stopped at its bound: reap again without waiting */

#define REAP_BATCH 64

/* Reaps at most REAP_BATCH children per loop turn: a fork bomb that orphans processes as fast
 * as we reap them would otherwise keep us here forever, and its exec's timeout (checked by
 * exec_poll) would never fire. */
static void on_sigchld(void *ctx, int fd, short revents)
{
	(void)ctx; (void)revents;
	struct signalfd_siginfo si;
	while (fd >= 0 && read(fd, &si, sizeof si) == sizeof si)
		;
	int status, n = 0;
	pid_t pid = 0;
	while (n < REAP_BATCH && (pid = waitpid(-1, &status, WNOHANG)) > 0) {
		n++;
		if (!exec_reaped(pid, status))
			eval_reaped(pid, status); /* orphans fall through and are discarded */
	}
	reap_more = n == REAP_BATCH;
}

/* ---- requests ---- */

static void ping(const struct msg *m)
{
	fb_begin(RP_OK, m->stream);
	fb_i64(F_VERSION, PROTO_VERSION);
	fb_i64(F_UPTIME_MS, now_ms() - t_start);
	fb_i64(F_EVAL_READY, eval_ready());
	char kernels[64];
	size_t n = eval_kernels(kernels, sizeof kernels);
	fb_bytes(F_KERNELS, kernels, n);
	static const char features[] = "file-user";
	fb_bytes(F_FEATURES, features, sizeof features - 1);
	fb_end();
}

void dispatch(const struct msg *m)
{
	if (!fields_valid(m->p, m->n)) {
		send_error(m->stream, EINVAL, "malformed field list");
		return;
	}
	if (m->stream == 0) {
		send_error(0, EINVAL, "stream 0 is reserved");
		return;
	}
	switch (m->type) {
	case T_PING: ping(m); break;
	case T_IDENTITY: identity(m); break;
	case T_SYNC: sync(); send_simple(RP_OK, m->stream); break;
	case T_WINDOW: flow_window(m); break;
	case T_CANCEL: flow_cancel(m); break;
	case T_STREAMS: streams_handover(m); break;
	case T_EXEC: exec_start(m); break;
	case T_STDIN: exec_stdin(m); break;
	case T_SIGNAL: exec_signal(m); break;
	case T_RESIZE: exec_resize(m); break;
	case T_READ:
	case T_WRITE_OPEN:
	case T_LIST:
	case T_STAT:
	case T_MKDIR:
	case T_REMOVE:
	case T_RENAME:
	case T_WATCH: file_request(m); break;
	case T_WRITE_DATA: file_write_data(m); break;
	case T_WRITE_END: file_write_end(m); break;
	case T_EVAL: eval_request(m); break;
	case T_EVAL_INTERRUPT: eval_interrupt(m); break;
	default: send_error(m->stream, ENOSYS, "unknown request type 0x%02x", m->type);
	}
}

int port_can_read(void)
{
	return outq_len() < OUTQ_MAX && exec_stdin_backlog() < STDIN_MAX;
}

/* ---- main ---- */

static void usage(void)
{
	logmsg("usage: forkd-agent [--port PATH | --fd N] [--no-init] [--evalsrv PATH] [--python PATH]"
	       " [--evaljs PATH] [--node PATH] [--config-dir DIR] [--etc-dir DIR]");
}

int main(int argc, char **argv)
{
	const char *port_path = NULL;
	int port_fd = -1, do_init = getpid() == 1;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--no-init")) {
			do_init = 0;
			continue;
		}
		if (!v || (strcmp(a, "--port") && strcmp(a, "--fd") && strcmp(a, "--evalsrv") &&
			   strcmp(a, "--python") && strcmp(a, "--evaljs") && strcmp(a, "--node") &&
			   strcmp(a, "--config-dir") && strcmp(a, "--etc-dir"))) {
			usage();
			if (getpid() != 1)
				return 2;
			continue; /* PID 1 must never exit */
		}
		i++;
		if (!strcmp(a, "--port")) port_path = v;
		else if (!strcmp(a, "--fd")) port_fd = atoi(v);
		else if (!strcmp(a, "--python")) g_python = v;
		else if (!strcmp(a, "--node")) g_node = v;
		else if (!strcmp(a, "--config-dir")) g_config_dir = v;
		else if (!strcmp(a, "--etc-dir")) g_etc_dir = v;
		else { /* --evalsrv, --evaljs: made absolute, the interpreter runs elsewhere */
			char *abs = realpath(v, NULL);
			*(!strcmp(a, "--evalsrv") ? &g_evalsrv : &g_evaljs) = abs ? abs : v;
		}
	}

	t_start = now_ms();
	if (do_init)
		init_system(); /* first: /dev may not be mounted yet */
	/* PID 1's pages stay in RAM: its text is file-backed (the root filesystem), and a workload
	 * that fills the guest's memory (a fork bomb up to pids.max) would otherwise have the kernel
	 * evict it, so every wake-up of the agent that must kill that workload on time waits for
	 * the disk (in a 256 MiB guest: once more than 10 s late without the lock, at most 1.5 s
	 * with it). A static binary: what it maps now is all of its code; its heap is anonymous
	 * and, without swap, never evicted. Children do not inherit the lock. */
	if (do_init && mlockall(MCL_CURRENT) < 0)
		logmsg("mlockall: %s", strerror(errno));
	/* fds 0-2 must be open so that no later fd lands there (spawn dup2s onto them) */
	int nul;
	while (((nul = open(do_init ? "/dev/console" : "/dev/null", O_RDWR | O_NOCTTY)) >= 0 ||
		(nul = open("/dev/null", O_RDWR)) >= 0) && nul < 3)
		;
	if (nul > 2)
		close(nul);
	if (!do_init && getpid() != 1)
		prctl(PR_SET_CHILD_SUBREAPER, 1); /* reap orphans like PID 1 does */
	if (chdir("/") < 0)
		logmsg("chdir /: %s", strerror(errno));
	umask(0); /* MODE fields are exact; children get 022 back (spawn) */
	signal(SIGPIPE, SIG_IGN);

	sigset_t chld;
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	sigprocmask(SIG_BLOCK, &chld, NULL);
	sig_fd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
	if (sig_fd < 0)
		logmsg("signalfd: %s", strerror(errno)); /* children are then reaped on timer */

	port_setup(port_path, port_fd);
	config_load();
	eval_init();

	for (;;) {
		int64_t now = now_ms();
		npfd = 0;
		wake_at = -1;
		if (sig_fd >= 0)
			poll_add(sig_fd, POLLIN, on_sigchld, NULL);
		else
			want_timeout(now + 100);
		if (reap_more)
			want_timeout(now);
		exec_poll(now);
		files_poll(now);
		watch_poll(now);
		eval_poll(now);
		port_poll(now); /* last: flushes what the others queued */

		int timeout = -1;
		if (wake_at >= 0)
			timeout = wake_at <= now ? 0 : (int)(wake_at - now > 60000 ? 60000 : wake_at - now);
		int n = poll(pfd, npfd, timeout);
		if (n < 0) {
			if (errno != EINTR) {
				logmsg("poll: %s", strerror(errno));
				usleep(10000);
			}
			continue;
		}
		if (sig_fd < 0 || reap_more)
			on_sigchld(NULL, -1, 0);
		/* callbacks may free the objects of later entries; they look them up again */
		for (int i = 0; i < npfd; i++)
			if (pfd[i].revents)
				pcb[i].cb(pcb[i].ctx, pfd[i].fd, pfd[i].revents);
	}
}
