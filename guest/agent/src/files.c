/* File operations: READ, WRITE_*, LIST, STAT, MKDIR, REMOVE, RENAME; each as the request's
 * USER when it names one (file_request), else as the agent itself (root). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"

struct rfile { /* READ in progress: one chunk per loop iteration */
	struct stream s;
	int fd;
	int64_t size;
	int echoed; /* the first DATA said WINDOW */
};

struct wfile { /* WRITE_OPEN .. WRITE_END */
	struct stream s;
	int fd;        /* temp file, -1 after a write error */
	int err;       /* first errno, reported at WRITE_END */
	int64_t size;
	char *tmp, *path;
	struct user *user; /* WRITE_OPEN's USER (NULL: the agent): the rename is done as it too */
};

const struct user *g_fs_user;

static void file_read(const struct msg *m);
static void file_write_open(const struct msg *m);
static void file_list(const struct msg *m);
static void file_stat(const struct msg *m);
static void file_mkdir(const struct msg *m);
static void file_remove(const struct msg *m);
static void file_rename(const struct msg *m);

void file_request(const struct msg *m)
{
	char *spec = NULL, msg[512];
	struct user u;
	int r = field_cstr(m, F_USER, "USER", &spec);
	if (r < 0)
		return;
	if (r > 0) {
		if (user_resolve(spec, &u, msg, sizeof msg) < 0) {
			send_error(m->stream, errno, "%s", msg);
			free(spec);
			return;
		}
		if (fs_become(&u) < 0) {
			send_error(m->stream, errno, "cannot act as user '%.200s': %s", spec, strerror(errno));
			free(spec);
			return;
		}
		free(spec);
		g_fs_user = &u;
	}
	switch (m->type) {
	case T_READ: file_read(m); break;
	case T_WRITE_OPEN: file_write_open(m); break;
	case T_LIST: file_list(m); break;
	case T_STAT: file_stat(m); break;
	case T_MKDIR: file_mkdir(m); break;
	case T_REMOVE: file_remove(m); break;
	case T_RENAME: file_rename(m); break;
	case T_WATCH: watch_start(m); break;
	}
	if (g_fs_user) {
		g_fs_user = NULL;
		fs_restore();
	}
}

/* PATH (or PATH2) field, required: 1 ok, 0 error sent. */
static int get_path(const struct msg *m, uint8_t tag, char **out)
{
	int r = field_cstr(m, tag, tag == F_PATH ? "PATH" : "PATH2", out);
	if (r == 0)
		send_error(m->stream, EINVAL, "missing %s", tag == F_PATH ? "PATH" : "PATH2");
	return r > 0;
}

/* i64 field with a default: 1 ok, 0 error sent. */
static int get_i64(const struct msg *m, uint8_t tag, int64_t dflt, int64_t *v)
{
	if (field_i64(m, tag, dflt, v) < 0) {
		send_error(m->stream, EINVAL, "field %u must be an i64", tag);
		return 0;
	}
	return 1;
}

static void fail(const struct msg *m, const char *op, const char *path)
{
	send_error(m->stream, errno, "%s %s: %s", op, path, strerror(errno));
}

int mkdir_p(const char *path, mode_t mode)
{
	char *p = strdup(path);
	if (!p)
		return -1;
	for (char *s = p + 1;; s++) {
		if (*s && *s != '/')
			continue;
		char c = *s;
		*s = 0;
		struct stat st;
		if (mkdir(p, mode) < 0 && (errno != EEXIST || stat(p, &st) < 0 || !S_ISDIR(st.st_mode))) {
			if (errno == EEXIST)
				errno = ENOTDIR;
			free(p);
			return -1;
		}
		if (!c)
			break;
		*s = c;
	}
	free(p);
	return 0;
}

static int64_t mtime_ns(const struct stat *st)
{
	return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

static int file_type(mode_t m)
{
	return S_ISREG(m) ? 1 : S_ISDIR(m) ? 2 : S_ISLNK(m) ? 3 : 4;
}

static void stat_fields(const struct stat *st)
{
	fb_i64(F_FILE_TYPE, file_type(st->st_mode));
	fb_i64(F_SIZE, st->st_size);
	fb_i64(F_MODE, st->st_mode & 07777);
	fb_i64(F_MTIME_NS, mtime_ns(st));
}

/* ---- READ ---- */

static void file_read(const struct msg *m)
{
	char *path;
	struct stat st;
	if (!get_path(m, F_PATH, &path))
		return;
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
	if (fd < 0 || fstat(fd, &st) < 0) {
		fail(m, "open", path);
	} else if (!S_ISREG(st.st_mode)) {
		errno = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
		fail(m, "read", path);
	} else {
		struct rfile *r = calloc(1, sizeof *r);
		if (!r) {
			send_error(m->stream, ENOMEM, "out of memory");
		} else {
			r->s = (struct stream){ .id = m->stream, .kind = K_READ };
			r->fd = fd;
			if (flow_init(&r->s, m) && stream_add(&r->s) == 0)
				fd = -1; /* owned by the stream now */
			else
				free(r);
		}
	}
	if (fd >= 0)
		close(fd);
	free(path);
}

/* Send one chunk; returns 1 when the read is finished. */
static int read_chunk(struct rfile *r)
{
	size_t max = flow_allow(&r->s, CHUNK);
	fb_begin(RP_DATA, r->s.id);
	if (r->s.flow && !r->echoed)
		fb_i64(F_WINDOW, r->s.credit); /* says: this agent honours the window */
	uint8_t *p = fb_reserve(F_DATA, max);
	if (!p) {
		fb_abort();
		return 0;
	}
	ssize_t n = read(r->fd, p, max);
	if (n > 0) {
		fb_commit((size_t)n);
		fb_end();
		flow_used(&r->s, (size_t)n);
		r->echoed = 1;
		r->size += n;
		return 0;
	}
	fb_abort();
	if (n < 0 && errno == EINTR)
		return 0;
	if (n < 0) {
		send_error(r->s.id, errno, "read: %s", strerror(errno));
	} else {
		fb_begin(RP_END, r->s.id);
		fb_i64(F_SIZE, r->size);
		fb_end();
	}
	close(r->fd);
	return 1;
}

void files_poll(int64_t now)
{
	for (int i = 0; i < MAX_STREAMS; i++) {
		struct rfile *r = (struct rfile *)g_streams[i];
		if (!r || r->s.kind != K_READ)
			continue;
		if (!outq_has_room())
			return; /* the port's POLLOUT wakes us */
		if (!flow_allow(&r->s, 1))
			continue; /* a WINDOW from the host wakes us */
		if (read_chunk(r)) {
			stream_del(&r->s);
			free(r);
		} else {
			want_timeout(now); /* more to do: do not block in poll */
		}
	}
}

void file_read_cancel(struct stream *s)
{
	struct rfile *r = (struct rfile *)s;
	close(r->fd);
	stream_del(&r->s);
	free(r);
}

/* ---- WRITE ---- */

static void file_write_open(const struct msg *m)
{
	char *path, *tmp = NULL;
	int64_t mode, flags;
	struct wfile *w = NULL;
	int fd = -1;
	if (!get_i64(m, F_MODE, 0644, &mode) || !get_i64(m, F_FLAGS, 0, &flags) ||
	    !get_path(m, F_PATH, &path))
		return;
	char *dcopy = strdup(path), *bcopy = strdup(path);
	if (!dcopy || !bcopy || !(w = calloc(1, sizeof *w))) {
		send_error(m->stream, ENOMEM, "out of memory");
		goto out;
	}
	const char *dir = dirname(dcopy), *base = basename(bcopy);
	if (!*base || !strcmp(base, "/") || !strcmp(base, ".") || !strcmp(base, "..")) {
		send_error(m->stream, EINVAL, "bad file name %s", path);
		goto out;
	}
	if ((flags & 1) && mkdir_p(dir, 0755) < 0) {
		fail(m, "mkdir", dir);
		goto out;
	}
	if (asprintf(&tmp, "%s/.%s.forkd-XXXXXX", dir, base) < 0) {
		tmp = NULL;
		send_error(m->stream, ENOMEM, "out of memory");
		goto out;
	}
	if ((fd = mkostemp(tmp, O_CLOEXEC)) < 0) {
		fail(m, "create", path);
		goto out;
	}
	if (fchmod(fd, (mode_t)mode & 07777) < 0) {
		fail(m, "chmod", path);
		goto out;
	}
	if (g_fs_user) {
		if (!(w->user = malloc(sizeof *w->user))) {
			send_error(m->stream, ENOMEM, "out of memory");
			goto out;
		}
		*w->user = *g_fs_user;
	}
	w->s = (struct stream){ .id = m->stream, .kind = K_WRITE };
	w->fd = fd;
	w->tmp = tmp;
	w->path = path;
	if (stream_add(&w->s) == 0) {
		free(dcopy);
		free(bcopy);
		return;
	}
out:
	if (fd >= 0) {
		close(fd);
		unlink(tmp);
	}
	if (w)
		free(w->user);
	free(w);
	free(tmp);
	free(path);
	free(dcopy);
	free(bcopy);
}

static void wfile_free(struct wfile *w)
{
	if (w->fd >= 0) {
		close(w->fd);
		unlink(w->tmp);
	}
	stream_del(&w->s);
	free(w->tmp);
	free(w->path);
	free(w->user);
	free(w);
}

void file_write_cancel(struct stream *s)
{
	wfile_free((struct wfile *)s);
}

void file_write_data(const struct msg *m)
{
	struct wfile *w = (struct wfile *)stream_find(m->stream, K_WRITE);
	const uint8_t *v;
	uint32_t len;
	if (!w || w->err || !field_get(m, F_DATA, &v, &len))
		return;
	while (len) {
		ssize_t n = write(w->fd, v, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			w->err = n < 0 ? errno : EIO;
			close(w->fd);
			unlink(w->tmp);
			w->fd = -1;
			return;
		}
		v += n;
		len -= (uint32_t)n;
		w->size += n;
	}
}

void file_write_end(const struct msg *m)
{
	struct wfile *w = (struct wfile *)stream_find(m->stream, K_WRITE);
	if (!w)
		return; /* WRITE_OPEN failed and was answered already */
	if (w->err) {
		errno = w->err;
		fail(m, "write", w->path);
	} else {
		int r = fsync(w->fd), e = errno;
		if (close(w->fd) < 0 && r == 0) {
			r = -1;
			e = errno;
		}
		w->fd = -1;
		const char *op = "fsync";
		if (r == 0) {
			/* as the user who opened it: replacing w->path needs its own right to */
			op = "rename";
			if (w->user && fs_become(w->user) < 0) {
				r = -1;
				e = errno;
			} else {
				if ((r = rename(w->tmp, w->path)) < 0)
					e = errno;
				if (w->user)
					fs_restore();
			}
		}
		if (r < 0) {
			errno = e;
			fail(m, op, w->path);
			unlink(w->tmp);
		} else {
			fb_begin(RP_OK, m->stream);
			fb_i64(F_SIZE, w->size);
			fb_end();
		}
	}
	wfile_free(w);
}

/* ---- LIST / STAT ---- */

static int cmp_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void file_list(const struct msg *m)
{
	char *path, **names = NULL;
	size_t n = 0, cap = 0;
	if (!get_path(m, F_PATH, &path))
		return;
	DIR *d = opendir(path);
	if (!d) {
		fail(m, "opendir", path);
		free(path);
		return;
	}
	struct dirent *de;
	errno = 0;
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (n == cap) {
			char **nn = realloc(names, (cap = cap ? cap * 2 : 64) * sizeof *nn);
			if (!nn)
				goto nomem;
			names = nn;
		}
		if (!(names[n] = strdup(de->d_name)))
			goto nomem;
		n++;
	}
	qsort(names, n, sizeof *names, cmp_name);
	fb_begin(RP_OK, m->stream);
	for (size_t i = 0; i < n; i++) {
		struct stat st;
		if (fstatat(dirfd(d), names[i], &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue; /* vanished meanwhile */
		fb_bytes(F_NAME, names[i], strlen(names[i]));
		stat_fields(&st);
		if (fb_size() > MAX_FRAME) {
			fb_abort();
			send_error(m->stream, E2BIG, "directory %s too large for one reply", path);
			goto out;
		}
	}
	fb_end();
	goto out;
nomem:
	send_error(m->stream, ENOMEM, "out of memory");
out:
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	closedir(d);
	free(path);
}

static void file_stat(const struct msg *m)
{
	char *path;
	struct stat st;
	if (!get_path(m, F_PATH, &path))
		return;
	if (lstat(path, &st) < 0) {
		fail(m, "stat", path);
	} else {
		fb_begin(RP_OK, m->stream);
		stat_fields(&st);
		fb_end();
	}
	free(path);
}

/* ---- MKDIR / REMOVE / RENAME ---- */

static void file_mkdir(const struct msg *m)
{
	char *path;
	int64_t mode, flags;
	if (!get_i64(m, F_MODE, 0755, &mode) || !get_i64(m, F_FLAGS, 0, &flags) ||
	    !get_path(m, F_PATH, &path))
		return;
	if (((flags & 1) ? mkdir_p(path, (mode_t)mode & 07777) : mkdir(path, (mode_t)mode & 07777)) < 0)
		fail(m, "mkdir", path);
	else
		send_simple(RP_OK, m->stream);
	free(path);
}

/* Remove name under dirfd; directories recursively. Never follows symlinks: a symlink is
 * unlinked, and directories are opened with O_NOFOLLOW relative to their parent's fd. */
static int remove_at(int dirfd, const char *name)
{
	if (unlinkat(dirfd, name, 0) == 0)
		return 0;
	int e = errno;
	if (e != EISDIR && e != EPERM)
		return -1;
	int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOTDIR)
			errno = e; /* a real EPERM on a non-directory */
		return -1;
	}
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -1;
	}
	/* deleting while iterating may skip entries on some file systems: repeat until a
	 * pass finds nothing */
	for (int found = 1; found;) {
		struct dirent *de;
		found = 0;
		rewinddir(d);
		while ((de = readdir(d))) {
			if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
				continue;
			if (remove_at(fd, de->d_name) < 0) {
				int e = errno;
				closedir(d);
				errno = e;
				return -1;
			}
			found = 1;
		}
	}
	closedir(d);
	return unlinkat(dirfd, name, AT_REMOVEDIR);
}

static void file_remove(const struct msg *m)
{
	char *path;
	int64_t flags;
	if (!get_i64(m, F_FLAGS, 0, &flags) || !get_path(m, F_PATH, &path))
		return;
	int r;
	if (flags & 1)
		r = remove_at(AT_FDCWD, path);
	else if ((r = unlink(path)) < 0 && errno == EISDIR)
		r = rmdir(path);
	if (r < 0)
		fail(m, "remove", path);
	else
		send_simple(RP_OK, m->stream);
	free(path);
}

static void file_rename(const struct msg *m)
{
	char *a, *b;
	if (!get_path(m, F_PATH, &a))
		return;
	if (get_path(m, F_PATH2, &b)) {
		if (rename(a, b) < 0)
			fail(m, "rename", a);
		else
			send_simple(RP_OK, m->stream);
		free(b);
	}
	free(a);
}
