/*
 * forkd-rand.so: OpenSSL's random bytes straight from the guest kernel, for the processes a
 * snapshot carries into its children (the warm kernels, and what start_cmd and warm leave
 * running).
 *
 * Every child of a snapshot resumes the same memory, so a process that was running in the parent
 * resumes in each child with the same user-space generator state. forkd reseeds the guest
 * kernel's CRNG at each child's IDENTITY, and its kernels reseed Python's and numpy's generators
 * and their own Math.random, but OpenSSL's DRBG is in the process and only reseeds after a fork
 * (a new pid), a count of requests or a time interval (an hour for its primary): before this,
 * every child of a JavaScript snapshot gave the same crypto.randomBytes and randomUUID, and would
 * have made the same keys and TLS secrets. Preloaded (LD_PRELOAD) into those processes, this
 * library interposes OpenSSL 3's exported RAND_bytes, RAND_priv_bytes and their _ex forms (the
 * ones Node, Python's ssl, libssl and libcrypto's own key generation call) with getrandom(2): no
 * state in the process, so nothing to share.
 *
 * Freestanding: no libc, only the getrandom system call, so it loads into any dynamically linked
 * x86-64 process (glibc or musl); a process without OpenSSL never calls it.
 */
#include <stddef.h>

#define SYS_getrandom 318
#define EINTR 4

static long sys_getrandom(void *buf, size_t n, unsigned flags) {
  long r;
  __asm__ volatile("syscall" : "=a"(r) : "0"((long)SYS_getrandom), "D"(buf), "S"(n), "d"((long)flags) : "rcx", "r11", "memory");
  return r;
}

static int fill(unsigned char *buf, size_t n) {
  while (n > 0) {
    long r = sys_getrandom(buf, n, 0);
    if (r == -EINTR) continue;
    if (r <= 0) return 0; /* OpenSSL's failure: the caller sees an error, never weak bytes */
    buf += r;
    n -= (size_t)r;
  }
  return 1;
}

__attribute__((visibility("default"))) int RAND_bytes(unsigned char *buf, int num) {
  return num < 0 ? 0 : fill(buf, (size_t)num);
}

__attribute__((visibility("default"))) int RAND_priv_bytes(unsigned char *buf, int num) {
  return num < 0 ? 0 : fill(buf, (size_t)num);
}

__attribute__((visibility("default"))) int RAND_bytes_ex(void *libctx, unsigned char *buf, size_t num,
                                                         unsigned int strength) {
  (void)libctx;
  (void)strength;
  return fill(buf, num);
}

__attribute__((visibility("default"))) int RAND_priv_bytes_ex(void *libctx, unsigned char *buf, size_t num,
                                                              unsigned int strength) {
  (void)libctx;
  (void)strength;
  return fill(buf, num);
}
