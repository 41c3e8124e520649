/*
 * WATCH: a directory's changes (inotify), streamed as WATCH_EVENT frames until CANCEL.
 *
 * Each watch has its own inotify instance and a table of its watched directories (wd -> path;
 * recursive: the subdirectories there at the start and those made or moved in later). Events
 * wait in a bounded queue while the host's WINDOW credit is used up; a full queue ends with one
 * `overflow` event and drops the rest until it has been sent (directories are still added, so
 * the watch stays whole). The watched directory removed or moved away ends the stream with END.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"

#define WATCHES_MAX 64           /* WATCH streams at once */
#define DIRS_MAX 8192            /* directories one watch may watch */
#define DIRS_TOTAL_MAX 32768     /* ... and all of them together */
#define SCAN_ENTRIES_MAX 262144  /* directory entries read to add one subtree */
#define QUEUE_MAX 4096           /* events waiting for credit */
#define QUEUE_BYTES_MAX (1 << 20)
#define EVENT_COST 64            /* what one event costs of the window, plus its path's bytes */

enum { EV_CREATE, EV_WRITE, EV_REMOVE, EV_RENAME, EV_CHMOD, EV_OVERFLOW };
static const char *const EV_NAMES[] = { "create", "write", "remove", "rename", "chmod", "overflow" };

#define WMASK (IN_CREATE | IN_MODIFY | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ATTRIB | \
	       IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_EXCL_UNLINK)

struct wdir {
	int wd;
	char *path;
};

struct event {
	uint8_t type, isdir;
	char *path;
};

struct watch {
	struct stream s;
	int fd;            /* inotify */
	int recursive;
	int root_wd;
	int ended;         /* the root went away: END once the queue is sent */
	int lost;          /* the queue overflowed: events are dropped until its marker is sent */
	char *root;        /* the watched path: what an overflow marker names (never copied, so a
			    * marker needs no memory: one is always queued when events are lost) */
	struct user *user; /* WATCH's USER (NULL: the agent): directories made later are added as it */
	struct wdir *dirs; /* sorted by wd */
	size_t ndirs, capdirs;
	struct event q[QUEUE_MAX];
	size_t qhead, qlen, qbytes;
};

static size_t g_dirs_total; /* directories watched by every watch */

static int watches_count(void)
{
	int n = 0;
	for (int i = 0; i < MAX_STREAMS; i++)
		n += g_streams[i] && g_streams[i]->kind == K_WATCH;
	return n;
}

/* ---- the wd table ---- */

static size_t dir_pos(const struct watch *w, int wd)
{
	size_t lo = 0, hi = w->ndirs;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (w->dirs[mid].wd < wd)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static struct wdir *dir_find(const struct watch *w, int wd)
{
	size_t i = dir_pos(w, wd);
	return i < w->ndirs && w->dirs[i].wd == wd ? &w->dirs[i] : NULL;
}

static void dir_forget(struct watch *w, int wd)
{
	size_t i = dir_pos(w, wd);
	if (i >= w->ndirs || w->dirs[i].wd != wd)
		return;
	free(w->dirs[i].path);
	memmove(&w->dirs[i], &w->dirs[i + 1], (w->ndirs - i - 1) * sizeof *w->dirs);
	w->ndirs--;
	g_dirs_total--;
}

/* Watches PATH (a symlink to a directory: only `follow`, the watched path itself): 0, or -1
 * with errno (ENOSPC at a limit). An existing wd gets the new path. */
static int dir_add(struct watch *w, const char *path, int follow)
{
	if (w->ndirs >= DIRS_MAX || g_dirs_total >= DIRS_TOTAL_MAX) {
		errno = ENOSPC;
		return -1;
	}
	int wd = inotify_add_watch(w->fd, path, WMASK | (follow ? 0 : IN_DONT_FOLLOW));
	if (wd < 0)
		return -1;
	char *p = strdup(path);
	if (!p) {
		errno = ENOMEM;
		return -1;
	}
	struct wdir *d = dir_find(w, wd);
	if (d) { /* the same directory by another path (moved within the tree) */
		free(d->path);
		d->path = p;
		return 0;
	}
	if (w->ndirs == w->capdirs) {
		size_t cap = w->capdirs ? w->capdirs * 2 : 16;
		struct wdir *nd = realloc(w->dirs, cap * sizeof *nd);
		if (!nd) {
			free(p);
			inotify_rm_watch(w->fd, wd);
			errno = ENOMEM;
			return -1;
		}
		w->dirs = nd;
		w->capdirs = cap;
	}
	size_t i = dir_pos(w, wd);
	memmove(&w->dirs[i + 1], &w->dirs[i], (w->ndirs - i) * sizeof *w->dirs);
	w->dirs[i] = (struct wdir){ .wd = wd, .path = p };
	w->ndirs++;
	g_dirs_total++;
	return 0;
}

/* PATH joined with NAME in buf: 0, or -1 if it would exceed PATH_MAX. */
static int join(char *buf, const char *dir, const char *name)
{
	size_t n = strlen(dir), m = strlen(name);
	int slash = !(n == 1 && dir[0] == '/');
	if (n + slash + m + 1 > PATH_MAX)
		return -1;
	memcpy(buf, dir, n);
	if (slash)
		buf[n++] = '/';
	memcpy(buf + n, name, m + 1);
	return 0;
}

/* ---- the event queue ---- */

static void queue_push(struct watch *w, int type, int isdir, const char *path)
{
	if (w->lost || w->ended)
		return;
	if (w->qlen) { /* a file written in many pieces: one write event while it waits */
		struct event *t = &w->q[(w->qhead + w->qlen - 1) % QUEUE_MAX];
		if (type == EV_WRITE && t->type == EV_WRITE && !strcmp(t->path, path))
			return;
	}
	size_t len = strlen(path);
	char *p = NULL;
	/* the last slot is the marker's: a queue that holds events always has room for it */
	if (type != EV_OVERFLOW && w->qlen < QUEUE_MAX - 1 && w->qbytes + len <= QUEUE_BYTES_MAX)
		p = strdup(path);
	if (!p) { /* full, out of memory (events lost as well), or the marker itself */
		type = EV_OVERFLOW;
		isdir = 1;
		p = w->root;
		len = strlen(p);
		w->lost = 1;
	}
	w->q[(w->qhead + w->qlen) % QUEUE_MAX] = (struct event){ .type = (uint8_t)type,
								 .isdir = (uint8_t)!!isdir, .path = p };
	w->qlen++;
	w->qbytes += len;
}

static void queue_pop(struct watch *w)
{
	struct event *e = &w->q[w->qhead];
	if (e->type == EV_OVERFLOW)
		w->lost = 0;
	w->qbytes -= strlen(e->path);
	if (e->path != w->root)
		free(e->path);
	w->qhead = (w->qhead + 1) % QUEUE_MAX;
	w->qlen--;
}

/* ---- adding subtrees ---- */

/*
 * Watches the subdirectories under DIR (itself already watched), breadth first. `announce`:
 * each entry found is reported as created (a directory made after its parent's event: what was
 * made in it before its watch existed). -1 with errno at a limit, else 0.
 */
static int add_tree(struct watch *w, const char *dir, int announce)
{
	size_t scanned = 0, cap = 16, head = 0, n = 0;
	char **todo = malloc(cap * sizeof *todo);
	char path[PATH_MAX];
	int rc = 0;
	if (!todo || !(todo[n++] = strdup(dir))) {
		free(todo);
		errno = ENOMEM;
		return -1;
	}
	while (head < n && rc == 0) {
		char *cur = todo[head++];
		DIR *d = opendir(cur);
		struct dirent *de;
		while (d && rc == 0 && (de = readdir(d))) {
			if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
				continue;
			if (++scanned > SCAN_ENTRIES_MAX) {
				errno = ENOSPC;
				rc = -1;
				break;
			}
			if (join(path, cur, de->d_name) < 0)
				continue;
			int isdir = de->d_type == DT_DIR;
			if (de->d_type == DT_UNKNOWN) {
				struct stat st;
				isdir = lstat(path, &st) == 0 && S_ISDIR(st.st_mode);
			}
			if (announce)
				queue_push(w, EV_CREATE, isdir, path);
			if (!isdir)
				continue;
			if (dir_add(w, path, 0) < 0) {
				if (errno == ENOSPC || errno == ENOMEM)
					rc = -1;
				continue; /* gone meanwhile, or not ours to read */
			}
			if (n == cap) {
				char **nt = realloc(todo, cap * 2 * sizeof *nt);
				if (!nt) {
					errno = ENOMEM;
					rc = -1;
					break;
				}
				todo = nt;
				cap *= 2;
			}
			if (!(todo[n] = strdup(path))) {
				errno = ENOMEM;
				rc = -1;
				break;
			}
			n++;
		}
		if (d)
			closedir(d);
	}
	int err = errno;
	for (size_t i = 0; i < n; i++)
		free(todo[i]);
	free(todo);
	errno = err;
	return rc;
}

/* Stops watching DIR and everything under it (a directory moved out of the tree). */
static void drop_tree(struct watch *w, const char *dir)
{
	size_t n = strlen(dir);
	for (size_t i = 0; i < w->ndirs;) {
		const char *p = w->dirs[i].path;
		if (!strncmp(p, dir, n) && (p[n] == '/' || p[n] == 0)) {
			int wd = w->dirs[i].wd;
			inotify_rm_watch(w->fd, wd);
			dir_forget(w, wd); /* its IN_IGNORED then finds nothing */
		} else {
			i++;
		}
	}
}

/* ---- inotify ---- */

static void on_event(struct watch *w, const struct inotify_event *ev)
{
	if (ev->mask & IN_Q_OVERFLOW) {
		struct wdir *r = dir_find(w, w->root_wd);
		if (!w->lost && r) {
			/* what the kernel dropped is lost like what we drop */
			queue_push(w, EV_OVERFLOW, 1, r->path);
			w->lost = 1;
		}
		return;
	}
	struct wdir *d = dir_find(w, ev->wd);
	if (!d)
		return; /* a directory already forgotten */
	if (ev->mask & IN_IGNORED) {
		if (ev->wd == w->root_wd)
			w->ended = 1;
		dir_forget(w, ev->wd);
		return;
	}
	if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT)) {
		if (ev->wd == w->root_wd)
			w->ended = 1; /* a subdirectory's own removal is reported by its parent */
		return;
	}
	char path[PATH_MAX];
	const char *name = ev->len ? ev->name : "";
	if (!*name)
		strcpy(path, d->path); /* the watched directory itself (its chmod) */
	else if (join(path, d->path, name) < 0)
		return; /* too long to name */
	int isdir = !!(ev->mask & IN_ISDIR);
	uint32_t m = ev->mask;
	if (m & (IN_CREATE | IN_MOVED_TO))
		queue_push(w, EV_CREATE, isdir, path);
	if (m & IN_MODIFY)
		queue_push(w, EV_WRITE, isdir, path);
	if (m & IN_DELETE)
		queue_push(w, EV_REMOVE, isdir, path);
	if (m & IN_MOVED_FROM)
		queue_push(w, EV_RENAME, isdir, path);
	if (m & IN_ATTRIB)
		queue_push(w, EV_CHMOD, isdir, path);
	if (!w->recursive || !isdir)
		return;
	if (m & IN_MOVED_FROM)
		drop_tree(w, path);
	if (m & (IN_CREATE | IN_MOVED_TO)) {
		/* watch it, and what is in it already; made (not moved) just now: announce that */
		if (dir_add(w, path, 0) == 0 && add_tree(w, path, !!(m & IN_CREATE)) == 0)
			return;
		if (errno == ENOSPC || errno == ENOMEM) {
			struct wdir *r = dir_find(w, w->root_wd);
			queue_push(w, EV_OVERFLOW, 1, r ? r->path : path);
			w->lost = 1;
		}
	}
}

static struct watch *alive(void *ctx, int fd)
{
	for (int i = 0; i < MAX_STREAMS; i++)
		if (g_streams[i] == ctx && g_streams[i]->kind == K_WATCH &&
		    ((struct watch *)ctx)->fd == fd)
			return ctx;
	return NULL;
}

static void on_inotify(void *ctx, int fd, short rev)
{
	(void)rev;
	struct watch *w = alive(ctx, fd);
	char buf[64 * 1024] __attribute__((aligned(__alignof__(struct inotify_event))));
	if (!w)
		return;
	if (w->user && fs_become(w->user) < 0) {
		/* never watch on as root: the watch ends (END once its queue is sent) */
		logmsg("watch %s: cannot act as its user: %s", w->root, strerror(errno));
		w->ended = 1;
		return;
	}
	for (int rounds = 0; rounds < 4 && !w->ended; rounds++) {
		ssize_t n = read(fd, buf, sizeof buf);
		if (n <= 0)
			break;
		for (char *p = buf; p < buf + n;) {
			const struct inotify_event *ev = (const struct inotify_event *)p;
			on_event(w, ev);
			p += sizeof *ev + ev->len;
		}
	}
	if (w->user)
		fs_restore();
}

/* ---- requests ---- */

static void watch_free(struct watch *w)
{
	while (w->qlen)
		queue_pop(w);
	while (w->ndirs)
		dir_forget(w, w->dirs[w->ndirs - 1].wd);
	free(w->dirs);
	if (w->fd >= 0)
		close(w->fd);
	stream_del(&w->s);
	free(w->root);
	free(w->user);
	free(w);
}

void watch_start(const struct msg *m)
{
	char *path = NULL;
	int64_t recursive;
	struct watch *w = NULL;
	int r = field_cstr(m, F_PATH, "PATH", &path);
	if (r == 0)
		send_error(m->stream, EINVAL, "missing PATH");
	if (r <= 0)
		return;
	if (field_i64(m, F_RECURSIVE, 0, &recursive) < 0) {
		send_error(m->stream, EINVAL, "RECURSIVE must be an i64");
		goto out;
	}
	if (path[0] != '/') {
		send_error(m->stream, EINVAL, "PATH must be absolute");
		goto out;
	}
	for (size_t n = strlen(path); n > 1 && path[n - 1] == '/'; n--)
		path[n - 1] = 0;
	if (watches_count() >= WATCHES_MAX) {
		send_error(m->stream, ENOSPC, "too many watches (max %d)", WATCHES_MAX);
		goto out;
	}
	if (!(w = calloc(1, sizeof *w)) || !(w->root = strdup(path))) {
		free(w);
		w = NULL;
		send_error(m->stream, ENOMEM, "out of memory");
		goto out;
	}
	if (g_fs_user && !(w->user = malloc(sizeof *w->user))) {
		free(w->root);
		free(w);
		w = NULL;
		send_error(m->stream, ENOMEM, "out of memory");
		goto out;
	}
	if (g_fs_user)
		*w->user = *g_fs_user;
	w->s = (struct stream){ .id = m->stream, .kind = K_WATCH };
	w->fd = -1;
	w->recursive = recursive == 1;
	if (!flow_init(&w->s, m)) {
		free(w->user);
		free(w->root);
		free(w);
		w = NULL;
		goto out;
	}
	if (stream_add(&w->s) < 0) {
		free(w->user);
		free(w->root);
		free(w);
		w = NULL;
		goto out;
	}
	if ((w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) < 0) {
		send_error(m->stream, errno, "inotify: %s", strerror(errno));
		goto fail;
	}
	if (dir_add(w, path, 1) < 0) {
		send_error(m->stream, errno, "watch %s: %s", path, strerror(errno));
		goto fail;
	}
	w->root_wd = w->dirs[0].wd;
	if (w->recursive && add_tree(w, path, 0) < 0) {
		send_error(m->stream, errno, "watch %s: %s (at most %d directories)", path,
			   strerror(errno), DIRS_MAX);
		goto fail;
	}
	fb_begin(RP_OK, m->stream);
	if (w->s.flow)
		fb_i64(F_WINDOW, w->s.credit); /* says: this agent honours the window */
	fb_end();
	free(path);
	return;
fail:
	watch_free(w);
out:
	free(path);
}

void watch_cancel(struct stream *s)
{
	watch_free((struct watch *)s);
}

/* Sends what credit and the port allow; 1 when the watch is over (END sent). */
static int flush(struct watch *w)
{
	while (w->qlen && outq_has_room()) {
		struct event *e = &w->q[w->qhead];
		size_t len = strlen(e->path), cost = len + EVENT_COST;
		if (flow_allow(&w->s, cost) < cost)
			return 0; /* a WINDOW from the host wakes us */
		fb_begin(RP_WATCH_EVENT, w->s.id);
		fb_bytes(F_EVENT, EV_NAMES[e->type], strlen(EV_NAMES[e->type]));
		fb_bytes(F_PATH, e->path, len);
		fb_i64(F_FILE_TYPE, e->isdir ? 2 : 1);
		fb_end();
		flow_used(&w->s, cost);
		queue_pop(w);
	}
	if (!w->ended || w->qlen)
		return 0;
	send_simple(RP_END, w->s.id);
	return 1;
}

void watch_poll(int64_t now)
{
	(void)now;
	for (int i = 0; i < MAX_STREAMS; i++) {
		struct watch *w = (struct watch *)g_streams[i];
		if (!w || w->s.kind != K_WATCH)
			continue;
		if (flush(w)) {
			watch_free(w);
			continue;
		}
		if (!w->ended)
			poll_add(w->fd, POLLIN, on_inotify, w);
	}
}
