/* forkd guest agent: shared definitions. Protocol: docs/agent-protocol.md */
#ifndef FORKD_AGENT_H
#define FORKD_AGENT_H

#include <stddef.h>
#include <stdint.h>
#include <poll.h>
#include <sys/types.h>

#define PROTO_VERSION 1
#include <limits.h>
#define MAX_FRAME (1024 * 1024 + 64) /* bytes after the length word */
#define MAX_STREAMS 256              /* long-lived requests in flight */
#define CHUNK (64 * 1024)            /* DATA/STDOUT/STDERR payload size */
#define OUTQ_MAX (8 * 1024 * 1024)   /* output queue bound for bulk producers */
#define STDIN_MAX (8 * 1024 * 1024)  /* pending stdin bytes before port reads pause */

/* Request types (host to guest). */
enum {
	T_PING = 0x01, T_IDENTITY = 0x02, T_SYNC = 0x03, T_WINDOW = 0x04, T_CANCEL = 0x05,
	T_STREAMS = 0x06, /* a new host takes over: what is in flight (handover.c) */
	T_EXEC = 0x10, T_STDIN = 0x11, T_SIGNAL = 0x12, T_RESIZE = 0x13,
	T_READ = 0x20, T_WRITE_OPEN = 0x21, T_WRITE_DATA = 0x22, T_WRITE_END = 0x23,
	T_LIST = 0x24, T_STAT = 0x25, T_MKDIR = 0x26, T_REMOVE = 0x27, T_RENAME = 0x28, T_WATCH = 0x29,
	T_EVAL = 0x30, T_EVAL_INTERRUPT = 0x31,
};

/* Reply types (guest to host). */
enum {
	RP_OK = 0x81, RP_DATA = 0x82, RP_END = 0x83, RP_ERROR = 0x8F,
	RP_STARTED = 0x90, RP_STDOUT = 0x91, RP_STDERR = 0x92, RP_EXIT = 0x93, RP_WATCH_EVENT = 0x94,
	RP_EVAL_STDOUT = 0x96, RP_EVAL_STDERR = 0x97, /* a streamed cell's output {DATA} */
};

/* Field tags. */
enum {
	F_ARG = 1, F_ENV = 2, F_CWD = 3, F_SHELL = 4, F_TIMEOUT_MS = 5, F_STDIN = 6,
	F_PATH = 7, F_PATH2 = 8, F_MODE = 9, F_FLAGS = 10, F_DATA = 11, F_CODE = 12,
	F_SEED = 13, F_TIME_NS = 14, F_HOSTNAME = 15, F_SANDBOX_ID = 16, F_SIGNAL = 17, F_PIDS_MAX = 18,
	F_NET_UP = 19, F_WINDOW = 20, F_USER = 21, F_LANGUAGE = 22, F_PTY_ROWS = 23, F_PTY_COLS = 24,
	F_RECURSIVE = 25, F_EVENT = 26,
	F_EVAL_OPTS = 27, /* EVAL: one line of JSON passed to the kernel (context, env, stream, op) */
	F_VERSION = 32, F_PID = 33, F_EXIT_CODE = 34, F_EXIT_SIGNAL = 35, F_TIMED_OUT = 36,
	F_ERRNO = 37, F_MESSAGE = 38, F_SIZE = 39, F_MTIME_NS = 40, F_FILE_TYPE = 41,
	F_NAME = 42, F_JSON = 44, F_UPTIME_MS = 45, F_EVAL_READY = 46,
	F_KERNELS = 47,
	F_STREAM = 48, F_KIND = 49, F_PTY = 50, /* STREAMS reply: each STREAM starts an entry */
	F_FEATURES = 51, /* PING reply: optional behaviours of this agent, comma-separated */
};

/* ---- proto.c: fields of a received frame ---- */
struct msg {
	uint8_t type;
	uint32_t stream;
	const uint8_t *p; /* payload (field list), already validated */
	size_t n;
};

int fields_valid(const uint8_t *p, size_t n);
/* First occurrence of tag: 1 found, 0 absent. */
int field_get(const struct msg *m, uint8_t tag, const uint8_t **val, uint32_t *len);
/* Iterate occurrences of tag; *off starts at 0. 1 found, 0 done. */
int field_next(const struct msg *m, uint8_t tag, size_t *off, const uint8_t **val, uint32_t *len);
/* i64 field: 1 found, 0 absent (v = dflt), -1 wrong size. */
int field_i64(const struct msg *m, uint8_t tag, int64_t dflt, int64_t *v);
/* Copy a string value to a malloc'd NUL-terminated string; NULL if it contains NUL
 * (errno EINVAL) or on ENOMEM. */
char *dup_cstr(const uint8_t *v, uint32_t len);
/* String field as C string: 1 found (*out malloc'd), 0 absent, -1 error (reply sent). */
int field_cstr(const struct msg *m, uint8_t tag, const char *name, char **out);

/* ---- proto.c: output queue and frame builder ---- */
void fb_begin(uint8_t type, uint32_t stream);
void fb_bytes(uint8_t tag, const void *v, size_t n);
void fb_i64(uint8_t tag, int64_t v);
/* Reserve room for a field value of at most max bytes; NULL on ENOMEM. Finish the field
 * with fb_commit(actual). The pointer is valid until the next fb_* call. */
uint8_t *fb_reserve(uint8_t tag, size_t max);
void fb_commit(size_t n);
size_t fb_size(void); /* bytes after the length word of the frame being built */
void fb_end(void);
void fb_abort(void);

void send_simple(uint8_t type, uint32_t stream);
void send_error(uint32_t stream, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

size_t outq_len(void);
size_t outq_room(void);     /* room left for bulk producers (0 when over OUTQ_MAX) */
int outq_has_room(void);    /* room for one more CHUNK-sized frame */
int outq_flush(int fd);     /* 0 ok/EAGAIN, -1 error (errno) */
void outq_clear(void);
extern int g_connected;     /* host attached; frames are discarded while 0 */

/* ---- main.c: stream table, poll set, helpers ---- */
enum { K_EXEC = 1, K_READ, K_WRITE, K_EVAL, K_WATCH };
struct stream {
	uint32_t id;
	uint8_t kind;
	uint8_t flow;   /* the host paces this stream with WINDOW credits */
	int64_t credit; /* bytes of output the host still accepts (when flow) */
};
extern struct stream *g_streams[MAX_STREAMS];
/* Claim a stream id: 0, or -1 with an ERROR (EBUSY) already sent. */
int stream_add(struct stream *s);
void stream_del(struct stream *s);
struct stream *stream_find(uint32_t id, uint8_t kind);

typedef void (*poll_cb)(void *ctx, int fd, short revents);
void poll_add(int fd, short events, poll_cb cb, void *ctx);
void want_timeout(int64_t deadline_ms); /* wake the loop at this monotonic time */

int64_t now_ms(void);
void logmsg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Interpreters and kernel sources (NULL interpreter: searched on PATH), config and etc dirs. */
extern const char *g_python, *g_evalsrv, *g_node, *g_evaljs, *g_config_dir, *g_etc_dir;
#define DEFAULT_EVALSRV "/.forkd/forkd_eval.py"
void dispatch(const struct msg *m);

/* ---- flow.c: per-stream credit (WINDOW) ---- */
/* Reads EXEC/READ's optional WINDOW field: 1 ok, 0 error sent. */
int flow_init(struct stream *s, const struct msg *m);
size_t flow_allow(const struct stream *s, size_t want); /* bytes that may be sent now */
void flow_used(struct stream *s, size_t n);
void flow_window(const struct msg *m);  /* T_WINDOW */
void flow_cancel(const struct msg *m);  /* T_CANCEL: EXEC, READ or WRITE */
void flow_disconnected(void);           /* the host that gave the credits is gone */
void flow_repace(struct stream *s, int64_t window); /* paced again with a fresh window (STREAMS) */

/* ---- port.c ---- */
void port_setup(const char *path, int fd);
void port_poll(int64_t now);
void port_flush(void);
int port_can_read(void); /* hook from main: pause reads under backpressure */

/* ---- users.c: users of the image (its /etc/passwd and /etc/group) ---- */
#define USER_GROUPS_MAX 64
struct user {
	uid_t uid;
	gid_t gid;
	char name[256];  /* "" for a uid the image does not list */
	char home[1024];
	gid_t groups[USER_GROUPS_MAX]; /* supplementary groups, the primary one included */
	int ngroups;
};
/* Resolve a SPEC (name, uid, name:group, uid:gid; NULL or "" = root): 0, or -1 with errno
 * (ENOENT unknown user or group, EINVAL bad spec) and a message in msg. */
int user_resolve(const char *spec, struct user *u, char *msg, size_t msglen);
int user_become(const struct user *u); /* in a child: setgroups, setgid, setuid */
/* The agent's own file-system credentials (fsuid, fsgid, groups) become u's until fs_restore():
 * a file request with USER is checked by the kernel as u's and what it makes is u's. 0, or -1
 * with errno (nothing changed). The agent is single-threaded: nothing else runs meanwhile. */
int fs_become(const struct user *u);
void fs_restore(void);

/* ---- config.c: the image's config (<config dir>/env and /config) ---- */
void config_load(void);
const char *config_user(void); /* the default user SPEC, NULL: root */
/* Environment of a process run as u: defaults, the image's Env over them, then HOME, USER,
 * LOGNAME of u (for the default user only where the image's Env does not set them). */
char **base_env(const struct user *u, int explicit_user);
const char *default_cwd(const struct user *u); /* config cwd, else u's home if it exists, else / */
const char *env_get(char *const *env, const char *key);
char **env_set(char **env, char *kv); /* takes kv; NULL (env freed) on ENOMEM */
/* env with /.forkd/forkd-rand.so first in LD_PRELOAD (when the image has it): for the processes
 * a snapshot carries into its children, whose OpenSSL state would otherwise be every child's. */
char **env_preload_rand(char **env);
/* Whole regular file, at most max bytes (more is ignored and logged; *cut set), NUL-terminated. */
char *read_bounded(const char *path, size_t max, size_t *len, int *cut);

/* ---- exec.c ---- */
/* Fork+exec argv in a new session with the given stdio fds (the child's ends), as user u (NULL:
 * the agent's own). Returns pid or -1 with errno from the child's failed chdir/setuid/exec. */
pid_t spawn(char *const argv[], char *const envp[], const char *cwd, const int fds[3],
	    const struct user *u, int ctty); /* ctty: fds[0] becomes the controlling terminal */

/* ---- limits.c: the workload's cgroup ---- */
void limits_init(void);
void limits_join(void);
int limits_set_pids(int64_t max);
void free_strv(char **v);
void exec_start(const struct msg *m);
void exec_stdin(const struct msg *m);
void exec_signal(const struct msg *m);
void exec_resize(const struct msg *m); /* T_RESIZE of a PTY exec: TIOCSWINSZ */
int exec_reaped(pid_t pid, int status);
void exec_poll(int64_t now);
size_t exec_stdin_backlog(void);
void exec_cancel(struct stream *s); /* kill the group, forget the stream, no reply */
void exec_describe(struct stream *s); /* STREAMS: its PID, STDIN, PTY, TIME_NS, command, WINDOW */

/* ---- handover.c ---- */
void streams_handover(const struct msg *m); /* T_STREAMS */

/* ---- files.c ---- */
/* READ, WRITE_OPEN, LIST, STAT, MKDIR, REMOVE, RENAME, WATCH: as USER when the request names
 * one (fs_become around it), else as the agent (root). */
void file_request(const struct msg *m);
/* The user the file request being handled acts as (NULL: the agent itself); a request that
 * goes on after it returns (a write's rename, a watch's later directories) keeps a copy. */
extern const struct user *g_fs_user;
void file_write_data(const struct msg *m);
void file_write_end(const struct msg *m);
void files_poll(int64_t now);
void file_read_cancel(struct stream *s); /* close, forget the stream, no reply */
void file_write_cancel(struct stream *s); /* remove the temporary file, forget the stream */
int mkdir_p(const char *path, mode_t mode);

/* ---- watch.c: WATCH, inotify ---- */
void watch_start(const struct msg *m);
void watch_poll(int64_t now);
void watch_cancel(struct stream *s); /* close, forget the stream, no reply */

/* ---- eval.c ---- */
void eval_init(void);
void eval_request(const struct msg *m);
void eval_interrupt(const struct msg *m); /* T_EVAL_INTERRUPT: the host gave the cell up */
void eval_reseed_later(void); /* every kernel reseeds before its next cell */
int eval_ready(void);         /* every kernel that exists and did not fail to start is ready (none: 1) */
size_t eval_kernels(char *buf, size_t cap); /* "python,javascript": the kernels that exist and work */
int eval_reaped(pid_t pid, int status);
void eval_poll(int64_t now);

/* ---- identity.c / init.c / net.c ---- */
void identity(const struct msg *m);
void init_system(void);
void lo_up(void);
void net_setup(void); /* eth0 from forkd.net= on the kernel command line, if both exist */
int net_wait_up(int64_t timeout_ms);

#endif
