/*
 * forkd-jailer: starts one VMM process under the per-VM policy the daemon asks for, then
 * execs it, so the policy holds from the VMM's first instruction and cannot be undone by it.
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
 * --uid N --gid N drop to this user and group (no supplementary groups, or --groups G,G,...)
 *                 after the above, with no_new_privs set: the VMM keeps no capability.
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
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_ITEMS 64
/* A Dockerfile build VM reads its base image and every cached step layer it boots on: one bind
 * each, up to the instructions a Dockerfile may hold (src/image/dockerfile/lines.ts), and more. */
#define MAX_BINDS 1100

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

static int expose(const struct bind *b) {
  if (make_parents(b->path) != 0) return -1;
  if (b->is_dir) {
    if (mkdir(b->path, 0755) != 0 && errno != EEXIST) return -1;
  } else {
    int fd = open(b->path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EISDIR) return -1;
    if (fd >= 0) close(fd);
  }
  char src[64];
  snprintf(src, sizeof src, "/proc/self/fd/%d", b->fd);
  if (mount(src, b->path, NULL, MS_BIND, NULL) != 0) return -1;
  unsigned long flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | (b->ro ? MS_RDONLY : 0);
  return mount(NULL, b->path, NULL, flags, NULL);
}
int main(int argc, char **argv) {
  int no_thp = 0;
  const char *cgroups[MAX_ITEMS];
  const char *hides[MAX_ITEMS];
  static struct bind binds[MAX_BINDS];
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
    if (strcmp(a, "--no-thp") == 0) {
      no_thp = 1;
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
    } else if ((strcmp(a, "--bind") == 0 || strcmp(a, "--bind-ro") == 0) && nbind < MAX_BINDS && v[0] == '/') {
      binds[nbind++] = (struct bind){ .path = v, .ro = a[6] == '-', .fd = -1, .is_dir = 0 };
    } else if (strcmp(a, "--uid") == 0) {
      if (parse_id(v, &uid) != 0) return usage();
    } else if (strcmp(a, "--gid") == 0) {
      if (parse_id(v, &gid) != 0) return usage();
    } else if (strcmp(a, "--groups") == 0) {
      groups = v;
    } else {
      fprintf(stderr, "forkd-jailer: unknown or bad option %s\n", a);
      return usage();
    }
  }
  if (i >= argc || (uid == 0) != (gid == 0) || (tap && !netns)) return usage();

  for (int k = 0; k < ncg; k++)
    if (join_cgroup(cgroups[k]) != 0) return fail("cannot join cgroup", cgroups[k]);
  if (netns && join_netns(netns) != 0) return fail("cannot join network namespace", netns);

  if (nhide > 0) {
    if (unshare(CLONE_NEWNS) != 0) return fail("unshare(CLONE_NEWNS)", NULL);
    // Nothing we mount propagates back to the host.
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) return fail("make / private", NULL);
    // Open what stays visible before anything is hidden (in this namespace: a bind mount's
    // source must belong to it).
    for (int k = 0; k < nbind; k++) {
      struct stat st;
      binds[k].fd = open(binds[k].path, O_PATH | O_CLOEXEC);
      if (binds[k].fd < 0 || fstat(binds[k].fd, &st) != 0) return fail("cannot open", binds[k].path);
      binds[k].is_dir = S_ISDIR(st.st_mode);
    }
    for (int k = 0; k < nhide; k++)
      if (mount("tmpfs", hides[k], "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=1m") != 0)
        return fail("cannot hide", hides[k]);
    for (int k = 0; k < nbind; k++) {
      if (expose(&binds[k]) != 0) return fail("cannot expose", binds[k].path);
      close(binds[k].fd);
    }
  }

  if (tap && open_tap(tap) != 0) return fail("cannot open tap", tap);

  if (no_thp && prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0) return fail("PR_SET_THP_DISABLE", NULL);

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
    if (setgroups(n, list) != 0) return fail("setgroups", NULL);
    if (setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid) != 0) return fail("setresgid", NULL);
    if (setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) != 0) return fail("setresuid", NULL);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return fail("PR_SET_NO_NEW_PRIVS", NULL);
  }
  execvp(argv[i], &argv[i]);
  return fail("cannot run", argv[i]);
}
