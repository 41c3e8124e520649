/**
 * WATCH: a directory watched in the guest (inotify), optionally with its subdirectories; its
 * events stream to a consumer that paces them like exec output (flow.ts): the guest queues a
 * bounded number while the consumer holds a window's worth, then reports one `overflow`.
 * The stream ends with END when the watched directory itself goes away, and by stop() (CANCEL).
 */
import { ForkdError, errorMessage } from "../util/index.js";
import { Msg, Tag, field, intField, strField } from "./codec.js";
import type { Frame } from "./codec.js";
import { DEFAULT_TIMEOUT_MS } from "./connection.js";
import type { AgentConnection } from "./connection.js";
import { WINDOW, isThenable } from "./flow.js";
import type { Consumed } from "./flow.js";
import { userField } from "./files.js";
import { guestError } from "./guest-error.js";

export const WATCH_EVENT_TYPES = ["create", "write", "remove", "rename", "chmod", "overflow"] as const;
export type WatchEventType = (typeof WATCH_EVENT_TYPES)[number];

export interface WatchEvent {
  type: WatchEventType;
  /** Absolute path in the guest (the watched directory itself for `overflow`). */
  path: string;
  isDir?: boolean;
}

export interface WatchHandle {
  /** The guest watches (resolves) or refused: ENOENT, ENOTDIR, a limit (rejects). */
  readonly ready: Promise<void>;
  /**
   * The watch ended: stop(), or the watched directory went away (resolves); the guest's error
   * or the connection ending under it (rejects).
   */
  readonly done: Promise<void>;
  /** Cancels the watch in the guest; `done` resolves. Idempotent. */
  stop(): void;
}

export interface WatchOptions {
  recursive?: boolean;
  /** Watch as this user (its permissions, also for directories added later); none: the agent (root). */
  user?: string;
  /** How long the guest has to answer the WATCH (default 30 s). */
  readyTimeoutMs?: number;
}

/** What one event costs of the stream's window: its path's bytes plus this (both sides). */
export const WATCH_EVENT_COST = 64;
/** A path from the guest longer than this is a protocol error (PATH_MAX). */
const MAX_EVENT_PATH = 4096;

const isType = (t: string): t is WatchEventType => (WATCH_EVENT_TYPES as readonly string[]).includes(t);

/**
 * One WATCH_EVENT's fields as an event and what it costs of the window (its raw path bytes, as the
 * guest counts them: a name that is not UTF-8 decodes longer); throws agent_protocol on what a
 * guest must not send.
 */
function decodeEvent(f: Frame): { ev: WatchEvent; cost: number } {
  const type = strField(f.fields, Tag.EVENT) ?? "";
  const path = field(f.fields, Tag.PATH);
  if (!isType(type)) throw new ForkdError("agent_protocol", "unknown watch event type from guest");
  if (!path || path.length > MAX_EVENT_PATH || path[0] !== 0x2f)
    throw new ForkdError("agent_protocol", "watch event without an absolute path from guest");
  const ev: WatchEvent = { type, path: path.toString("utf8") };
  const ft = intField(f.fields, Tag.FILE_TYPE);
  if (ft !== undefined) ev.isDir = ft === 2;
  return { ev, cost: path.length + WATCH_EVENT_COST };
}

/** An ERROR of an agent older than WATCH (unknown request type) in the caller's terms. */
function watchError(f: Frame): ForkdError {
  const e = guestError(f.fields);
  if (e.details.errno !== 38) return e; // ENOSYS
  return new ForkdError(
    "unavailable",
    "watching a directory needs a newer guest agent than this sandbox's: make its snapshot again",
    { feature: "watch" },
  );
}

export function watchDir(
  conn: AgentConnection,
  path: string,
  opts: WatchOptions,
  onEvent: (e: WatchEvent) => Consumed,
): WatchHandle {
  let resolveReady!: () => void;
  let rejectReady!: (e: Error) => void;
  const ready = new Promise<void>((res, rej) => {
    resolveReady = res;
    rejectReady = rej;
  });
  ready.catch(() => undefined); // observed through `done` too
  let stream = 0;
  let stop: () => void = () => undefined;
  const done = new Promise<void>((resolve, reject) => {
    let over = false;
    const flow = conn.flow(
      () => stream,
      () => undefined,
    );
    const finish = (err: ForkdError | null) => {
      if (over) return;
      over = true;
      clearTimeout(readyTimer);
      flow.end();
      conn.end(stream);
      if (err) {
        rejectReady(err);
        reject(err);
      } else {
        resolveReady();
        resolve();
      }
    };
    stop = () => {
      if (over) return;
      conn.abandon(stream);
      finish(null);
    };
    const readyMs = opts.readyTimeoutMs ?? DEFAULT_TIMEOUT_MS;
    const readyTimer = setTimeout(() => {
      conn.abandon(stream);
      finish(new ForkdError("timeout", `guest did not start watching ${path} within ${readyMs} ms`));
    }, readyMs);
    const deliver = ({ ev, cost }: { ev: WatchEvent; cost: number }) => {
      let r: Consumed;
      try {
        r = onEvent(ev);
      } catch {
        r = undefined; // a consumer's exception is its own
      }
      flow.deliver(cost, isThenable(r) ? Promise.resolve(r).catch(() => undefined) : undefined);
    };
    try {
      stream = conn.open((f) => {
        if (f instanceof ForkdError) return finish(f);
        switch (f.type) {
          case Msg.OK:
            clearTimeout(readyTimer);
            if (intField(f.fields, Tag.WINDOW) !== undefined) flow.paced = true;
            return resolveReady();
          case Msg.WATCH_EVENT:
            return deliver(decodeEvent(f));
          case Msg.END:
            return finish(null);
          case Msg.ERROR:
            return finish(watchError(f));
          default:
            throw new ForkdError("agent_protocol", `unexpected frame 0x${f.type.toString(16)} in watch`);
        }
      }, flow);
      conn.send(Msg.WATCH, stream, [
        [Tag.PATH, path],
        [Tag.RECURSIVE, opts.recursive ? 1 : 0],
        [Tag.WINDOW, WINDOW],
        ...userField(opts.user),
      ]);
    } catch (e) {
      finish(e instanceof ForkdError ? e : new ForkdError("internal", errorMessage(e)));
    }
  });
  done.catch(() => undefined); // the caller observes it; an unobserved end is not a crash
  return { ready, done, stop: () => stop() };
}

/** A watch that starts once `gate` resolves (the connection's handover); its failure fails both. */
export function gatedWatch(gate: Promise<unknown>, start: () => WatchHandle): WatchHandle {
  let inner: WatchHandle | null = null;
  let stopped = false;
  const h = gate.then(() => {
    inner = start();
    if (stopped) inner.stop();
    return inner;
  });
  const ready = h.then((w) => w.ready);
  ready.catch(() => undefined); // observed through `done` too
  const done = h.then((w) => w.done);
  done.catch(() => undefined); // the caller observes it; an unobserved end is not a crash
  return {
    ready,
    done,
    stop: () => {
      stopped = true;
      inner?.stop();
    },
  };
}
