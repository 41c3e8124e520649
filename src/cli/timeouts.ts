/**
 * How long the CLI waits for the daemon: every request has a deadline. The client's timeout is
 * an idle one (the SDK's RequestOpts.timeoutMs: no byte sent or received for that long), so a call whose
 * reply comes when its work is done waits as long as that work may take, and a streamed call
 * waits for its next line, not for its end. The daemon bounds the work itself; these only keep
 * the CLI from waiting forever on a daemon that went away without closing the connection.
 */

/** Listing, inspecting, deleting, tokens, egress and ports. */
export const CALL_MS = 60_000;
/** A fork of up to 1000 children under TCG, a pause, a resume, a branch waited for. */
export const HEAVY_MS = 15 * 60_000;
/** eval: the daemon's own timeout for the cell (30 s by default) and a margin. */
export const evalMs = (cellTimeoutMs = 30_000): number => cellTimeoutMs + 30_000;
/**
 * Streamed progress (snapshot creation, push, pull): a warm-up prints nothing for up to its
 * own timeout (600 s); image builds and transfers report at least every few seconds.
 */
export const PROGRESS_IDLE_MS = 15 * 60_000;
/**
 * exec: output comes when the command prints. With --timeout the guest ends it then (plus a
 * margin); without, a command silent for an hour is given up (and, the stream closed, killed).
 */
export const execIdleMs = (commandTimeoutMs?: number): number =>
  commandTimeoutMs !== undefined && commandTimeoutMs > 0 ? commandTimeoutMs + 60_000 : 60 * 60_000;
/**
 * Packs and file copies: the daemon may stage or verify for minutes before the first (or after
 * the last) byte of a large snapshot or file.
 */
export const TRANSFER_IDLE_MS = 30 * 60_000;
