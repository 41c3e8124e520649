/*
 * Users of the image: a user SPEC (`name`, `uid`, `name:group`, `uid:gid`, like Docker's USER)
 * resolved against the image's own /etc/passwd and /etc/group (the agent is static: no NSS),
 * the switch to that user in a child before it execs, and the agent's own file-system
 * credentials switched to a user's around a file request (setfsuid: the kernel checks that
 * request's opens, creations and removals as the user's, and what it makes is the user's).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <unistd.h>

#include "agent.h"

#define DB_MAX (4 * 1024 * 1024) /* bytes of passwd/group read; the rest is ignored (logged) */

/* Strict decimal id (no sign, no spaces, below 2^32 - 1). 1 ok. */
static int parse_id(const char *s, size_t n, unsigned *out)
{
	unsigned long long v = 0;
	if (!n || n > 10)
		return 0;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return 0;
		v = v * 10 + (unsigned)(s[i] - '0');
	}
	if (v >= 0xffffffffULL)
		return 0;
	*out = (unsigned)v;
	return 1;
}

/* Split a line into at most max ':'-separated fields in place; returns the count. */
static int split(char *line, char **f, int max)
{
	int n = 0;
	f[n++] = line;
	for (char *p = line; *p && n < max; p++)
		if (*p == ':') {
			*p = 0;
			f[n++] = p + 1;
		}
	return n;
}

static char *read_db(const char *name)
{
	char path[PATH_MAX];
	snprintf(path, sizeof path, "%.3000s/%s", g_etc_dir, name);
	return read_bounded(path, DB_MAX, NULL, NULL);
}

/* Finds the passwd entry whose name is `key` (by_uid 0) or whose uid is `uid` (by_uid 1). */
static int passwd_find(const char *key, unsigned uid, int by_uid, struct user *u)
{
	char *db = read_db("passwd"), *save = NULL;
	int found = 0;
	for (char *line = db ? strtok_r(db, "\n", &save) : NULL; line && !found;
	     line = strtok_r(NULL, "\n", &save)) {
		char *f[7];
		unsigned id, gid;
		if (split(line, f, 7) < 7 || !parse_id(f[2], strlen(f[2]), &id) ||
		    !parse_id(f[3], strlen(f[3]), &gid))
			continue;
		if (by_uid ? id != uid : strcmp(f[0], key) != 0)
			continue;
		u->uid = id;
		u->gid = gid;
		snprintf(u->name, sizeof u->name, "%s", f[0]);
		snprintf(u->home, sizeof u->home, "%s", f[5][0] ? f[5] : "/");
		found = 1;
	}
	free(db);
	return found;
}

static void add_group(struct user *u, gid_t g)
{
	for (int i = 0; i < u->ngroups; i++)
		if (u->groups[i] == g)
			return;
	if (u->ngroups < USER_GROUPS_MAX)
		u->groups[u->ngroups++] = g;
}

/* With `group` (not NULL): find that group's gid (by name, else numeric). Without: add the
 * groups that list u->name as a member to u->groups. Returns 0, or -1 if `group` is unknown. */
static int group_scan(struct user *u, const char *group, gid_t *gid)
{
	char *db = read_db("group"), *save = NULL;
	int found = 0;
	for (char *line = db ? strtok_r(db, "\n", &save) : NULL; line && !found;
	     line = strtok_r(NULL, "\n", &save)) {
		char *f[4];
		unsigned id;
		if (split(line, f, 4) < 4 || !parse_id(f[2], strlen(f[2]), &id))
			continue;
		if (group) {
			if (!strcmp(f[0], group)) {
				*gid = id;
				found = 1;
			}
			continue;
		}
		if (!u->name[0])
			break;
		char *s2 = NULL;
		for (char *m = strtok_r(f[3], ",", &s2); m; m = strtok_r(NULL, ",", &s2))
			if (!strcmp(m, u->name))
				add_group(u, id);
	}
	free(db);
	if (group && !found) {
		unsigned id;
		if (!parse_id(group, strlen(group), &id))
			return -1;
		*gid = id;
	}
	return 0;
}

int user_resolve(const char *spec, struct user *u, char *msg, size_t msglen)
{
	memset(u, 0, sizeof *u);
	if (!spec || !*spec)
		spec = "root";
	const char *colon = strchr(spec, ':');
	size_t ulen = colon ? (size_t)(colon - spec) : strlen(spec);
	char name[256];
	if (!ulen || ulen >= sizeof name || (colon && !colon[1])) {
		snprintf(msg, msglen, "bad user '%.200s' (want name, uid, name:group or uid:gid)", spec);
		errno = EINVAL;
		return -1;
	}
	memcpy(name, spec, ulen);
	name[ulen] = 0;
	unsigned id;
	int numeric = parse_id(name, ulen, &id);
	if (!passwd_find(name, 0, 0, u) && !(numeric && passwd_find(NULL, id, 1, u))) {
		if (numeric) { /* a uid the image does not list: Docker runs it with gid 0 and home / */
			u->uid = id;
			snprintf(u->home, sizeof u->home, "%s", id == 0 ? "/root" : "/");
			if (id == 0)
				snprintf(u->name, sizeof u->name, "root");
		} else if (!strcmp(name, "root")) { /* root always works, even without /etc/passwd */
			snprintf(u->name, sizeof u->name, "root");
			snprintf(u->home, sizeof u->home, "/root");
		} else {
			snprintf(msg, msglen, "no user '%.200s' in the image's %.60s/passwd", name, g_etc_dir);
			errno = ENOENT;
			return -1;
		}
	}
	if (colon) {
		gid_t gid;
		if (group_scan(u, colon + 1, &gid) < 0) {
			snprintf(msg, msglen, "no group '%.200s' in the image's %.60s/group", colon + 1, g_etc_dir);
			errno = ENOENT;
			return -1;
		}
		u->gid = gid;
		u->ngroups = 0;
		add_group(u, gid);
	} else {
		u->ngroups = 0;
		add_group(u, u->gid);
		group_scan(u, NULL, NULL);
	}
	return 0;
}

int user_become(const struct user *u)
{
	if (geteuid() != 0) { /* host tests as an ordinary user: only "yourself" works */
		if (u->uid == geteuid() && u->gid == getegid())
			return 0;
		errno = EPERM;
		return -1;
	}
	if (setgroups((size_t)u->ngroups, u->groups) < 0 || setgid(u->gid) < 0 || setuid(u->uid) < 0)
		return -1;
	return 0;
}

/* The agent's own supplementary groups, saved at the first switch (-1: not yet). */
static gid_t g_own_groups[USER_GROUPS_MAX];
static int g_own_ngroups = -1;

int fs_become(const struct user *u)
{
	if (geteuid() != 0) { /* host tests as an ordinary user: only "yourself" works */
		if (u->uid == geteuid() && u->gid == getegid())
			return 0;
		errno = EPERM;
		return -1;
	}
	if (g_own_ngroups < 0) {
		int n = getgroups(USER_GROUPS_MAX, g_own_groups);
		g_own_ngroups = n < 0 ? 0 : n;
	}
	if (setgroups((size_t)u->ngroups, u->groups) < 0)
		return -1;
	setfsgid(u->gid);
	setfsuid(u->uid);
	/* setfsuid reports no error: an invalid id asks for the current one */
	if ((uid_t)setfsuid((uid_t)-1) != u->uid || (gid_t)setfsgid((gid_t)-1) != u->gid) {
		fs_restore();
		errno = EPERM;
		return -1;
	}
	return 0;
}

void fs_restore(void)
{
	if (geteuid() != 0)
		return;
	/* back to fsuid 0: the kernel gives the file-system capabilities back to the effective set */
	setfsuid(0);
	setfsgid(getegid());
	if (setgroups((size_t)(g_own_ngroups > 0 ? g_own_ngroups : 0), g_own_groups) < 0)
		logmsg("fs_restore: setgroups: %s", strerror(errno));
}
