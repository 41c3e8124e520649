/*
 * forkd-jailer: starts one host process under the policy the daemon asks for, then execs it, so
 * the policy holds from the program's first instruction and cannot be undone by it. Two uses:
 * every VMM (src/vmm/jail.ts), and every host tool (qemu-img, e2fsck) run on a disk a guest or a
 * tenant wrote (src/vmm/jailed-tools.ts: --new-root, --new-pid, --new-net, --rlimit).
 *
 *   forkd-jailer [OPTIONS] -- PROGRAM [ARGS...]
 *
 * --no-thp        prctl(PR_SET_THP_DISABLE): no transparent huge pages in this process (kept
 *                 across execve). QEMU madvises its TCG code buffer and every RAM block
 *                 MADV_HUGEPAGE, so touching a few KiB of either commits a whole 2 MiB page; for
 *                 an idle forked child that is ~3 MiB of its ~20 MiB private memory.
 * --cgroup DIR    join the cgroup DIR (writes our pid to DIR/cgroup.procs); repeatable, one per
 *                 cgroup v1 controller hierarchy, or one cgroup v2 directory. Done first, so
 *                 every thread and allocation of the VMM is charged to it.
 * --netns PATH    join the network namespace at PATH (e.g. /run/netns/NAME, from `ip netns add`)
 *                 with setns(CLONE_NEWNET): the VMM's tap device and any socket it opens
 *                 (user-mode networking) live in that namespace only (src/net/).
 * --tap NAME      open the (persistent) tap device NAME of that namespace, as root, and hand it
 *                 to the program as file descriptor 3 (`-netdev tap,fd=3`): the jailed VMM has
 *                 no CAP_NET_ADMIN to attach it itself. No vnet header (IFF_NO_PI only).
 * --hide DIR      in a new private mount namespace, mount an empty tmpfs over DIR (the daemon's
 *                 data and cache directories): other VMs' files are not there to be opened.
 * --bind PATH     re-expose PATH (read-write) at the same place under a hidden DIR; the VM's own
 *                 directory. Opened before anything is hidden.
 * --bind-ro PATH  the same, read-only (its snapshot chain, its guest image).
 * --new-root      instead of --hide: in a new private mount namespace, a root of its own (a
 *                 tmpfs, read-only once built) holding only the host's program and library
 *                 directories (/usr, /bin, /sbin, /lib*: read-only; a symlink as it is),
 *                 /etc/ld.so.cache, /dev/null, /dev/zero, /dev/random, /dev/urandom, a /proc of
 *                 its own (with --new-pid), and the --bind and --bind-ro paths at their places
 *                 (never through a symlink: a bound path that is one is refused).
 * --new-pid       a PID namespace of its own: the jailer forks and the program is its namespace's
 *                 init, so whatever it starts ends with it; the jailer waits and exits with the
 *                 program's status (128+N, named on stderr, for a signal N); a signal that stops
 *                 the jailer (TERM, INT, HUP, or KILL through PR_SET_PDEATHSIG) kills the program.
 * --new-net       a network (and IPC) namespace of its own: no interface but a loopback left down.
 * --rlimit R=N    setrlimit(R, N) for the program: R is as, cpu, fsize, nofile, nproc or core.
 * --uid N --gid N drop to this user and group (no supplementary groups, or --groups G,G,...)
 *                 after the above, with no_new_privs set and the capability bounding set empty:
 *                 the program keeps no capability.
 *
 * The daemon (src/vmm/jail.ts builds the arguments) is the only caller. Errors go to stderr
 * (the VM's log) and exit with 127, like a shell that cannot run a command.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_ITEMS 64

struct bind {
  const char *path;
  int ro;
  int fd;
  int is_dir;
};

static int fail(const char *what, const char *arg) {
  fprintf(stderr, "forkd-jailer: %s%s%s: %s\n", what, arg ? " " : "", arg ? arg : "", strerror(errno));
  return 127;
}

static int usage(void) {
  fprintf(stderr,
          "usage: forkd-jailer [--no-thp] [--cgroup DIR]... [--netns PATH [--tap NAME]] [--hide DIR]...\n"
          "                    [--new-root] [--new-pid] [--new-net] [--rlimit R=N]...\n"
          "                    [--bind PATH]... [--bind-ro PATH]... [--uid N --gid N [--groups G,...]]\n"
          "                    -- PROGRAM [ARGS...]\n");
  return 2;
}

static int parse_id(const char *s, unsigned long *out) {
  char *end;
  errno = 0;
  unsigned long v = strtoul(s, &end, 10);
  if (errno || *s == '\0' || *end != '\0' || v == 0 || v >= 0xFFFFFFFFul) return -1;
  *out = v;
  return 0;
}

static int join_cgroup(const char *dir) {
  char path[PATH_MAX];
  if (snprintf(path, sizeof path, "%s/cgroup.procs", dir) >= (int)sizeof path) {
    errno = ENAMETOOLONG;
    return -1;
  }
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char pid[32];
  int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
  int rc = write(fd, pid, (size_t)n) == n ? 0 : -1;
  int e = errno;
  close(fd);
  errno = e;
  return rc;
}

/* Moves this process into the network namespace bound at `path`. */
static int join_netns(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  int rc = setns(fd, CLONE_NEWNET);
  int e = errno;
  close(fd);
  errno = e;
  return rc;
}

/* Attaches to the tap NAME of the current network namespace and leaves it open as fd 3, inherited
 * across execve. Called after every other descriptor we opened is closed, so 3 holds nothing else
 * of ours. */
#define TAP_FD 3
static int open_tap(const char *name) {
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  if (strlen(name) >= sizeof ifr.ifr_name) {
    errno = ENAMETOOLONG;
    return -1;
  }
  strcpy(ifr.ifr_name, name);
  ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
  int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
  if (fd < 0) return -1;
  if (ioctl(fd, TUNSETIFF, &ifr) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  if (fd == TAP_FD) return fcntl(fd, F_SETFD, 0);
  if (dup2(fd, TAP_FD) != TAP_FD) return -1; /* dup2's copy has no FD_CLOEXEC */
  close(fd);
  return 0;
}

/* mkdir -p of PATH's parents (inside a fresh tmpfs; mode 0755 holds nothing but mount points). */
static int make_parents(const char *path) {
  char buf[PATH_MAX];
  if (strlen(path) >= sizeof buf) {
    errno = ENAMETOOLONG;
    return -1;
  }
  strcpy(buf, path);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
    *p = '/';
  }
  return 0;
}

/* Where --new-root builds the root before pivot_root (a mount in our own namespace only). */
#define NEW_ROOT "/tmp"

/* `prefix` then `path` in `out` (PATH_MAX bytes). */
static int join_path(char *out, const char *prefix, const char *path) {
  if (snprintf(out, PATH_MAX, "%s%s", prefix, path) >= PATH_MAX) {
    errno = ENAMETOOLONG;
    return -1;
  }
  return 0;
}

/* Mounts the path `b` opened at its own place under `prefix` ("" or NEW_ROOT). */
static int expose(const struct bind *b, const char *prefix, unsigned long extra) {
  char target[PATH_MAX];
  if (join_path(target, prefix, b->path) != 0 || make_parents(target) != 0) return -1;
  if (b->is_dir) {
    if (mkdir(target, 0755) != 0 && errno != EEXIST) return -1;
  } else {
    int fd = open(target, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EISDIR) return -1;
    if (fd >= 0) close(fd);
  }
  char src[64];
  snprintf(src, sizeof src, "/proc/self/fd/%d", b->fd);
  if (mount(src, target, NULL, MS_BIND, NULL) != 0) return -1;
  unsigned long flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | extra | (b->ro ? MS_RDONLY : 0);
  return mount(NULL, target, NULL, flags, NULL);
}

/* Bind-mounts the host's `path` (a directory, or with `file` a file) read-only, or read-write
 * with `rw`, at the same place under NEW_ROOT. */
static int mirror(const char *path, int file, int rw, unsigned long extra) {
  char t[PATH_MAX];
  if (join_path(t, NEW_ROOT, path) != 0 || make_parents(t) != 0) return -1;
  if (file) {
    int fd = open(t, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    close(fd);
  } else if (mkdir(t, 0755) != 0) {
    return -1;
  }
  if (mount(path, t, NULL, MS_BIND | MS_REC, NULL) != 0) return -1;
  return mount(NULL, t, NULL, MS_BIND | MS_REMOUNT | MS_NOSUID | extra | (rw ? 0 : MS_RDONLY), NULL);
}

/* --new-root: builds the root under NEW_ROOT (see the options above) and pivots into it. The
 * binds were opened before, in this namespace. */
static int new_root(const struct bind *binds, int nbind, int with_proc) {
  if (mount("tmpfs", NEW_ROOT, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m") != 0)
    return fail("cannot mount a root at", NEW_ROOT);
  static const char *const sys[] = { "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32" };
  for (size_t k = 0; k < sizeof sys / sizeof sys[0]; k++) {
    struct stat st;
    if (lstat(sys[k], &st) != 0) {
      if (errno == ENOENT) continue;
      return fail("cannot stat", sys[k]);
    }
    if (S_ISLNK(st.st_mode)) {
      char target[PATH_MAX], t[PATH_MAX];
      ssize_t n = readlink(sys[k], target, sizeof target - 1);
      if (n < 0) return fail("cannot read link", sys[k]);
      target[n] = '\0';
      if (join_path(t, NEW_ROOT, sys[k]) != 0 || symlink(target, t) != 0) return fail("cannot link", sys[k]);
    } else if (S_ISDIR(st.st_mode) && mirror(sys[k], 0, 0, MS_NODEV) != 0) {
      return fail("cannot expose", sys[k]);
    }
  }
  if (access("/etc/ld.so.cache", F_OK) == 0 && mirror("/etc/ld.so.cache", 1, 0, MS_NODEV | MS_NOEXEC) != 0)
    return fail("cannot expose", "/etc/ld.so.cache");
  static const char *const dev[] = { "/dev/null", "/dev/zero", "/dev/random", "/dev/urandom" };
  for (size_t k = 0; k < sizeof dev / sizeof dev[0]; k++)
    if (mirror(dev[k], 1, 1, MS_NOEXEC) != 0) return fail("cannot expose", dev[k]);
  char t[PATH_MAX];
  if (with_proc) {
    // Its own PID namespace's processes, and nothing else of /proc (subset=pid, Linux 5.8+).
    if (join_path(t, NEW_ROOT, "/proc") != 0 || mkdir(t, 0555) != 0) return fail("cannot make", "/proc");
    unsigned long f = MS_NOSUID | MS_NODEV | MS_NOEXEC;
    if (mount("proc", t, "proc", f, "subset=pid") != 0 && mount("proc", t, "proc", f, NULL) != 0)
      return fail("cannot mount", "/proc");
  }
  for (int k = 0; k < nbind; k++)
    if (expose(&binds[k], NEW_ROOT, MS_NOEXEC) != 0) return fail("cannot expose", binds[k].path);
  if (chdir(NEW_ROOT) != 0) return fail("chdir", NEW_ROOT);
  if (syscall(SYS_pivot_root, ".", ".") != 0) return fail("pivot_root", NEW_ROOT);
  if (umount2(".", MNT_DETACH) != 0) return fail("cannot detach the host's root", NULL);
  if (chdir("/") != 0) return fail("chdir", "/");
  if (mount(NULL, "/", NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) != 0)
    return fail("cannot make the root read-only", NULL);
  return 0;
}

struct rlim {
  int resource;
  rlim_t value;
};

static int parse_rlimit(const char *s, struct rlim *out) {
  static const struct {
    const char *name;
    int resource;
  } names[] = { { "as", RLIMIT_AS },         { "cpu", RLIMIT_CPU },     { "fsize", RLIMIT_FSIZE },
                { "nofile", RLIMIT_NOFILE }, { "nproc", RLIMIT_NPROC }, { "core", RLIMIT_CORE } };
  const char *eq = strchr(s, '=');
  if (!eq || eq[1] < '0' || eq[1] > '9') return -1;
  for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
    size_t n = strlen(names[k].name);
    if ((size_t)(eq - s) != n || strncmp(s, names[k].name, n) != 0) continue;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(eq + 1, &end, 10);
    if (errno || *end != '\0') return -1;
    out->resource = names[k].resource;
    out->value = (rlim_t)v;
    return 0;
  }
  return -1;
}

static pid_t init_pid = 0;
/* In the child of --new-pid: the read end of a pipe only the jailer writes to (closed on exec). */
static int jailer_alive = -1;

/* The program dies with the jailer. Set last: a change of credentials clears it. */
static int die_with_jailer(void) {
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) return fail("PR_SET_PDEATHSIG", NULL);
  // The jailer may have died before that: then its end of the pipe is closed.
  struct pollfd p = { .fd = jailer_alive, .events = POLLIN };
  if (poll(&p, 1, 0) != 0) return 127;
  return 0;
}

static void kill_init(int sig) {
  (void)sig;
  if (init_pid > 0) kill(init_pid, SIGKILL);
}

/* --new-pid: forks into a new PID namespace. Returns 0 in the child (its init, which goes on to
 * exec the program); the jailer itself waits for it and exits with its status. */
static int become_init(const char *prog) {
  if (unshare(CLONE_NEWPID) != 0) return fail("unshare(CLONE_NEWPID)", NULL);
  int alive[2];
  if (pipe2(alive, O_CLOEXEC) != 0) return fail("pipe", NULL);
  pid_t pid = fork();
  if (pid < 0) return fail("fork", NULL);
  if (pid == 0) {
    close(alive[1]);
    jailer_alive = alive[0];
    return die_with_jailer();
  }
  close(alive[0]);
  init_pid = pid;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = kill_init;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  int status;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      fail("waitpid", NULL);
      kill(pid, SIGKILL);
      _exit(127);
    }
  }
  if (WIFEXITED(status)) _exit(WEXITSTATUS(status));
  int sig = WTERMSIG(status);
  fprintf(stderr, "forkd-jailer: %s was killed by signal %d (%s)\n", prog, sig, strsignal(sig));
  _exit(128 + sig);
}

int main(int argc, char **argv) {
  int no_thp = 0, root = 0, newpid = 0, newnet = 0;
  struct rlim rlims[MAX_ITEMS];
  int nrlim = 0;
  const char *cgroups[MAX_ITEMS];
  const char *hides[MAX_ITEMS];
  struct bind binds[MAX_ITEMS];
  int ncg = 0, nhide = 0, nbind = 0;
  unsigned long uid = 0, gid = 0;
  const char *groups = NULL;
  const char *netns = NULL;
  const char *tap = NULL;
  int i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    }
    int *flag = strcmp(a, "--no-thp") == 0     ? &no_thp
                : strcmp(a, "--new-root") == 0 ? &root
                : strcmp(a, "--new-pid") == 0  ? &newpid
                : strcmp(a, "--new-net") == 0  ? &newnet
                                               : NULL;
    if (flag) {
      *flag = 1;
      continue;
    }
    if (i + 1 >= argc) return usage();
    const char *v = argv[++i];
    if (strcmp(a, "--cgroup") == 0 && ncg < MAX_ITEMS) {
      cgroups[ncg++] = v;
    } else if (strcmp(a, "--netns") == 0 && v[0] == '/') {
      netns = v;
    } else if (strcmp(a, "--tap") == 0 && v[0] != '\0') {
      tap = v;
    } else if (strcmp(a, "--hide") == 0 && nhide < MAX_ITEMS && v[0] == '/') {
      hides[nhide++] = v;
    } else if ((strcmp(a, "--bind") == 0 || strcmp(a, "--bind-ro") == 0) && nbind < MAX_ITEMS && v[0] == '/') {
      binds[nbind++] = (struct bind){ .path = v, .ro = a[6] == '-', .fd = -1, .is_dir = 0 };
    } else if (strcmp(a, "--uid") == 0) {
      if (parse_id(v, &uid) != 0) return usage();
    } else if (strcmp(a, "--gid") == 0) {
      if (parse_id(v, &gid) != 0) return usage();
    } else if (strcmp(a, "--groups") == 0) {
      groups = v;
    } else if (strcmp(a, "--rlimit") == 0 && nrlim < MAX_ITEMS) {
      if (parse_rlimit(v, &rlims[nrlim++]) != 0) return usage();
    } else {
      fprintf(stderr, "forkd-jailer: unknown or bad option %s\n", a);
      return usage();
    }
  }
  if (i >= argc || (uid == 0) != (gid == 0) || (tap && !netns) || (newnet && netns) || (root && nhide > 0))
    return usage();

  for (int k = 0; k < ncg; k++)
    if (join_cgroup(cgroups[k]) != 0) return fail("cannot join cgroup", cgroups[k]);
  if (netns && join_netns(netns) != 0) return fail("cannot join network namespace", netns);
  if (newpid) {
    int rc = become_init(argv[i]);
    if (rc != 0) return rc;
  }
  if (newnet && unshare(CLONE_NEWNET | CLONE_NEWIPC) != 0) return fail("unshare(CLONE_NEWNET)", NULL);

  if (nhide > 0 || root) {
    if (unshare(CLONE_NEWNS) != 0) return fail("unshare(CLONE_NEWNS)", NULL);
    // Nothing we mount propagates back to the host.
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) return fail("make / private", NULL);
    // Open what stays visible before anything is hidden (in this namespace: a bind mount's
    // source must belong to it).
    // Under --new-root, never through a symlink: only a file or a directory.
    for (int k = 0; k < nbind; k++) {
      struct stat st;
      binds[k].fd = open(binds[k].path, O_PATH | O_CLOEXEC | (root ? O_NOFOLLOW : 0));
      if (binds[k].fd < 0 || fstat(binds[k].fd, &st) != 0) return fail("cannot open", binds[k].path);
      if (root && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
        errno = EINVAL;
        return fail("not a file or a directory:", binds[k].path);
      }
      binds[k].is_dir = S_ISDIR(st.st_mode);
    }
    if (root && new_root(binds, nbind, newpid) != 0) return 127;
    for (int k = 0; k < nhide; k++)
      if (mount("tmpfs", hides[k], "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=1m") != 0)
        return fail("cannot hide", hides[k]);
    for (int k = 0; k < nbind; k++) {
      if (!root && expose(&binds[k], "", 0) != 0) return fail("cannot expose", binds[k].path);
      close(binds[k].fd);
    }
  }

  if (tap && open_tap(tap) != 0) return fail("cannot open tap", tap);

  if (no_thp && prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0) return fail("PR_SET_THP_DISABLE", NULL);
  for (int k = 0; k < nrlim; k++) {
    struct rlimit rl = { .rlim_cur = rlims[k].value, .rlim_max = rlims[k].value };
    if (setrlimit(rlims[k].resource, &rl) != 0) return fail("setrlimit", NULL);
  }

  if (uid != 0) {
    gid_t list[16];
    size_t n = 0;
    if (groups) {
      char buf[256];
      if (strlen(groups) >= sizeof buf) return usage();
      strcpy(buf, groups);
      for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        unsigned long g;
        if (n >= 16 || parse_id(t, &g) != 0) return usage();
        list[n++] = (gid_t)g;
      }
    }
    // Nothing it execs can gain a capability back.
    for (int c = 0; c < 64; c++)
      if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) != 0 && errno != EINVAL) return fail("PR_CAPBSET_DROP", NULL);
    if (setgroups(n, list) != 0) return fail("setgroups", NULL);
    if (setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid) != 0) return fail("setresgid", NULL);
    if (setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) != 0) return fail("setresuid", NULL);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return fail("PR_SET_NO_NEW_PRIVS", NULL);
  }
  if (jailer_alive >= 0 && die_with_jailer() != 0) return 127;
  execvp(argv[i], &argv[i]);
  return fail("cannot run", argv[i]);
}
