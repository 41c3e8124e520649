/*
 * forkd-jailer: starts one VMM process under the per-VM policy the daemon asks for, then
 * execs it, so the policy holds from the VMM's first instruction and cannot be undone by it.
 *
 *   forkd-jailer [--no-thp] [--netns PATH] -- PROGRAM [ARGS...]
 *
 * --no-thp  prctl(PR_SET_THP_DISABLE): no transparent huge pages in this process (kept across
 *           execve). QEMU madvises its TCG code buffer and every RAM block MADV_HUGEPAGE, so
 *           touching a few KiB of either commits a whole 2 MiB page; for an idle forked child
 *           that is ~3 MiB of its ~20 MiB private memory, for no speed gain we can measure.
 * --netns PATH  join the network namespace at PATH (e.g. /run/netns/NAME, from `ip netns add`)
 *           with setns(CLONE_NEWNET) before exec: the VMM's tap device and any socket it opens
 *           (user-mode networking) live in that namespace only (src/net/).
 *
 * The daemon (src/vmm/launcher.ts) is the only caller. Errors go to stderr (the VM's log) and
 * exit with 127, like a shell that cannot run a command.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

static int usage(void) {
  fprintf(stderr, "usage: forkd-jailer [--no-thp] [--netns PATH] -- PROGRAM [ARGS...]\n");
  return 2;
}

/* Moves this process into the network namespace bound at `path`. */
static int join_netns(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    fprintf(stderr, "forkd-jailer: open %s: %s\n", path, strerror(errno));
    return -1;
  }
  int r = setns(fd, CLONE_NEWNET);
  if (r != 0) fprintf(stderr, "forkd-jailer: setns %s: %s\n", path, strerror(errno));
  close(fd);
  return r;
}

int main(int argc, char **argv) {
  int no_thp = 0;
  const char *netns = NULL;
  int i = 1;
  for (; i < argc; i++) {
    if (strcmp(argv[i], "--") == 0) {
      i++;
      break;
    }
    if (strcmp(argv[i], "--no-thp") == 0) {
      no_thp = 1;
    } else if (strcmp(argv[i], "--netns") == 0 && i + 1 < argc) {
      netns = argv[++i];
    } else {
      fprintf(stderr, "forkd-jailer: unknown option %s\n", argv[i]);
      return usage();
    }
  }
  if (i >= argc) return usage();

  if (no_thp && prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0) {
    fprintf(stderr, "forkd-jailer: PR_SET_THP_DISABLE: %s\n", strerror(errno));
    return 127;
  }
  if (netns && join_netns(netns) != 0) return 127;
  execvp(argv[i], &argv[i]);
  fprintf(stderr, "forkd-jailer: cannot run %s: %s\n", argv[i], strerror(errno));
  return 127;
}
