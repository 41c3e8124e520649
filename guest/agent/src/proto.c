/* Field codec, frame builder and the bounded output queue. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent.h"

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void put32(uint8_t *p, uint32_t v)
{
	p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

int fields_valid(const uint8_t *p, size_t n)
{
	size_t off = 0;
	while (off < n) {
		if (n - off < 5)
			return 0;
		uint32_t len = get32(p + off + 1);
		off += 5;
		if (len > n - off)
			return 0;
		off += len;
	}
	return 1;
}

int field_next(const struct msg *m, uint8_t tag, size_t *off, const uint8_t **val, uint32_t *len)
{
	while (*off < m->n) {
		const uint8_t *f = m->p + *off;
		uint32_t l = get32(f + 1);
		*off += 5 + (size_t)l;
		if (f[0] == tag) {
			*val = f + 5;
			*len = l;
			return 1;
		}
	}
	return 0;
}

int field_get(const struct msg *m, uint8_t tag, const uint8_t **val, uint32_t *len)
{
	size_t off = 0;
	return field_next(m, tag, &off, val, len);
}

int field_i64(const struct msg *m, uint8_t tag, int64_t dflt, int64_t *v)
{
	const uint8_t *p;
	uint32_t len;
	*v = dflt;
	if (!field_get(m, tag, &p, &len))
		return 0;
	if (len != 8)
		return -1;
	*v = (int64_t)((uint64_t)get32(p) << 32 | get32(p + 4));
	return 1;
}

char *dup_cstr(const uint8_t *v, uint32_t len)
{
	if (memchr(v, 0, len)) {
		errno = EINVAL;
		return NULL;
	}
	char *s = malloc((size_t)len + 1);
	if (!s)
		return NULL;
	memcpy(s, v, len);
	s[len] = 0;
	return s;
}

int field_cstr(const struct msg *m, uint8_t tag, const char *name, char **out)
{
	const uint8_t *v;
	uint32_t len;
	*out = NULL;
	if (!field_get(m, tag, &v, &len))
		return 0;
	if (!(*out = dup_cstr(v, len))) {
		send_error(m->stream, errno, "bad %s", name);
		return -1;
	}
	return 1;
}

/*
 * Output queue: one contiguous buffer, [head, tail) pending. Frames are built in place at
 * the tail. The buffer is freed whenever it drains and is large, so an idle agent keeps
 * few dirty pages (every dirty page is copied into each forked VM).
 */
static struct {
	uint8_t *buf;
	size_t head, tail, cap;
	size_t frame;  /* offset of the frame being built */
	size_t field;  /* offset of the reserved field (fb_reserve) */
	int failed;    /* ENOMEM while building: drop the frame */
} q;
int g_connected;

static int q_ensure(size_t n)
{
	if (q.failed)
		return -1;
	if (q.tail + n <= q.cap)
		return 0;
	if (q.head > 0) {
		/* compact: move pending data (and the frame being built) to the front */
		memmove(q.buf, q.buf + q.head, q.tail - q.head);
		q.tail -= q.head;
		q.frame -= q.head;
		q.field = q.field >= q.head ? q.field - q.head : 0;
		q.head = 0;
		if (q.tail + n <= q.cap)
			return 0;
	}
	size_t cap = q.cap ? q.cap : 64 * 1024;
	while (cap < q.tail + n)
		cap *= 2;
	uint8_t *b = realloc(q.buf, cap);
	if (!b) {
		q.failed = 1;
		return -1;
	}
	q.buf = b;
	q.cap = cap;
	return 0;
}

void fb_begin(uint8_t type, uint32_t stream)
{
	q.failed = 0;
	if (q.head == q.tail)
		q.head = q.tail = 0;
	q.frame = q.tail;
	if (q_ensure(9) < 0)
		return;
	q.buf[q.tail + 4] = type;
	put32(q.buf + q.tail + 5, stream);
	q.tail += 9;
}

static uint8_t *field_hdr(uint8_t tag, size_t n)
{
	if (q_ensure(5 + n) < 0)
		return NULL;
	uint8_t *p = q.buf + q.tail;
	p[0] = tag;
	put32(p + 1, (uint32_t)n);
	q.tail += 5;
	return p + 5;
}

void fb_bytes(uint8_t tag, const void *v, size_t n)
{
	uint8_t *p = field_hdr(tag, n);
	if (!p)
		return;
	if (n)
		memcpy(p, v, n);
	q.tail += n;
}

void fb_i64(uint8_t tag, int64_t v)
{
	uint8_t b[8];
	put32(b, (uint64_t)v >> 32);
	put32(b + 4, (uint32_t)v);
	fb_bytes(tag, b, 8);
}

uint8_t *fb_reserve(uint8_t tag, size_t max)
{
	if (q_ensure(5 + max) < 0)
		return NULL;
	q.field = q.tail;
	return field_hdr(tag, max);
}

void fb_commit(size_t n)
{
	put32(q.buf + q.field + 1, (uint32_t)n);
	q.tail = q.field + 5 + n;
}

size_t fb_size(void)
{
	return q.tail - q.frame - 4;
}

void fb_abort(void)
{
	q.tail = q.frame;
	q.failed = 0;
}

void fb_end(void)
{
	if (q.failed || !g_connected || fb_size() > MAX_FRAME) {
		if (!q.failed && fb_size() > MAX_FRAME)
			logmsg("dropping oversized reply (type 0x%x)", q.buf[q.frame + 4]);
		fb_abort();
		return;
	}
	put32(q.buf + q.frame, (uint32_t)fb_size());
}

void send_simple(uint8_t type, uint32_t stream)
{
	fb_begin(type, stream);
	fb_end();
}

void send_error(uint32_t stream, int err, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (n < 0)
		n = 0;
	if ((size_t)n >= sizeof msg)
		n = sizeof msg - 1;
	fb_begin(RP_ERROR, stream);
	fb_i64(F_ERRNO, err);
	fb_bytes(F_MESSAGE, msg, (size_t)n);
	fb_end();
}

size_t outq_len(void)
{
	return q.tail - q.head;
}

size_t outq_room(void)
{
	return outq_len() >= OUTQ_MAX ? 0 : OUTQ_MAX - outq_len();
}

int outq_has_room(void)
{
	return outq_room() >= CHUNK + 64;
}

void outq_clear(void)
{
	free(q.buf);
	memset(&q, 0, sizeof q);
}

int outq_flush(int fd)
{
	while (q.head < q.tail) {
		ssize_t n = write(fd, q.buf + q.head, q.tail - q.head);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno == EAGAIN ? 0 : -1;
		}
		q.head += (size_t)n;
	}
	if (q.cap > 256 * 1024)
		outq_clear(); /* give big buffers back once drained */
	else
		q.head = q.tail = 0;
	return 0;
}
