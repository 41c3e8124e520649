/*
 * STREAMS: a new host takes over from an earlier one (a daemon restarted, a sandbox resumed
 * from a pause, a child forked from a branch whose guest had requests in flight). The host's
 * stream numbering starts afresh with each connection, while this agent's table still holds
 * the earlier host's streams: the reply names them, so the new host numbers past them and
 * takes the commands over. What only the earlier host could finish is dropped first, as when
 * the host end disconnects: writes (their temporary files removed), reads and watches. Commands
 * and cells are kept; with WINDOW > 0, every command is paced again with that window (the
 * earlier host's credit, or the unpaced state a disconnect left, is not the new host's).
 */
#define _GNU_SOURCE
#include <errno.h>

#include "agent.h"

/* An entry: STREAM, KIND (the stream table's kind) and, for a command, what exec_describe says. */
#define ENTRY_MAX (4 * 1024) /* bytes an entry takes at most (its command is bounded) */

void streams_handover(const struct msg *m)
{
	int64_t window;
	if (field_i64(m, F_WINDOW, 0, &window) < 0) {
		send_error(m->stream, EINVAL, "WINDOW must be an i64");
		return;
	}
	for (int i = 0; i < MAX_STREAMS; i++) {
		struct stream *s = g_streams[i];
		if (!s)
			continue;
		if (s->kind == K_WRITE)
			file_write_cancel(s);
		else if (s->kind == K_READ)
			file_read_cancel(s);
		else if (s->kind == K_WATCH)
			watch_cancel(s);
	}
	fb_begin(RP_OK, m->stream);
	for (int i = 0; i < MAX_STREAMS; i++) {
		struct stream *s = g_streams[i];
		if (!s || (s->kind != K_EXEC && s->kind != K_EVAL))
			continue;
		if (fb_size() + ENTRY_MAX > MAX_FRAME) {
			logmsg("STREAMS: reply full, stream %u not listed", s->id);
			continue;
		}
		fb_i64(F_STREAM, s->id);
		fb_i64(F_KIND, s->kind);
		if (s->kind == K_EXEC) {
			if (window > 0)
				flow_repace(s, window);
			exec_describe(s);
		}
	}
	fb_end();
}
