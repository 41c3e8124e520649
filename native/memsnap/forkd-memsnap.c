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
 *   forkd-memsnap live PID MEMFILE SOCKET BLOCK DIFF
 *       The same diff, taken from QEMU's own precopy migration stream instead of a stopped copy
 *       (see live()): listens on the unix socket SOCKET (chowned to PID's uid, so a jailed VMM
 *       can connect), prints {"ready"...}; the caller starts `migrate unix:SOCKET` with
 *       pause-before-switchover. While the guest runs, every page of RAM block BLOCK that
 *       QEMU sends and that is private in PID is kept (its latest version). When QEMU has
 *       stopped the guest at pre-switchover, the caller sends "scan" (the instant; nothing is
 *       read then: see live_mark()), {"scanned"...} is printed; the caller continues the
 *       migration, QEMU sends the pages dirtied since its last pass, and once the stream ends
 *       the stats line is printed (the caller resumes the VM). Then every kept page is checked
 *       to be still private, DIFF is written (the instant's private pages, each at its last
 *       sent version) and {"written":true} printed.
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
 * The private set is read with the PAGEMAP_SCAN ioctl where the kernel has it (Linux 6.7+: only
 * the matching ranges come back, ~2x faster on a 1 GiB guest here, more with long runs), else
 * from /proc/PID/pagemap entry by entry. FORKD_MEMSNAP_SCAN=read|ioctl|auto forces one in a direct
 * run (auto is the default; the daemon passes its helpers no FORKD_ variable); the stats lines
 * say which ran ("scan"). qemu-driver.test.ts proves a live capture equal, page by page, to a
 * stopped capture of the same instant.
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
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/un.h>
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

/*
 * A page of the mapping that is the VMM's own, not the file's: present and anonymous, or swapped
 * out. pagemap also reports a file page under migration as a swap entry, with PM_FILE: not ours.
 */
static int private_entry(uint64_t e) {
  return !(e & PM_FILE) && (e & (PM_PRESENT | PM_SWAPPED));
}

struct runs {
  uint64_t (*r)[2]; /* {first page, page count} */
  size_t n, cap;
  uint64_t pages;
};

/*
 * Appends pages p..p+n-1 to the runs, coalescing with the last run. Pages below the runs' end
 * are dropped: they were examined already. (A PAGEMAP_SCAN stopped by its full vector reports
 * a walk_end that can lie before the end of ranges it returned, so the next call reports some
 * of the same pages again; within one call ranges ascend.)
 */
static void add_pages(struct runs *out, uint64_t p, uint64_t n) {
  if (out->n > 0) {
    uint64_t last = out->r[out->n - 1][0] + out->r[out->n - 1][1];
    if (p + n <= last) return;
    if (p < last) n -= last - p, p = last;
  }
  out->pages += n;
  if (out->n > 0 && out->r[out->n - 1][0] + out->r[out->n - 1][1] == p) {
    out->r[out->n - 1][1] += n;
    return;
  }
  if (out->n == out->cap) {
    out->cap = out->cap ? out->cap * 2 : 1024;
    out->r = realloc(out->r, out->cap * sizeof *out->r);
    if (!out->r) fail("out of memory");
  }
  out->r[out->n][0] = p;
  out->r[out->n][1] = n;
  out->n++;
}

/* The runs of private pages, read entry by entry from /proc/PID/pagemap (any kernel). */
static void scan_read(int pm, uint64_t start, uint64_t pages, long psz, struct runs *out) {
  static uint64_t ent[BATCH_PAGES];
  for (uint64_t i = 0; i < pages; i += BATCH_PAGES) {
    uint64_t n = pages - i < BATCH_PAGES ? pages - i : BATCH_PAGES;
    ssize_t r = pread(pm, ent, n * 8, (off_t)((start / (uint64_t)psz + i) * 8));
    if (r != (ssize_t)(n * 8)) die("pagemap");
    for (uint64_t j = 0; j < n; j++)
      if (private_entry(ent[j])) add_pages(out, i + j, 1);
  }
}

/*
 * PAGEMAP_SCAN (Linux 6.7): the kernel walks the page tables and returns only the ranges that
 * match, instead of 8 bytes per page (2 MiB for a 1 GiB guest) for us to filter. The ABI is
 * stable; it is declared here because older kernel headers lack it. A range matches what
 * private_entry() accepts: not a file page, and present or swapped.
 */
struct fk_page_region {
  uint64_t start, end, categories;
};
struct fk_pm_scan_arg {
  uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
  uint64_t category_inverted, category_mask, category_anyof_mask, return_mask;
};
#define FK_PAGEMAP_SCAN _IOWR('f', 16, struct fk_pm_scan_arg)
#define FK_PAGE_IS_FILE (1ULL << 2)
#define FK_PAGE_IS_PRESENT (1ULL << 3)
#define FK_PAGE_IS_SWAPPED (1ULL << 4)
#define SCAN_REGIONS 4096

/* 1: done; 0: the kernel has no PAGEMAP_SCAN (out untouched); dies on any other error. */
static int scan_ioctl(int pm, uint64_t start, uint64_t pages, long psz, struct runs *out) {
  static struct fk_page_region vec[SCAN_REGIONS];
  uint64_t end = start + pages * (uint64_t)psz;
  for (uint64_t at = start; at < end;) {
    struct fk_pm_scan_arg a = {
        .size = sizeof a,
        .start = at,
        .end = end,
        .vec = (uint64_t)(uintptr_t)vec,
        .vec_len = SCAN_REGIONS,
        .category_inverted = FK_PAGE_IS_FILE,
        .category_mask = FK_PAGE_IS_FILE,
        .category_anyof_mask = FK_PAGE_IS_PRESENT | FK_PAGE_IS_SWAPPED,
        .return_mask = FK_PAGE_IS_PRESENT | FK_PAGE_IS_SWAPPED,
    };
    int n = ioctl(pm, FK_PAGEMAP_SCAN, &a);
    if (n < 0) {
      if ((errno == ENOTTY || errno == EINVAL) && at == start && out->n == 0) return 0;
      die("PAGEMAP_SCAN");
    }
    for (int k = 0; k < n; k++) {
      if (vec[k].start < at || vec[k].end > end || vec[k].end <= vec[k].start) fail("PAGEMAP_SCAN: a range outside the walk");
      add_pages(out, (vec[k].start - start) / (uint64_t)psz, (vec[k].end - vec[k].start) / (uint64_t)psz);
    }
    if (a.walk_end <= at || a.walk_end > end) fail("PAGEMAP_SCAN: no progress");
    at = a.walk_end;
  }
  return 1;
}

/* How scan() reads pagemap: FORKD_MEMSNAP_SCAN=read|ioctl|auto (auto: ioctl where the kernel has it). */
static const char *scan_how = "auto";

/* The runs of private pages in [start, start + pages * psz) of PID. */
static void scan(int pm, uint64_t start, uint64_t pages, long psz, struct runs *out) {
  out->n = 0;
  out->pages = 0;
  if (strcmp(scan_how, "read") != 0) {
    if (scan_ioctl(pm, start, pages, psz, out)) {
      scan_how = "ioctl";
      return;
    }
    if (strcmp(scan_how, "ioctl") == 0) fail("PAGEMAP_SCAN is not supported by this kernel");
  }
  scan_how = "read";
  scan_read(pm, start, pages, psz, out);
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
  printf("{\"pages\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"runs\":%zu,\"scan_ms\":%.2f,\"copy_ms\":%.2f,\"scan\":\"%s\"}\n",
         runs.pages, need, runs.n, t1 - t0, t2 - t1, scan_how);
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

/*
 * live: the private pages of one instant, from QEMU's precopy migration stream (see the header).
 *
 * QEMU sends every RAM page once, then the pages the guest dirtied since, pass after pass, while
 * the guest runs; with pause-before-switchover it then stops the guest and waits. That stop is
 * the instant: the caller freezes the disk and saves the device state, marks it ("scan") and
 * continues the migration; QEMU sends the last dirty pages and the stream ends. A page's last
 * version in the stream is its content at the instant (QEMU's dirty log guarantees it), so the
 * diff is: for each page private at the instant, its last version here. The pages private at
 * the instant are the pages kept (live_mark()), so the pause holds no pagemap walk.
 *
 * Only pages private when they arrive are kept. That is exact: a page is checked in pagemap after
 * QEMU read it; one not private then was not private when read either, so it held the file's
 * content; if the guest writes it later, the dirty log sends it again.
 */
#define QEMU_VM_FILE_MAGIC 0x5145564dU
#define QEMU_VM_FILE_VERSION 3U
#define QEMU_VM_EOF 0x1f
#define QEMU_VM_SECTION_START 0x01
#define QEMU_VM_SECTION_PART 0x02
#define QEMU_VM_SECTION_END 0x03
#define QEMU_VM_SECTION_FULL 0x04
#define QEMU_VM_SUBSECTION 0x05
#define QEMU_VM_CONFIGURATION 0x07
#define QEMU_VM_COMMAND 0x08
#define QEMU_VM_SECTION_FOOTER 0x7e
#define RAM_SAVE_FLAG_ZERO 0x02
#define RAM_SAVE_FLAG_MEM_SIZE 0x04
#define RAM_SAVE_FLAG_PAGE 0x08
#define RAM_SAVE_FLAG_EOS 0x10
#define RAM_SAVE_FLAG_CONTINUE 0x20
#define RAM_SAVE_FLAG_MULTIFD_FLUSH 0x200
#define TARGET_PAGE ((uint64_t)4096)
#define PENDING_PAGES 512

struct live {
  pid_t pid;
  int pm, conn, in;
  uint64_t start, pages, fileoff;
  const char *block;
  /* the block of the last page record: QEMU's RAM_SAVE_FLAG_CONTINUE spans sections */
  int ours;
  /* the stream, buffered */
  unsigned char rbuf[1 << 16];
  size_t rpos, rlen;
  uint64_t stream_bytes;
  /* pages kept: slot[page] = index + 1 into data, 0 = none */
  uint32_t *slot;
  char *data;
  uint64_t used, cap; /* in pages */
  /* pages received, not yet checked against pagemap */
  uint64_t pend_page[PENDING_PAGES];
  int pend_zero[PENDING_PAGES];
  char *pend_data;
  int npend;
  /* the instant's private set (the pages kept, once the stream ended) */
  struct runs instant;
  int scanned;
  double scan_ms, t_scan;
  char cmd[64];
  size_t cmdlen;
};

/*
 * The instant (the guest is stopped): no pagemap walk while stopped. Private is monotonic (a
 * page the VMM copied stays its own: forkd's VMMs have no balloon and discard nothing), and
 * every page private at the instant was checked private when it last arrived: the first pass
 * sends every page, and a page written after it was sent is sent again (the final pass, after
 * this, sends the pages dirtied since the last one, checked against the stopped guest). So the
 * instant's private set is the set of pages kept; live() checks after the guest runs again that
 * every kept page is still private.
 */
static void live_mark(struct live *L) {
  L->t_scan = now_ms();
  L->scan_ms = 0;
  L->scanned = 1;
  printf("{\"scanned\":true,\"pages\":%" PRIu64 ",\"scan_ms\":0}\n", L->used);
  fflush(stdout);
}

/* Commands from the caller, read while waiting for the stream: "scan" (the guest is stopped). */
static void live_stdin(struct live *L) {
  char c;
  ssize_t r = read(L->in, &c, 1);
  if (r < 0 && errno == EINTR) return;
  if (r <= 0) fail("the caller went away");
  if (c != '\n') {
    if (L->cmdlen + 1 >= sizeof L->cmd) fail("bad command");
    L->cmd[L->cmdlen++] = c;
    return;
  }
  L->cmd[L->cmdlen] = 0;
  L->cmdlen = 0;
  if (strcmp(L->cmd, "scan") == 0 && !L->scanned) live_mark(L);
  else fail("unexpected command");
}

/* Refills the stream buffer; 0 at the end of the stream. Serves the caller's commands meanwhile. */
static int live_fill(struct live *L) {
  for (;;) {
    struct pollfd p[2] = {{L->conn, POLLIN, 0}, {L->in, POLLIN, 0}};
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      die("poll");
    }
    if (p[1].revents) live_stdin(L);
    if (p[0].revents) {
      ssize_t r = read(L->conn, L->rbuf, sizeof L->rbuf);
      if (r < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        die("read stream");
      }
      L->rpos = 0;
      L->rlen = (size_t)r;
      L->stream_bytes += (uint64_t)r;
      return r > 0;
    }
  }
}

static void sread(struct live *L, void *dst, size_t n) {
  char *d = dst;
  while (n > 0) {
    if (L->rpos == L->rlen && !live_fill(L)) fail("the migration stream ended early");
    size_t k = L->rlen - L->rpos < n ? L->rlen - L->rpos : n;
    if (d) memcpy(d, L->rbuf + L->rpos, k), d += k;
    L->rpos += k;
    n -= k;
  }
}

static int speek(struct live *L) {
  if (L->rpos == L->rlen && !live_fill(L)) return -1;
  return L->rbuf[L->rpos];
}

static uint8_t s8(struct live *L) {
  uint8_t v;
  sread(L, &v, 1);
  return v;
}

static uint64_t sbe(struct live *L, int bytes) {
  unsigned char b[8];
  sread(L, b, (size_t)bytes);
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v = v << 8 | b[i];
  return v;
}

/* A length-prefixed (u8) name; returns whether it equals `want`. */
static int sname(struct live *L, const char *want) {
  char name[256];
  uint8_t n = s8(L);
  sread(L, name, n);
  name[n] = 0;
  return want && strcmp(name, want) == 0;
}

/* Checks the pending pages against pagemap (now: after QEMU read them) and keeps the private ones. */
static void live_flush(struct live *L) {
  if (L->npend == 0) return;
  uint64_t lo = L->pend_page[0], hi = lo;
  for (int i = 1; i < L->npend; i++) {
    if (L->pend_page[i] < lo) lo = L->pend_page[i];
    if (L->pend_page[i] > hi) hi = L->pend_page[i];
  }
  static uint64_t ent[BATCH_PAGES];
  int ranged = hi - lo < BATCH_PAGES;
  if (ranged) {
    size_t want = (size_t)(hi - lo + 1) * 8;
    if (pread(L->pm, ent, want, (off_t)((L->start / TARGET_PAGE + lo) * 8)) != (ssize_t)want) die("pagemap");
  }
  for (int i = 0; i < L->npend; i++) {
    uint64_t p = L->pend_page[i], e;
    if (ranged) e = ent[p - lo];
    else if (pread(L->pm, &e, 8, (off_t)((L->start / TARGET_PAGE + p) * 8)) != 8) die("pagemap");
    if (!private_entry(e)) continue;
    if (L->slot[p] == 0) {
      if (L->used == L->cap) {
        uint64_t ncap = L->cap * 2;
        char *more = mremap(L->data, L->cap * TARGET_PAGE, ncap * TARGET_PAGE, MREMAP_MAYMOVE);
        if (more == MAP_FAILED) die("mremap");
        L->data = more;
        L->cap = ncap;
      }
      if (L->used >= UINT32_MAX) fail("too many pages");
      L->slot[p] = (uint32_t)++L->used;
    }
    char *dst = L->data + (uint64_t)(L->slot[p] - 1) * TARGET_PAGE;
    if (L->pend_zero[i]) memset(dst, 0, TARGET_PAGE);
    else memcpy(dst, L->pend_data + (uint64_t)i * TARGET_PAGE, TARGET_PAGE);
  }
  L->npend = 0;
}

/* One RAM section's body, up to its EOS. */
static void live_ram(struct live *L) {
  for (;;) {
    uint64_t v = sbe(L, 8);
    uint64_t flags = v & (TARGET_PAGE - 1), addr = v & ~(TARGET_PAGE - 1);
    if (flags & RAM_SAVE_FLAG_MEM_SIZE) {
      for (uint64_t left = addr; left > 0;) {
        int mine = sname(L, L->block);
        uint64_t len = sbe(L, 8);
        if (mine && len != L->pages * TARGET_PAGE) fail("the RAM block's size is not the mapping's");
        if (len == 0 || len > left) fail("bad RAM block list");
        left -= len;
      }
      continue;
    }
    if (flags & RAM_SAVE_FLAG_EOS) return;
    if (flags & ~(uint64_t)(RAM_SAVE_FLAG_ZERO | RAM_SAVE_FLAG_PAGE | RAM_SAVE_FLAG_CONTINUE | RAM_SAVE_FLAG_MULTIFD_FLUSH)) {
      fprintf(stderr, "forkd-memsnap: unsupported RAM flags 0x%" PRIx64 "\n", flags);
      exit(1);
    }
    if (flags == RAM_SAVE_FLAG_MULTIFD_FLUSH) continue;
    if (!(flags & RAM_SAVE_FLAG_CONTINUE)) L->ours = sname(L, L->block);
    uint64_t page = addr / TARGET_PAGE;
    if (L->ours && page >= L->pages) fail("a page outside the RAM block");
    if (flags & RAM_SAVE_FLAG_ZERO) {
      if (s8(L) != 0) fail("a non-zero fill page");
      if (!L->ours) continue;
      L->pend_page[L->npend] = page;
      L->pend_zero[L->npend++] = 1;
    } else if (flags & RAM_SAVE_FLAG_PAGE) {
      if (!L->ours) {
        sread(L, NULL, TARGET_PAGE);
        continue;
      }
      sread(L, L->pend_data + (uint64_t)L->npend * TARGET_PAGE, TARGET_PAGE);
      L->pend_page[L->npend] = page;
      L->pend_zero[L->npend++] = 0;
    } else {
      fail("a RAM record without data");
    }
    if (L->npend == PENDING_PAGES) live_flush(L);
  }
}

static void live_footer(struct live *L, uint32_t id) {
  if (speek(L) != QEMU_VM_SECTION_FOOTER) return;
  s8(L);
  if (sbe(L, 4) != id) fail("section footer mismatch");
}

static int live(pid_t pid, const char *memfile, const char *sockpath, const char *block, const char *diffpath) {
  static struct live L;
  L.pid = pid;
  L.in = 0;
  L.block = block;
  uint64_t end = 0;
  find_mapping(pid, memfile, &L.start, &end, &L.fileoff);
  if (sysconf(_SC_PAGESIZE) != (long)TARGET_PAGE) fail("host page size is not 4096");
  L.pages = (end - L.start) / TARGET_PAGE;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/pagemap", (int)pid);
  L.pm = open(path, O_RDONLY | O_CLOEXEC);
  if (L.pm < 0) die(path);
  int out = open(diffpath, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (out < 0) die(diffpath);

  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(sockpath) >= sizeof sa.sun_path) fail("socket path too long");
  strcpy(sa.sun_path, sockpath);
  int ls = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (ls < 0) die("socket");
  if (bind(ls, (struct sockaddr *)&sa, sizeof sa) != 0) die(sockpath);
  struct stat ps;
  snprintf(path, sizeof path, "/proc/%d", (int)pid);
  if (stat(path, &ps) != 0) die(path);
  if (chown(sockpath, ps.st_uid, ps.st_gid) != 0) die("chown socket");
  if (listen(ls, 1) != 0) die("listen");

  /* Room for the private pages seen now, plus slack; it grows if the guest writes more. */
  struct runs pre = {0};
  scan(L.pm, L.start, L.pages, (long)TARGET_PAGE, &pre);
  L.cap = pre.pages + pre.pages / 4 + 1024;
  L.data = mmap(NULL, L.cap * TARGET_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (L.data == MAP_FAILED) die("mmap");
  L.slot = calloc(L.pages ? L.pages : 1, sizeof *L.slot);
  L.pend_data = malloc(PENDING_PAGES * TARGET_PAGE);
  if (!L.slot || !L.pend_data) fail("out of memory");
  printf("{\"ready\":true,\"estimate_bytes\":%" PRIu64 "}\n", pre.pages * TARGET_PAGE);
  fflush(stdout);

  for (;;) {
    struct pollfd p[2] = {{ls, POLLIN, 0}, {L.in, POLLIN, 0}};
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      die("poll");
    }
    if (p[1].revents) fail("the caller spoke before the migration connected");
    if (p[0].revents) break;
  }
  L.conn = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
  if (L.conn < 0) die("accept");
  close(ls);
  unlink(sockpath);

  if (sbe(&L, 4) != QEMU_VM_FILE_MAGIC || sbe(&L, 4) != QEMU_VM_FILE_VERSION) fail("not a QEMU migration stream");
  int32_t ram_id = -1;
  for (int done = 0; !done;) {
    int t = s8(&L);
    switch (t) {
    case QEMU_VM_CONFIGURATION:
      sread(&L, NULL, sbe(&L, 4));
      if (speek(&L) == QEMU_VM_SUBSECTION) fail("migration configuration subsections are not supported");
      break;
    case QEMU_VM_COMMAND: {
      sbe(&L, 2);
      sread(&L, NULL, sbe(&L, 2));
      break;
    }
    case QEMU_VM_SECTION_START: {
      uint32_t id = (uint32_t)sbe(&L, 4);
      if (!sname(&L, "ram")) fail("an iterable section other than RAM");
      sbe(&L, 4);
      sbe(&L, 4);
      ram_id = (int32_t)id;
      live_ram(&L);
      live_footer(&L, id);
      break;
    }
    case QEMU_VM_SECTION_PART:
    case QEMU_VM_SECTION_END: {
      uint32_t id = (uint32_t)sbe(&L, 4);
      if ((int32_t)id != ram_id) fail("an iterable section other than RAM");
      live_ram(&L);
      live_footer(&L, id);
      done = t == QEMU_VM_SECTION_END;
      break;
    }
    default:
      fprintf(stderr, "forkd-memsnap: unexpected migration section type 0x%x before the end of RAM\n", t);
      exit(1);
    }
  }
  live_flush(&L);
  if (!L.scanned) fail("the RAM stream ended before the guest was stopped");
  /* The rest (device state) is not ours, but QEMU completes only once it is read. */
  while (L.rpos < L.rlen || live_fill(&L)) L.rpos = L.rlen;
  close(L.conn);

  for (uint64_t p = 0; p < L.pages; p++)
    if (L.slot[p]) add_pages(&L.instant, p, 1);
  uint64_t need = L.instant.pages * TARGET_PAGE;
  printf("{\"pages\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"runs\":%zu,\"scan_ms\":%.2f,\"copy_ms\":%.2f,"
         "\"stream_bytes\":%" PRIu64 ",\"kept_bytes\":%" PRIu64 "}\n",
         L.instant.pages, need, L.instant.n, L.scan_ms, now_ms() - L.t_scan, L.stream_bytes, L.used * TARGET_PAGE);
  fflush(stdout);

  /* The guest runs again (the caller resumed it on the line above): every kept page must still be
   * the VMM's own (see live_mark); pages it writes from now on only add to the private set. */
  struct runs now = {0};
  scan(L.pm, L.start, L.pages, (long)TARGET_PAGE, &now);
  for (size_t k = 0, j = 0; k < L.instant.n; k++) {
    uint64_t first = L.instant.r[k][0], n = L.instant.r[k][1];
    while (j < now.n && now.r[j][0] + now.r[j][1] <= first) j++;
    if (j == now.n || now.r[j][0] > first || now.r[j][0] + now.r[j][1] < first + n) {
      fprintf(stderr, "forkd-memsnap: a page kept from the stream (in pages %" PRIu64 "-%" PRIu64 ") is no longer private\n",
              first, first + n - 1);
      exit(1);
    }
  }

  uint64_t hdr[2] = {TARGET_PAGE, end - L.start};
  write_all(out, MAGIC, sizeof MAGIC);
  write_all(out, hdr, sizeof hdr);
  for (size_t k = 0; k < L.instant.n; k++) {
    uint64_t first = L.instant.r[k][0], n = L.instant.r[k][1];
    uint64_t rec[2] = {L.fileoff + first * TARGET_PAGE, n * TARGET_PAGE};
    write_all(out, rec, sizeof rec);
    for (uint64_t p = first; p < first + n; p++)
      write_all(out, L.data + (uint64_t)(L.slot[p] - 1) * TARGET_PAGE, TARGET_PAGE);
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
  const char *how = getenv("FORKD_MEMSNAP_SCAN");
  if (how && *how) {
    if (strcmp(how, "read") && strcmp(how, "ioctl") && strcmp(how, "auto"))
      return fprintf(stderr, "forkd-memsnap: FORKD_MEMSNAP_SCAN must be read, ioctl or auto\n"), 2;
    scan_how = how;
  }
  if (argc == 5 && strcmp(argv[1], "capture") == 0) {
    char *end;
    long pid = strtol(argv[2], &end, 10);
    if (*end || pid <= 0) return fprintf(stderr, "forkd-memsnap: bad pid %s\n", argv[2]), 2;
    return capture((pid_t)pid, argv[3], argv[4]);
  }
  if (argc == 7 && strcmp(argv[1], "live") == 0) {
    char *end;
    long pid = strtol(argv[2], &end, 10);
    if (*end || pid <= 0) return fprintf(stderr, "forkd-memsnap: bad pid %s\n", argv[2]), 2;
    return live((pid_t)pid, argv[3], argv[4], argv[5], argv[6]);
  }
  if (argc == 5 && strcmp(argv[1], "apply") == 0) return apply(argv[2], argv[3], argv[4]);
  if (argc == 5 && strcmp(argv[1], "inject") == 0) {
    char *end;
    long pid = strtol(argv[2], &end, 10);
    if (*end || pid <= 0) return fprintf(stderr, "forkd-memsnap: bad pid %s\n", argv[2]), 2;
    return inject((pid_t)pid, argv[3], argv[4]);
  }
  fprintf(stderr, "usage: forkd-memsnap capture PID MEMFILE DIFF | live PID MEMFILE SOCKET BLOCK DIFF | apply BASE DIFF OUT | inject PID MEMFILE DIFF\n");
  return 2;
}
