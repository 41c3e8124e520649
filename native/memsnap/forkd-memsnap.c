/*
 * forkd-memsnap: the memory half of BRANCH.
 *
 * A forked child maps its snapshot's memory file MAP_PRIVATE: every guest page it has written is
 * a private anonymous copy in its QEMU process, every other page is still the file's. So the
 * child's whole memory is "the file + its private pages", and only the private pages need
 * copying while the child is paused.
 *
 *   forkd-memsnap capture PID MEMFILE DIFF
 *       Finds PID's mapping of MEMFILE, walks /proc/PID/pagemap over it, and writes every
 *       private page (present and not file-backed, or swapped out) to DIFF, coalesced into
 *       runs. Line protocol, so the caller's pause holds only the copy (see capture()):
 *       prints {"ready"...} and waits for a line on stdin (the caller pauses the VM, then
 *       sends it); copies and prints {"pages","bytes","runs","scan_ms","copy_ms"} (the caller
 *       resumes the VM); writes DIFF and prints {"written":true}.
 *
 *   forkd-memsnap apply BASE DIFF OUT
 *       Writes OUT = BASE with DIFF's runs written over it (copy_file_range, so a filesystem
 *       that can share extents does), fsyncs it. Prints {"bytes","ms"}.
 *
 *   forkd-memsnap inject PID MEMFILE DIFF
 *       Writes DIFF's runs into PID's mapping of MEMFILE (a stopped VMM's guest RAM, mapped
 *       MAP_PRIVATE: the pages written become private copies in it, exactly as if the guest had
 *       written them). process_vm_writev, or /proc/PID/mem for a mapping it cannot write. The
 *       diff's mapping size must be the mapping's. Prints {"bytes","runs","ms"}.
 *
 * DIFF format (little-endian): "FKMDIFF1", u64 page size, u64 mapping size, then runs of
 * {u64 offset, u64 length, length bytes}, then a run with length 0.
 *
 * Errors go to stderr with exit status 1; usage errors exit 2.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define PM_PRESENT (1ULL << 63)
#define PM_SWAPPED (1ULL << 62)
#define PM_FILE (1ULL << 61)
#define BATCH_PAGES 4096 /* pagemap entries read per pread */
#define MAX_IOV 512

static const char MAGIC[8] = {'F', 'K', 'M', 'D', 'I', 'F', 'F', '1'};

static void die(const char *what) {
  fprintf(stderr, "forkd-memsnap: %s: %s\n", what, strerror(errno));
  exit(1);
}

static void fail(const char *msg) {
  fprintf(stderr, "forkd-memsnap: %s\n", msg);
  exit(1);
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      die("write");
    }
    p += w;
    n -= (size_t)w;
  }
}

static void read_all(int fd, void *buf, size_t n) {
  char *p = buf;
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r < 0) {
      if (errno == EINTR) continue;
      die("read");
    }
    if (r == 0) fail("diff file is truncated");
    p += r;
    n -= (size_t)r;
  }
}

/* The [start, end) of PID's mapping of MEMFILE (by device and inode, not by name). */
static void find_mapping(pid_t pid, const char *memfile, uint64_t *start, uint64_t *end, uint64_t *off) {
  struct stat st;
  if (stat(memfile, &st) != 0) die(memfile);
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) die(path);
  char line[PATH_MAX + 256];
  int found = 0;
  while (fgets(line, sizeof line, f)) {
    uint64_t s, e, o, ino;
    unsigned maj, min;
    char perms[8];
    if (sscanf(line, "%" SCNx64 "-%" SCNx64 " %7s %" SCNx64 " %x:%x %" SCNu64, &s, &e, perms, &o, &maj, &min, &ino) != 7)
      continue;
    if (ino != (uint64_t)st.st_ino || makedev(maj, min) != st.st_dev) continue;
    if (found) fail("the memory file is mapped more than once");
    *start = s;
    *end = e;
    *off = o;
    found = 1;
  }
  fclose(f);
  if (!found) fail("the process does not map the memory file");
}

struct runs {
  uint64_t (*r)[2]; /* {first page, page count} */
  size_t n, cap;
  uint64_t pages;
};

/* The runs of private pages in [start, start + pages * psz) of PID (pagemap walk). */
static void scan(int pm, uint64_t start, uint64_t pages, long psz, struct runs *out) {
  static uint64_t ent[BATCH_PAGES];
  out->n = 0;
  out->pages = 0;
  for (uint64_t i = 0; i < pages; i += BATCH_PAGES) {
    uint64_t n = pages - i < BATCH_PAGES ? pages - i : BATCH_PAGES;
    ssize_t r = pread(pm, ent, n * 8, (off_t)((start / (uint64_t)psz + i) * 8));
    if (r != (ssize_t)(n * 8)) die("pagemap");
    for (uint64_t j = 0; j < n; j++) {
      uint64_t e = ent[j];
      int priv = ((e & PM_PRESENT) && !(e & PM_FILE)) || (e & PM_SWAPPED);
      if (!priv) continue;
      uint64_t p = i + j;
      out->pages++;
      if (out->n > 0 && out->r[out->n - 1][0] + out->r[out->n - 1][1] == p) {
        out->r[out->n - 1][1]++;
        continue;
      }
      if (out->n == out->cap) {
        out->cap = out->cap ? out->cap * 2 : 1024;
        out->r = realloc(out->r, out->cap * sizeof *out->r);
        if (!out->r) fail("out of memory");
      }
      out->r[out->n][0] = p;
      out->r[out->n][1] = 1;
      out->n++;
    }
  }
}

/* A buffer of `bytes`, faulted in now (so copying into it later costs no page faults). */
static char *prefaulted(uint64_t bytes) {
  if (bytes == 0) bytes = 1;
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) die("mmap");
  return p;
}

/*
 * Two phases, so that the VM's pause holds only the copy:
 *   1. (VM running) pre-scan, allocate and fault in a buffer for the private pages plus slack,
 *      print {"ready":true,...}, wait for a line on stdin;
 *   2. (VM paused by the caller) scan, copy every private page into the buffer, print the
 *      stats line: the caller resumes the VM now;
 *   3. (VM running) write the diff file from the buffer, print {"written":true}.
 */
static int capture(pid_t pid, const char *memfile, const char *diffpath) {
  uint64_t start = 0, end = 0, fileoff = 0;
  find_mapping(pid, memfile, &start, &end, &fileoff);
  long psz = sysconf(_SC_PAGESIZE);
  uint64_t pages = (end - start) / (uint64_t)psz;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/pagemap", (int)pid);
  int pm = open(path, O_RDONLY | O_CLOEXEC);
  if (pm < 0) die(path);
  int out = open(diffpath, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (out < 0) die(diffpath);

  struct runs runs = {0};
  scan(pm, start, pages, psz, &runs);
  uint64_t room = (runs.pages + runs.pages / 4 + 1024) * (uint64_t)psz;
  char *buf = prefaulted(room);
  printf("{\"ready\":true,\"estimate_bytes\":%" PRIu64 "}\n", runs.pages * (uint64_t)psz);
  fflush(stdout);
  char line[64];
  if (!fgets(line, sizeof line, stdin)) fail("no go from the caller");

  double t0 = now_ms();
  scan(pm, start, pages, psz, &runs);
  double t1 = now_ms();
  uint64_t need = runs.pages * (uint64_t)psz;
  if (need > room) { /* the set grew past the slack: grow (costs page faults, still correct) */
    char *more = mremap(buf, room, need, MREMAP_MAYMOVE);
    if (more == MAP_FAILED) die("mremap");
    buf = more;
    room = need;
  }
  struct iovec local[MAX_IOV], remote[MAX_IOV];
  uint64_t off = 0;
  for (size_t k = 0; k < runs.n;) {
    int n = 0;
    for (; n < MAX_IOV && k < runs.n; n++, k++) {
      uint64_t len = runs.r[k][1] * (uint64_t)psz;
      local[n].iov_base = buf + off;
      local[n].iov_len = len;
      remote[n].iov_base = (void *)(uintptr_t)(start + runs.r[k][0] * (uint64_t)psz);
      remote[n].iov_len = len;
      off += len;
    }
    uint64_t want = 0;
    for (int q = 0; q < n; q++) want += local[q].iov_len;
    for (uint64_t got = 0; got < want;) {
      /* Partial reads happen at iovec boundaries; redo the rest. */
      struct iovec l2[MAX_IOV], r2[MAX_IOV];
      int m = 0;
      uint64_t skip = got;
      for (int q = 0; q < n; q++) {
        if (skip >= local[q].iov_len) {
          skip -= local[q].iov_len;
          continue;
        }
        l2[m].iov_base = (char *)local[q].iov_base + skip;
        l2[m].iov_len = local[q].iov_len - skip;
        r2[m].iov_base = (char *)remote[q].iov_base + skip;
        r2[m].iov_len = remote[q].iov_len - skip;
        skip = 0;
        m++;
      }
      ssize_t r = process_vm_readv(pid, l2, (unsigned long)m, r2, (unsigned long)m, 0);
      if (r <= 0) die("process_vm_readv");
      got += (uint64_t)r;
    }
  }
  double t2 = now_ms();
  printf("{\"pages\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"runs\":%zu,\"scan_ms\":%.2f,\"copy_ms\":%.2f}\n", runs.pages,
         need, runs.n, t1 - t0, t2 - t1);
  fflush(stdout);

  uint64_t hdr[2] = {(uint64_t)psz, end - start};
  write_all(out, MAGIC, sizeof MAGIC);
  write_all(out, hdr, sizeof hdr);
  off = 0;
  for (size_t k = 0; k < runs.n; k++) {
    uint64_t len = runs.r[k][1] * (uint64_t)psz;
    uint64_t rec[2] = {fileoff + runs.r[k][0] * (uint64_t)psz, len};
    write_all(out, rec, sizeof rec);
    write_all(out, buf + off, len);
    off += len;
  }
  uint64_t endrec[2] = {0, 0};
  write_all(out, endrec, sizeof endrec);
  if (fsync(out) != 0) die("fsync");
  close(out);
  printf("{\"written\":true}\n");
  return 0;
}

static int apply(const char *base, const char *diffpath, const char *outpath) {
  double t0 = now_ms();
  int in = open(base, O_RDONLY | O_CLOEXEC);
  if (in < 0) die(base);
  struct stat st;
  if (fstat(in, &st) != 0) die(base);
  int out = open(outpath, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (out < 0) die(outpath);
  for (off_t left = st.st_size; left > 0;) {
    ssize_t n = copy_file_range(in, NULL, out, NULL, (size_t)left, 0);
    if (n < 0) die("copy_file_range");
    if (n == 0) fail("base file shrank while copying");
    left -= n;
  }
  close(in);

  int d = open(diffpath, O_RDONLY | O_CLOEXEC);
  if (d < 0) die(diffpath);
  char magic[8];
  uint64_t hdr[2];
  read_all(d, magic, sizeof magic);
  if (memcmp(magic, MAGIC, sizeof MAGIC) != 0) fail("not a forkd memory diff");
  read_all(d, hdr, sizeof hdr);
  size_t bufsz = 8u << 20;
  char *buf = malloc(bufsz);
  if (!buf) fail("out of memory");
  uint64_t total = 0;
  for (;;) {
    uint64_t rec[2];
    read_all(d, rec, sizeof rec);
    if (rec[1] == 0) break;
    if (rec[0] + rec[1] < rec[0] || rec[0] + rec[1] > (uint64_t)st.st_size) fail("diff run outside the memory file");
    for (uint64_t done = 0; done < rec[1];) {
      size_t n = rec[1] - done < bufsz ? (size_t)(rec[1] - done) : bufsz;
      read_all(d, buf, n);
      for (size_t w = 0; w < n;) {
        ssize_t r = pwrite(out, buf + w, n - w, (off_t)(rec[0] + done + w));
        if (r < 0) die("pwrite");
        w += (size_t)r;
      }
      done += n;
    }
    total += rec[1];
  }
  close(d);
  if (fsync(out) != 0) die("fsync");
  close(out);
  printf("{\"bytes\":%" PRIu64 ",\"ms\":%.2f}\n", total, now_ms() - t0);
  return 0;
}

/* pwrite to /proc/PID/mem (a forced write: works on a mapping the process cannot write itself). */
static void mem_write(int mem, const char *buf, uint64_t len, uint64_t addr) {
  for (uint64_t w = 0; w < len;) {
    ssize_t r = pwrite(mem, buf + w, (size_t)(len - w), (off_t)(addr + w));
    if (r < 0) {
      if (errno == EINTR) continue;
      die("write /proc/PID/mem");
    }
    if (r == 0) fail("short write to /proc/PID/mem");
    w += (uint64_t)r;
  }
}

/* Writes `len` bytes at `addr` of PID: process_vm_writev, else (EFAULT: read-only) /proc/PID/mem. */
static void remote_write(pid_t pid, int *mem, const char *buf, uint64_t len, uint64_t addr) {
  uint64_t w = 0;
  while (w < len && *mem < 0) {
    struct iovec l = {(void *)(buf + w), (size_t)(len - w)};
    struct iovec r = {(void *)(uintptr_t)(addr + w), (size_t)(len - w)};
    ssize_t n = process_vm_writev(pid, &l, 1, &r, 1, 0);
    if (n > 0) {
      w += (uint64_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EFAULT && errno != EPERM && errno != ENOSYS) die("process_vm_writev");
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/mem", (int)pid);
    *mem = open(path, O_WRONLY | O_CLOEXEC);
    if (*mem < 0) die(path);
  }
  if (w < len) mem_write(*mem, buf + w, len - w, addr + w);
}

/*
 * DIFF's pages into PID's mapping of MEMFILE. The caller keeps the VM stopped: the guest runs
 * only once every page is in. Runs are file offsets (capture writes mapping offset + page).
 */
static int inject(pid_t pid, const char *memfile, const char *diffpath) {
  double t0 = now_ms();
  uint64_t start = 0, end = 0, fileoff = 0;
  find_mapping(pid, memfile, &start, &end, &fileoff);
  int d = open(diffpath, O_RDONLY | O_CLOEXEC);
  if (d < 0) die(diffpath);
  char magic[8];
  uint64_t hdr[2];
  read_all(d, magic, sizeof magic);
  if (memcmp(magic, MAGIC, sizeof MAGIC) != 0) fail("not a forkd memory diff");
  read_all(d, hdr, sizeof hdr);
  if (hdr[0] != (uint64_t)sysconf(_SC_PAGESIZE)) fail("the diff was taken with another page size");
  if (hdr[1] != end - start) fail("the diff was taken of a mapping of another size");
  size_t bufsz = 8u << 20;
  char *buf = malloc(bufsz);
  if (!buf) fail("out of memory");
  int mem = -1;
  uint64_t total = 0, nruns = 0;
  for (;;) {
    uint64_t rec[2];
    read_all(d, rec, sizeof rec);
    if (rec[1] == 0) break;
    if (rec[0] < fileoff || rec[0] + rec[1] < rec[0] || rec[0] + rec[1] - fileoff > end - start ||
        rec[0] % hdr[0] != 0 || rec[1] % hdr[0] != 0)
      fail("diff run outside the mapping");
    for (uint64_t done = 0; done < rec[1];) {
      size_t n = rec[1] - done < bufsz ? (size_t)(rec[1] - done) : bufsz;
      read_all(d, buf, n);
      remote_write(pid, &mem, buf, n, start + (rec[0] - fileoff) + done);
      done += n;
    }
    total += rec[1];
    nruns++;
  }
  close(d);
  if (mem >= 0) close(mem);
  printf("{\"bytes\":%" PRIu64 ",\"runs\":%" PRIu64 ",\"ms\":%.2f}\n", total, nruns, now_ms() - t0);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 5 && strcmp(argv[1], "capture") == 0) {
    char *end;
    long pid = strtol(argv[2], &end, 10);
    if (*end || pid <= 0) return fprintf(stderr, "forkd-memsnap: bad pid %s\n", argv[2]), 2;
    return capture((pid_t)pid, argv[3], argv[4]);
  }
  if (argc == 5 && strcmp(argv[1], "apply") == 0) return apply(argv[2], argv[3], argv[4]);
  if (argc == 5 && strcmp(argv[1], "inject") == 0) {
    char *end;
    long pid = strtol(argv[2], &end, 10);
    if (*end || pid <= 0) return fprintf(stderr, "forkd-memsnap: bad pid %s\n", argv[2]), 2;
    return inject((pid_t)pid, argv[3], argv[4]);
  }
  fprintf(stderr, "usage: forkd-memsnap capture PID MEMFILE DIFF | apply BASE DIFF OUT | inject PID MEMFILE DIFF\n");
  return 2;
}
