/*
 * The image's configuration, read once at start from the config dir (default /.forkd,
 * --config-dir for host tests):
 *   env     the image's Env: KEY=VALUE entries, each ended by a NUL byte
 *   config  lines key=value: cwd= (default cwd), user= (default user SPEC); others ignored
 * Both are optional and bounded (a huge or hostile file is cut at the bound, logged). From them:
 * the environment and cwd every command and kernel starts with.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"

#define ENV_FILE_MAX (1024 * 1024)
#define ENV_ENTRIES_MAX 4096
#define CONFIG_FILE_MAX (64 * 1024)
#define VALUE_MAX 4096

static const char *const env_defaults[] = {
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/root",
	"LANG=C.UTF-8",
	NULL,
};

static struct {
	char **env;  /* the image's Env entries (malloc'd, NULL-terminated), or NULL */
	char *cwd;   /* default cwd, or NULL */
	char *user;  /* default user SPEC, or NULL (root) */
} cfg;

char *read_bounded(const char *path, size_t max, size_t *len, int *cut)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
		return NULL;
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return NULL;
	}
	/* sized by the file, not the bound: every page the agent dirties is copied into each fork */
	size_t cap = st.st_size >= 0 && (uint64_t)st.st_size < max ? (size_t)st.st_size : max;
	char *buf = malloc(cap + 1);
	size_t got = 0;
	ssize_t n = 1;
	while (buf && got < cap && (n = read(fd, buf + got, cap - got)) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			break;
		got += (size_t)n;
	}
	char extra;
	int more = buf && got == cap && read(fd, &extra, 1) == 1;
	if (more)
		logmsg("%s: larger than %zu bytes; the rest is ignored", path, cap);
	if (cut)
		*cut = more;
	close(fd);
	if (!buf)
		return NULL;
	buf[got] = 0;
	if (len)
		*len = got;
	return buf;
}

/* Set K=V in a malloc'd env vector, replacing an existing K. Takes ownership of kv; frees the
 * vector and returns NULL on ENOMEM. */
char **env_set(char **env, char *kv)
{
	size_t klen = strchr(kv, '=') - kv + 1, n = 0;
	for (; env[n]; n++)
		if (!strncmp(env[n], kv, klen)) {
			free(env[n]);
			env[n] = kv;
			return env;
		}
	char **e = realloc(env, (n + 2) * sizeof *e);
	if (!e) {
		free(kv);
		free_strv(env);
		return NULL;
	}
	e[n] = kv;
	e[n + 1] = NULL;
	return e;
}

const char *env_get(char *const *env, const char *key)
{
	size_t k = strlen(key);
	for (; env && *env; env++)
		if (!strncmp(*env, key, k) && (*env)[k] == '=')
			return *env + k + 1;
	return NULL;
}

static char **set_pair(char **env, const char *k, const char *v)
{
	char *kv;
	if (!env)
		return NULL;
	if (asprintf(&kv, "%s=%s", k, v) < 0) {
		free_strv(env);
		return NULL;
	}
	return env_set(env, kv);
}

static void load_env(const char *path)
{
	size_t len;
	int cut;
	char *buf = read_bounded(path, ENV_FILE_MAX, &len, &cut);
	if (!buf)
		return;
	char **env = calloc(1, sizeof *env);
	size_t count = 0, bad = 0;
	for (size_t off = 0; env && off < len;) {
		char *kv = buf + off;
		size_t n = strnlen(kv, len - off);
		off += n + 1;
		if (!n || (off > len && cut))
			continue; /* empty, or cut at the bound (a last entry without its NUL is taken) */
		if (kv[0] == '=' || !strchr(kv, '=')) {
			bad++;
			continue;
		}
		if (count == ENV_ENTRIES_MAX) {
			logmsg("%s: more than %d entries; the rest is ignored", path, ENV_ENTRIES_MAX);
			break;
		}
		char *d = strdup(kv);
		if (!d || !(env = env_set(env, d)))
			break;
		count++;
	}
	if (bad)
		logmsg("%s: %zu entries without K=V ignored", path, bad);
	if (!env)
		logmsg("%s: out of memory", path);
	cfg.env = env;
	free(buf);
}

static void load_config(const char *path)
{
	char *buf = read_bounded(path, CONFIG_FILE_MAX, NULL, NULL), *save = NULL;
	for (char *line = buf ? strtok_r(buf, "\n", &save) : NULL; line;
	     line = strtok_r(NULL, "\n", &save)) {
		size_t n = strlen(line);
		if (n && line[n - 1] == '\r')
			line[--n] = 0;
		char *eq = strchr(line, '=');
		if (!eq || eq[1] == 0 || strlen(eq + 1) > VALUE_MAX)
			continue;
		*eq = 0;
		char **slot = !strcmp(line, "cwd") ? &cfg.cwd : !strcmp(line, "user") ? &cfg.user : NULL;
		if (slot) {
			free(*slot);
			*slot = strdup(eq + 1);
		}
	}
	free(buf);
	if (cfg.cwd && cfg.cwd[0] != '/') {
		logmsg("%s: cwd %s is not absolute; ignored", path, cfg.cwd);
		free(cfg.cwd);
		cfg.cwd = NULL;
	}
}

void config_load(void)
{
	char path[PATH_MAX];
	snprintf(path, sizeof path, "%s/env", g_config_dir);
	load_env(path);
	snprintf(path, sizeof path, "%s/config", g_config_dir);
	load_config(path);
	struct user u;
	char msg[320];
	if (cfg.user && user_resolve(cfg.user, &u, msg, sizeof msg) < 0)
		logmsg("default user: %s", msg); /* reported again by every exec that needs it */
}

const char *config_user(void)
{
	return cfg.user;
}

char **base_env(const struct user *u, int explicit_user)
{
	size_t n = sizeof env_defaults / sizeof *env_defaults;
	char **env = calloc(n, sizeof *env);
	for (size_t i = 0; env && env_defaults[i]; i++)
		if (!(env[i] = strdup(env_defaults[i]))) {
			free_strv(env);
			return NULL;
		}
	for (char **p = cfg.env; env && p && *p; p++) {
		char *d = strdup(*p);
		env = d ? env_set(env, d) : (free_strv(env), NULL);
	}
	if (!u)
		return env;
	/* The image's Env describes its default user: an explicit user gets its own HOME. */
	if (explicit_user || !env_get(cfg.env, "HOME"))
		env = set_pair(env, "HOME", u->home);
	if (u->name[0] && (explicit_user || !env_get(cfg.env, "USER")))
		env = set_pair(env, "USER", u->name);
	if (u->name[0] && (explicit_user || !env_get(cfg.env, "LOGNAME")))
		env = set_pair(env, "LOGNAME", u->name);
	return env;
}

/* The library that gives OpenSSL its random bytes from the kernel (guest/rand/forkd-rand.c). */
#define RAND_PRELOAD "/.forkd/forkd-rand.so"

char **env_preload_rand(char **env)
{
	if (!env || access(RAND_PRELOAD, R_OK) != 0)
		return env;
	const char *had = env_get(env, "LD_PRELOAD");
	if (had && *had) {
		char v[1024];
		if (snprintf(v, sizeof v, "%s:%s", RAND_PRELOAD, had) >= (int)sizeof v)
			return env; /* an image's preload list that long is kept as it is */
		return set_pair(env, "LD_PRELOAD", v);
	}
	return set_pair(env, "LD_PRELOAD", RAND_PRELOAD);
}

const char *default_cwd(const struct user *u)
{
	struct stat st;
	if (cfg.cwd && stat(cfg.cwd, &st) == 0 && S_ISDIR(st.st_mode))
		return cfg.cwd;
	if (u && stat(u->home, &st) == 0 && S_ISDIR(st.st_mode))
		return u->home;
	return "/";
}
