/*
 * Per-stream flow control: the host grants an EXEC, READ or WATCH stream a window of output bytes
 * (WINDOW field of the request) and more credit as its consumer drains (WINDOW frames). The
 * agent sends DATA/STDOUT/STDERR only within the credit; an exec's pipes or a read's file are
 * not read meanwhile, so the producer blocks in the guest instead of filling the host's memory.
 * A stream whose request had no WINDOW is unpaced (an old host).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>

#include "agent.h"

#define CREDIT_MAX ((int64_t)1 << 40) /* no overflow, whatever the host adds */

int flow_init(struct stream *s, const struct msg *m)
{
	int64_t w;
	if (field_i64(m, F_WINDOW, 0, &w) < 0) {
		send_error(m->stream, EINVAL, "WINDOW must be an i64");
		return 0;
	}
	if (w > 0) {
		s->flow = 1;
		s->credit = w < CREDIT_MAX ? w : CREDIT_MAX;
	}
	return 1;
}

size_t flow_allow(const struct stream *s, size_t want)
{
	if (!s->flow)
		return want;
	return s->credit <= 0 ? 0 : (uint64_t)s->credit < want ? (size_t)s->credit : want;
}

void flow_used(struct stream *s, size_t n)
{
	if (s->flow)
		s->credit -= (int64_t)n;
}

static struct stream *find(uint32_t id, int writes_too)
{
	for (int i = 0; i < MAX_STREAMS; i++) {
		struct stream *s = g_streams[i];
		if (s && s->id == id &&
		    (s->kind == K_EXEC || s->kind == K_READ || s->kind == K_WATCH ||
		     (writes_too && s->kind == K_WRITE)))
			return s;
	}
	return NULL;
}

void flow_window(const struct msg *m)
{
	struct stream *s = find(m->stream, 0);
	int64_t add;
	/* no reply either way: an ERROR would end the stream */
	if (!s || !s->flow || field_i64(m, F_WINDOW, 0, &add) <= 0 || add <= 0)
		return;
	s->credit = s->credit + add < CREDIT_MAX ? s->credit + add : CREDIT_MAX;
}

void flow_cancel(const struct msg *m)
{
	struct stream *s = find(m->stream, 1);
	if (!s)
		return;
	if (s->kind == K_EXEC)
		exec_cancel(s);
	else if (s->kind == K_READ)
		file_read_cancel(s);
	else if (s->kind == K_WATCH)
		watch_cancel(s);
	else
		file_write_cancel(s);
}

void flow_disconnected(void)
{
	for (int i = 0; i < MAX_STREAMS; i++) {
		struct stream *s = g_streams[i];
		if (s && s->kind == K_WRITE)
			file_write_cancel(s); /* nobody will finish it */
		else if (s && s->flow && s->kind == K_READ)
			file_read_cancel(s); /* nobody to read it for */
		else if (s && s->kind == K_WATCH)
			watch_cancel(s); /* nobody to tell */
		else if (s && s->flow)
			s->flow = 0; /* commands keep running; their output is discarded */
	}
}

void flow_repace(struct stream *s, int64_t window)
{
	s->flow = 1;
	s->credit = window < CREDIT_MAX ? window : CREDIT_MAX;
}
