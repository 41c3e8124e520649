/* EXEC, STDIN, SIGNAL: child processes with streamed output. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"

#define DRAIN_BUDGET (1024 * 1024) /* per pipe, after the main process exited */
#define CMD_KEEP 2048 /* bytes of a command's SHELL or ARGs kept for STREAMS */

struct exec {
	struct stream s;
	pid_t pid;
	int out_fd, err_fd, in_fd; /* our pipe ends, -1 once closed */
	uint8_t *in_buf;           /* stdin bytes not yet written */
	size_t in_len, in_off;
	int in_eof;                /* host closed stdin: close in_fd once drained */
	int64_t deadline;          /* 0: no timeout */
	int timed_out, exited, status;
	size_t budget[2];          /* drain budget for out/err after exit */
	int pty;                   /* on a pseudo-terminal: out_fd is its master, in_fd a dup */
	int pty_eof;               /* every slave closed (EIO): the master stays open until the
				    * exit, closing it would hang up (SIGHUP) a command exiting */
	int64_t started_ns;        /* CLOCK_REALTIME at its start */
	uint8_t *cmd;              /* its SHELL, or its ARGs each ended by a NUL (at most CMD_KEEP) */
	uint32_t cmd_len;
	int shell;
};

void free_strv(char **v)
{
	if (!v)
		return;
	for (char **p = v; *p; p++)
		free(*p);
	free(v);
}

static struct rlimit orig_nofile;

pid_t spawn(char *const argv[], char *const envp[], const char *cwd, const int fds[3],
	    const struct user *u, int ctty)
{
	int ep[2];
	if (pipe2(ep, O_CLOEXEC) < 0)
		return -1;
	pid_t pid = fork();
	if (pid < 0) {
		int e = errno;
		close(ep[0]);
		close(ep[1]);
		errno = e;
		return -1;
	}
	if (pid == 0) {
		/* child: undo the agent's signal setup, then report any failure via ep */
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		signal(SIGPIPE, SIG_DFL);
		setsid();
		umask(022);
		limits_join();
		for (int i = 0; i < 3; i++)
			if (dup2(fds[i], i) < 0)
				goto fail;
		/* a PTY's slave becomes the new session's controlling terminal */
		if (ctty && ioctl(0, TIOCSCTTY, 0) < 0)
			goto fail;
		if (orig_nofile.rlim_cur)
			setrlimit(RLIMIT_NOFILE, &orig_nofile);
		if (chdir(cwd) < 0) /* as root: like sudo -u, a cwd the user cannot enter is kept */
			goto fail;
		if (u && user_become(u) < 0)
			goto fail;
		environ = (char **)envp;
		execvp(argv[0], argv);
fail:;
		int e = errno;
		if (write(ep[1], &e, sizeof e) < 0)
			_exit(126);
		_exit(127);
	}
	close(ep[1]);
	int e = 0;
	ssize_t n;
	while ((n = read(ep[0], &e, sizeof e)) < 0 && errno == EINTR)
		;
	close(ep[0]);
	if (n == sizeof e) {
		/* the child is reaped by the SIGCHLD handler like any orphan */
		errno = e;
		return -1;
	}
	return pid;
}

/* Raise the fd limit: up to 3 pipes per stream. Children get the original limit back. */
__attribute__((constructor)) static void raise_nofile(void)
{
	struct rlimit r;
	if (getrlimit(RLIMIT_NOFILE, &orig_nofile) == 0 && orig_nofile.rlim_cur < 4096) {
		r = orig_nofile;
		r.rlim_cur = r.rlim_max < 4096 ? r.rlim_max : 4096;
		setrlimit(RLIMIT_NOFILE, &r);
	}
}

static void closefd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

/* Make the pipe end we keep nonblocking; p[0] read, p[1] write. */
static int mkpipe(int p[2], int ours)
{
	if (pipe2(p, O_CLOEXEC) < 0)
		return -1;
	fcntl(p[ours], F_SETFL, O_NONBLOCK);
	return 0;
}

/* A pseudo-terminal of rows x cols: *master (ours, nonblocking) and *slave, or -1 with errno. */
static int pty_open(int rows, int cols, int *master, int *slave)
{
	char name[128];
	int mfd = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (mfd < 0)
		return -1;
	struct winsize ws = { .ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols };
	if (grantpt(mfd) < 0 || unlockpt(mfd) < 0 || ptsname_r(mfd, name, sizeof name) != 0 ||
	    ioctl(mfd, TIOCSWINSZ, &ws) < 0)
		goto fail;
	int sfd = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (sfd < 0)
		goto fail;
	fcntl(mfd, F_SETFL, O_NONBLOCK);
	*master = mfd;
	*slave = sfd;
	return 0;
fail:;
	int err = errno;
	close(mfd);
	errno = err;
	return -1;
}

/* PTY_ROWS and PTY_COLS: 1 both present and valid (*rows, *cols), 0 neither, -1 invalid. */
static int pty_size(const struct msg *m, int64_t *rows, int64_t *cols)
{
	int r = field_i64(m, F_PTY_ROWS, 0, rows), c = field_i64(m, F_PTY_COLS, 0, cols);
	if (r == 0 && c == 0)
		return 0;
	if (r <= 0 || c <= 0 || *rows < 1 || *rows > 65535 || *cols < 1 || *cols > 65535)
		return -1;
	return 1;
}

/* Keeps (a bounded copy of) the command for STREAMS: a shell string, or the argv. */
static void keep_command(struct exec *e, char **argv, int shell)
{
	size_t n = 0;
	e->shell = shell;
	if (!(e->cmd = malloc(CMD_KEEP)))
		return;
	for (char **a = shell ? argv + 2 : argv; *a && n < CMD_KEEP; a++) {
		size_t len = strlen(*a) + !shell; /* an ARG's NUL ends it */
		if (len > CMD_KEEP - n)
			len = CMD_KEEP - n;
		memcpy(e->cmd + n, *a, len);
		n += len;
		if (shell)
			break;
	}
	e->cmd_len = (uint32_t)n;
}

static void exec_free(struct exec *e)
{
	free(e->cmd);
	free(e);
}

void exec_describe(struct stream *s)
{
	struct exec *e = (struct exec *)s;
	fb_i64(F_PID, e->pid);
	fb_i64(F_STDIN, e->in_fd >= 0 && !e->in_eof);
	if (e->pty)
		fb_i64(F_PTY, 1);
	fb_i64(F_TIME_NS, e->started_ns);
	if (e->shell)
		fb_bytes(F_SHELL, e->cmd, e->cmd_len);
	else
		for (uint32_t off = 0; off < e->cmd_len;) {
			const uint8_t *end = memchr(e->cmd + off, 0, e->cmd_len - off);
			uint32_t len = end ? (uint32_t)(end - (e->cmd + off)) : e->cmd_len - off;
			fb_bytes(F_ARG, e->cmd + off, len);
			off += len + 1;
		}
	if (e->s.flow)
		fb_i64(F_WINDOW, e->s.credit);
}

void exec_start(const struct msg *m)
{
	char **argv = NULL, **env = NULL, *cwd = NULL, *s = NULL, *spec = NULL;
	struct user *u = NULL;
	char msg[320];
	int64_t timeout, use_stdin, rows = 0, cols = 0;
	int p_in[2] = { -1, -1 }, p_out[2] = { -1, -1 }, p_err[2] = { -1, -1 };
	struct exec *e = NULL;
	const uint8_t *v;
	uint32_t len;
	size_t off, n;

	if (field_i64(m, F_TIMEOUT_MS, 0, &timeout) < 0 || field_i64(m, F_STDIN, 0, &use_stdin) < 0) {
		send_error(m->stream, EINVAL, "TIMEOUT_MS and STDIN must be i64");
		return;
	}
	int pty = pty_size(m, &rows, &cols);
	if (pty < 0) {
		send_error(m->stream, EINVAL, "PTY_ROWS and PTY_COLS must both be i64 from 1 to 65535");
		return;
	}
	if (!(e = calloc(1, sizeof *e)))
		goto nomem;
	e->s = (struct stream){ .id = m->stream, .kind = K_EXEC };
	e->out_fd = e->err_fd = e->in_fd = -1;
	if (!flow_init(&e->s, m)) {
		free(e);
		return;
	}
	if (stream_add(&e->s) < 0) {
		free(e);
		return;
	}

	/* argv: SHELL wins over ARG */
	int r = field_cstr(m, F_SHELL, "SHELL", &s);
	if (r < 0)
		goto out;
	if (r > 0) {
		if (!(argv = calloc(4, sizeof *argv)) || !(argv[0] = strdup("/bin/sh")) ||
		    !(argv[1] = strdup("-c")))
			goto nomem;
		argv[2] = s;
		s = NULL;
	} else {
		for (off = 0, n = 0; field_next(m, F_ARG, &off, &v, &len); n++)
			;
		if (!n) {
			send_error(m->stream, EINVAL, "EXEC needs ARG or SHELL");
			goto out;
		}
		if (!(argv = calloc(n + 1, sizeof *argv)))
			goto nomem;
		for (off = 0, n = 0; field_next(m, F_ARG, &off, &v, &len); n++)
			if (!(argv[n] = dup_cstr(v, len))) {
				send_error(m->stream, errno, "bad ARG");
				goto out;
			}
	}

	keep_command(e, argv, r > 0);

	/* the user: USER, else the image's default user */
	if ((r = field_cstr(m, F_USER, "USER", &spec)) < 0)
		goto out;
	if (r > 0 && !spec[0]) {
		send_error(m->stream, EINVAL, "USER must not be empty");
		goto out;
	}
	if (!(u = malloc(sizeof *u)))
		goto nomem;
	if (user_resolve(r > 0 ? spec : config_user(), u, msg, sizeof msg) < 0) {
		send_error(m->stream, errno, "%s%s", r > 0 ? "" : "default user: ", msg);
		goto out;
	}
	if (!(env = base_env(u, r > 0)))
		goto nomem;
	for (off = 0; field_next(m, F_ENV, &off, &v, &len);) {
		char *kv = dup_cstr(v, len);
		if (!kv || !strchr(kv, '=') || kv[0] == '=') {
			free(kv);
			send_error(m->stream, EINVAL, "ENV must be K=V");
			goto out;
		}
		if (!(env = env_set(env, kv)))
			goto nomem;
	}
	if ((r = field_cstr(m, F_CWD, "CWD", &cwd)) < 0)
		goto out;
	if (pty) {
		/* a terminal the program can drive, unless the request says which */
		int has_term = 0;
		for (off = 0; field_next(m, F_ENV, &off, &v, &len);)
			has_term |= len >= 5 && !memcmp(v, "TERM=", 5);
		char *kv = has_term ? NULL : strdup("TERM=xterm-256color");
		if (!has_term && (!kv || !(env = env_set(env, kv))))
			goto nomem;
	}

	if (pty) {
		/* the slave is the command's stdin, stdout and stderr; the master's output is STDOUT,
		 * STDIN goes to a dup of it (closing stdin then leaves the terminal up) */
		if (pty_open((int)rows, (int)cols, &p_out[0], &p_out[1]) < 0 ||
		    (p_in[1] = fcntl(p_out[0], F_DUPFD_CLOEXEC, 0)) < 0) {
			send_error(m->stream, errno, "pty: %s", strerror(errno));
			goto out;
		}
		p_in[0] = p_err[1] = p_out[1];
		/* the terminal is the user's, as login makes it (programs reopen it by name) */
		if (u->uid != 0 && fchown(p_out[1], u->uid, (gid_t)-1) < 0)
			logmsg("pty: fchown: %s", strerror(errno));
	} else if ((use_stdin == 1 ? mkpipe(p_in, 1)
				   : (p_in[0] = open("/dev/null", O_RDONLY | O_CLOEXEC))) < 0 ||
		   mkpipe(p_out, 0) < 0 || mkpipe(p_err, 0) < 0) {
		send_error(m->stream, errno, "pipe: %s", strerror(errno));
		goto out;
	}
	int fds[3] = { p_in[0], p_out[1], p_err[1] };
	e->pid = spawn(argv, env, cwd ? cwd : default_cwd(u), fds, u, pty);
	if (pty)
		p_in[0] = p_err[1] = -1; /* the slave: closed once, as p_out[1] */
	if (e->pid < 0) {
		send_error(m->stream, errno, "cannot start %s: %s", argv[0], strerror(errno));
		goto out;
	}
	closefd(&p_in[0]);
	closefd(&p_out[1]);
	closefd(&p_err[1]);
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	e->started_ns = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
	e->pty = pty;
	e->in_fd = p_in[1];
	e->out_fd = p_out[0];
	e->err_fd = p_err[0];
	e->budget[0] = e->budget[1] = DRAIN_BUDGET;
	if (timeout > 0)
		e->deadline = now_ms() + (timeout < INT32_MAX * 1000LL ? timeout : INT32_MAX * 1000LL);
	fb_begin(RP_STARTED, m->stream);
	fb_i64(F_PID, e->pid);
	if (e->s.flow)
		fb_i64(F_WINDOW, e->s.credit); /* says: this agent honours the window */
	if (pty) {
		fb_i64(F_PTY_ROWS, rows); /* says: the command runs on a PTY */
		fb_i64(F_PTY_COLS, cols);
	}
	fb_end();
	free_strv(argv);
	free_strv(env);
	free(cwd);
	free(spec);
	free(u);
	return;

nomem:
	send_error(m->stream, ENOMEM, "out of memory");
out:
	for (int i = 0; i < 2; i++) {
		closefd(&p_in[i]);
		closefd(&p_out[i]);
		closefd(&p_err[i]);
	}
	free_strv(argv);
	free_strv(env);
	free(cwd);
	free(s);
	free(spec);
	free(u);
	if (e) {
		stream_del(&e->s);
		exec_free(e);
	}
}

static void stdin_drop(struct exec *e)
{
	free(e->in_buf);
	e->in_buf = NULL;
	e->in_len = e->in_off = 0;
	closefd(&e->in_fd);
}

/* Write pending stdin; close it when the host asked and everything is written. */
static void stdin_flush(struct exec *e)
{
	while (e->in_fd >= 0 && e->in_off < e->in_len) {
		ssize_t n = write(e->in_fd, e->in_buf + e->in_off, e->in_len - e->in_off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN)
				stdin_drop(e); /* EPIPE: the reader is gone */
			return;
		}
		e->in_off += (size_t)n;
	}
	free(e->in_buf);
	e->in_buf = NULL;
	e->in_len = e->in_off = 0;
	if (e->in_eof)
		closefd(&e->in_fd);
}

void exec_stdin(const struct msg *m)
{
	struct exec *e = (struct exec *)stream_find(m->stream, K_EXEC);
	const uint8_t *v;
	uint32_t len = 0;
	if (!e || e->in_fd < 0 || e->in_eof)
		return; /* no such exec, or stdin not streamed: discard */
	if (!field_get(m, F_DATA, &v, &len) || len == 0) {
		e->in_eof = 1;
		/* a terminal has no end of input: ^D is what reads as one (at a line's start) */
		v = (const uint8_t *)"\x04";
		len = e->pty ? 1 : 0;
	}
	if (len) {
		uint8_t *b = realloc(e->in_buf, e->in_len + len);
		if (!b) {
			logmsg("stdin: out of memory, dropping %u bytes", len);
			return;
		}
		memcpy(b + e->in_len, v, len);
		e->in_buf = b;
		e->in_len += len;
	}
	stdin_flush(e);
}

/* Sends SIG to every process whose session is SID (what /proc names; 0 when it cannot be read). */
static void kill_session(pid_t sid, int sig)
{
	DIR *d = opendir("/proc");
	struct dirent *de;
	while (d && (de = readdir(d))) {
		char *end, path[64], buf[512];
		long pid = strtol(de->d_name, &end, 10);
		if (*end || pid <= 1 || pid == getpid())
			continue;
		snprintf(path, sizeof path, "/proc/%ld/stat", pid);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		ssize_t n = read(fd, buf, sizeof buf - 1);
		close(fd);
		if (n <= 0)
			continue;
		buf[n] = 0;
		/* pid (comm) state ppid pgrp session ...: comm may hold anything, so after the last ')' */
		char *rp = strrchr(buf, ')');
		int ppid, pgrp, session;
		char state;
		if (rp && sscanf(rp + 1, " %c %d %d %d", &state, &ppid, &pgrp, &session) == 4 &&
		    session == sid)
			kill((pid_t)pid, sig);
	}
	if (d)
		closedir(d);
}

/*
 * Signals an exec's processes: its own process group (the exec is a session leader, setsid) and,
 * on a terminal, its foreground group (a job-control shell runs each job in a group of its own);
 * `all` (timeout, cancel, SIGKILL): every process of its session too, background jobs included.
 */
static void signal_exec(struct exec *e, int sig, int all)
{
	killpg(e->pid, sig);
	if (e->pty && e->out_fd >= 0) {
		pid_t fg = tcgetpgrp(e->out_fd);
		if (fg > 0 && fg != e->pid)
			killpg(fg, sig);
	}
	if (all)
		kill_session(e->pid, sig);
}

void exec_signal(const struct msg *m)
{
	struct exec *e = (struct exec *)stream_find(m->stream, K_EXEC);
	int64_t sig;
	if (field_i64(m, F_SIGNAL, 0, &sig) <= 0 || sig <= 0 || sig >= NSIG) {
		/* SIGNAL has no reply; an ERROR would end the EXEC's stream */
		logmsg("stream %u: ignoring SIGNAL without a valid signal number", m->stream);
		return;
	}
	if (e && !e->exited)
		signal_exec(e, (int)sig, sig == SIGKILL);
}

void exec_resize(const struct msg *m)
{
	struct exec *e = (struct exec *)stream_find(m->stream, K_EXEC);
	int64_t rows, cols;
	/* RESIZE has no reply; an ERROR would end the EXEC's stream */
	if (pty_size(m, &rows, &cols) <= 0) {
		logmsg("stream %u: ignoring RESIZE without a valid size", m->stream);
		return;
	}
	if (!e || !e->pty || e->out_fd < 0)
		return;
	struct winsize ws = { .ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols };
	if (ioctl(e->out_fd, TIOCSWINSZ, &ws) < 0) /* the kernel sends SIGWINCH */
		logmsg("stream %u: TIOCSWINSZ: %s", m->stream, strerror(errno));
}

int exec_reaped(pid_t pid, int status)
{
	for (int i = 0; i < MAX_STREAMS; i++) {
		struct exec *e = (struct exec *)g_streams[i];
		if (e && e->s.kind == K_EXEC && e->pid == pid && !e->exited) {
			e->exited = 1;
			e->status = status;
			return 1;
		}
	}
	return 0;
}

size_t exec_stdin_backlog(void)
{
	size_t n = 0;
	for (int i = 0; i < MAX_STREAMS; i++) {
		struct exec *e = (struct exec *)g_streams[i];
		if (e && e->s.kind == K_EXEC)
			n += e->in_len - e->in_off;
	}
	return n;
}

/* Forward one chunk from an output pipe. Returns 1 if data moved, 0 on EAGAIN/EOF. */
static int pump(struct exec *e, int which)
{
	int *fd = which ? &e->err_fd : &e->out_fd;
	size_t max = flow_allow(&e->s, CHUNK);
	if (*fd < 0 || !max)
		return 0;
	fb_begin(which ? RP_STDERR : RP_STDOUT, e->s.id);
	uint8_t *p = fb_reserve(F_DATA, max);
	if (!p) {
		fb_abort();
		return 0;
	}
	ssize_t n = read(*fd, p, max);
	if (n > 0) {
		fb_commit((size_t)n);
		fb_end();
		flow_used(&e->s, (size_t)n);
		e->budget[which] -= e->budget[which] < (size_t)n ? e->budget[which] : (size_t)n;
		return 1;
	}
	fb_abort();
	if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
		if (e->pty && !e->exited)
			e->pty_eof = 1;
		else
			closefd(fd);
	}
	return 0;
}

static void on_out(void *ctx, int fd, short rev)
{
	(void)rev;
	struct exec *e = ctx;
	if (fd == e->out_fd || fd == e->err_fd)
		pump(e, fd == e->err_fd);
}

static void on_in(void *ctx, int fd, short rev)
{
	(void)rev;
	struct exec *e = ctx;
	if (fd == e->in_fd)
		stdin_flush(e);
}

/* After the main process exited: forward what is readable now, then EXIT. Returns 1 when
 * the exec is finished. */
static int drain(struct exec *e)
{
	for (int w = 0; w < 2; w++)
		while ((w ? e->err_fd : e->out_fd) >= 0) {
			if (!outq_has_room())
				return 0; /* wait for the host to take output */
			if (e->budget[w] && !flow_allow(&e->s, 1))
				return 0; /* wait for the host's credit */
			if (!e->budget[w] || !pump(e, w))
				break;
		}
	fb_begin(RP_EXIT, e->s.id);
	if (WIFSIGNALED(e->status))
		fb_i64(F_EXIT_SIGNAL, WTERMSIG(e->status));
	else
		fb_i64(F_EXIT_CODE, WEXITSTATUS(e->status));
	fb_i64(F_TIMED_OUT, e->timed_out);
	fb_end();
	closefd(&e->out_fd);
	closefd(&e->err_fd);
	stdin_drop(e);
	return 1;
}

void exec_cancel(struct stream *s)
{
	struct exec *e = (struct exec *)s;
	if (!e->exited)
		signal_exec(e, SIGKILL, 1);
	closefd(&e->out_fd);
	closefd(&e->err_fd);
	stdin_drop(e);
	stream_del(&e->s);
	exec_free(e);
}

void exec_poll(int64_t now)
{
	int room = outq_has_room();
	for (int i = 0; i < MAX_STREAMS; i++) {
		struct exec *e = (struct exec *)g_streams[i];
		if (!e || e->s.kind != K_EXEC)
			continue;
		if (e->exited) {
			if (drain(e)) {
				stream_del(&e->s);
				exec_free(e);
			} /* else: outq full, retried after the next POLLOUT */
			continue;
		}
		if (e->deadline && !e->timed_out) {
			if (now >= e->deadline) {
				signal_exec(e, SIGKILL, 1);
				e->timed_out = 1;
				/* Answer now: SIGKILL cannot be refused, but under a fork bomb the main
				 * process may wait seconds for a CPU to die on. Its zombie is reaped
				 * later like any orphan's. */
				int st;
				e->exited = 1;
				e->status = waitpid(e->pid, &st, WNOHANG) == e->pid ? st : SIGKILL;
				want_timeout(now);
				continue;
			} else {
				want_timeout(e->deadline);
			}
		}
		/* backpressure: stop reading output while the port queue is full or the host's
		 * window for this stream is used up (the command then blocks on its full pipe) */
		int take = room && flow_allow(&e->s, 1);
		if (take && e->out_fd >= 0 && !e->pty_eof)
			poll_add(e->out_fd, POLLIN, on_out, e);
		if (take && e->err_fd >= 0)
			poll_add(e->err_fd, POLLIN, on_out, e);
		if (e->in_fd >= 0 && e->in_off < e->in_len)
			poll_add(e->in_fd, POLLOUT, on_in, e);
	}
}
