/**
 * Files in the guest: whole and streamed reads (paced by the consumer, flow.ts), atomic writes
 * (temp file, fsync, rename in the guest), stat, list, mkdir, remove, rename, and SYNC. Each as
 * the agent (root), or as `user` (the agent checks and makes it as that user's: USER; only to an
 * agent with FEATURES file-user, which the client checks).
 */
import { ForkdError, errorMessage } from "../util/index.js";
import { PausableTimer } from "../util/index.js";
import { CHUNK, Msg, Tag, field, intField, strField } from "./codec.js";
import type { Field, FieldInput } from "./codec.js";
import { DEFAULT_TIMEOUT_MS } from "./connection.js";
import type { AgentConnection } from "./connection.js";
import { WINDOW, isThenable } from "./flow.js";
import type { Consumed } from "./flow.js";
import { guestError } from "./guest-error.js";

export interface FileStat {
  type: "file" | "dir" | "symlink" | "other";
  size: number;
  mode: number;
  mtimeMs: number;
}

export interface DirEntry extends FileStat {
  name: string;
}

const FILE_TYPES = { 1: "file", 2: "dir", 3: "symlink", 4: "other" } as const;

/** The USER field of a file request (none: the agent itself). */
export const userField = (user: string | undefined): FieldInput[] =>
  user === undefined ? [] : [[Tag.USER, user]];

/** Reads a whole file, refusing one larger than `maxBytes` (the guest decides the size). */
export async function readFile(
  conn: AgentConnection,
  path: string,
  opts: { maxBytes?: number; timeoutMs?: number; user?: string } = {},
): Promise<Buffer> {
  const max = opts.maxBytes ?? 256 << 20;
  const chunks: Buffer[] = [];
  let total = 0;
  await readFileStream(
    conn,
    path,
    (chunk) => {
      total += chunk.length;
      if (total > max) throw new ForkdError("resource_exhausted", `file ${path} is larger than ${max} bytes`);
      chunks.push(Buffer.from(chunk));
    },
    opts.timeoutMs,
    opts.user,
  );
  return Buffer.concat(chunks, total);
}

/**
 * Streams a file's bytes to `onChunk` (which paces the read by returning a promise, see
 * ExecHandlers); resolves with its size. `timeoutMs` bounds each wait for the guest: it runs
 * while the consumer is ready for more and restarts with every chunk. An exception or a
 * rejected promise from `onChunk` ends the read with that error.
 */
export function readFileStream(
  conn: AgentConnection,
  path: string,
  onChunk: (chunk: Buffer) => Consumed,
  timeoutMs = 120_000,
  user?: string,
): Promise<number> {
  return new Promise<number>((resolve, reject) => {
    let stream = 0;
    let over = false;
    const flow = conn.flow(
      () => stream,
      (f) => (f.full ? timer.pause() : timer.resume()),
    );
    const finish = (err: Error | null, size?: number) => {
      if (over) return;
      over = true;
      timer.clear();
      flow.end();
      conn.end(stream);
      if (err) reject(err);
      else resolve(size ?? 0);
    };
    const stop = (err: Error) => {
      conn.abandon(stream);
      finish(err);
    };
    const timer = new PausableTimer(timeoutMs, () =>
      stop(new ForkdError("timeout", `reading ${path}: the guest sent nothing for ${timeoutMs} ms`)),
    );
    try {
      stream = conn.open((f) => {
        if (f instanceof ForkdError) return finish(f);
        if (f.type === Msg.END) return finish(null, intField(f.fields, Tag.SIZE) ?? 0);
        if (f.type === Msg.ERROR) return finish(guestError(f.fields));
        if (f.type !== Msg.DATA) throw new ForkdError("agent_protocol", "unexpected frame in read");
        if (intField(f.fields, Tag.WINDOW) !== undefined) flow.paced = true;
        timer.restart();
        const d = field(f.fields, Tag.DATA) ?? Buffer.alloc(0);
        let r: Consumed;
        try {
          r = onChunk(d);
        } catch (e) {
          return stop(e instanceof Error ? e : new Error(String(e)));
        }
        if (isThenable(r))
          r = Promise.resolve(r).catch((e: unknown) => stop(e instanceof Error ? e : new Error(String(e))));
        flow.deliver(d.length, r);
      }, flow);
      conn.send(Msg.READ, stream, [[Tag.PATH, path], [Tag.WINDOW, WINDOW], ...userField(user)]);
    } catch (e) {
      finish(e instanceof ForkdError ? e : new ForkdError("internal", errorMessage(e)));
    }
  });
}

/**
 * Writes a file atomically in the guest (temp file, fsync, rename). At `timeoutMs` it stops
 * sending, tells the agent to drop the temporary file and closes `data`.
 */
export async function writeFile(
  conn: AgentConnection,
  path: string,
  data: Uint8Array | AsyncIterable<Uint8Array>,
  opts: { mode?: number; makeParents?: boolean; timeoutMs?: number; user?: string } = {},
): Promise<number> {
  const timeoutMs = opts.timeoutMs ?? 120_000;
  let stream = 0;
  let early: ForkdError | null = null;
  const done = new Promise<Field[]>((resolve, reject) => {
    const timer = setTimeout(() => {
      conn.abandon(stream);
      finish(new ForkdError("timeout", `writing ${path} timed out after ${timeoutMs} ms`));
    }, timeoutMs);
    const finish = (err: ForkdError | null, f?: Field[]) => {
      clearTimeout(timer);
      conn.end(stream);
      if (err) {
        early ??= err;
        reject(err);
      } else resolve(f ?? []);
    };
    try {
      stream = conn.open((f) => {
        if (f instanceof ForkdError) return finish(f);
        if (f.type === Msg.OK) return finish(null, f.fields);
        if (f.type === Msg.ERROR) return finish(guestError(f.fields));
        throw new ForkdError("agent_protocol", "unexpected frame in write");
      });
      const fields: FieldInput[] = [[Tag.PATH, path]];
      if (opts.mode !== undefined) fields.push([Tag.MODE, opts.mode]);
      if (opts.makeParents) fields.push([Tag.FLAGS, 1]);
      fields.push(...userField(opts.user));
      conn.send(Msg.WRITE_OPEN, stream, fields);
    } catch (e) {
      finish(e instanceof ForkdError ? e : new ForkdError("internal", errorMessage(e)));
    }
  });
  done.catch(() => undefined);
  // Settles when the write is over, whichever way (the guest's reply, its error, the deadline).
  const over = done.then(
    () => null,
    () => null,
  );
  const sendChunk = async (buf: Uint8Array) => {
    for (let off = 0; off < buf.length && !early; off += CHUNK) {
      if (!conn.send(Msg.WRITE_DATA, stream, [[Tag.DATA, buf.subarray(off, off + CHUNK)]]))
        await Promise.race([conn.drain(), over]);
    }
  };
  if (!early && data instanceof Uint8Array) await sendChunk(data);
  else if (!early && !(data instanceof Uint8Array)) {
    const it = data[Symbol.asyncIterator]();
    for (;;) {
      const next = await Promise.race([it.next(), over]);
      if (early || next === null || next.done) break;
      await sendChunk(next.value);
    }
    // Ended early: the rest of the upload is not wanted (closes the request body).
    if (early) void Promise.resolve(it.return?.()).catch(() => undefined);
  }
  if (!early && !conn.closed) conn.send(Msg.WRITE_END, stream);
  const f = await done;
  return intField(f, Tag.SIZE) ?? 0;
}

export async function stat(
  conn: AgentConnection,
  path: string,
  timeoutMs = DEFAULT_TIMEOUT_MS,
  user?: string,
): Promise<FileStat> {
  return toStat(await conn.request(Msg.STAT, [[Tag.PATH, path], ...userField(user)], timeoutMs));
}

export async function list(
  conn: AgentConnection,
  path: string,
  timeoutMs = DEFAULT_TIMEOUT_MS,
  user?: string,
): Promise<DirEntry[]> {
  const f = await conn.request(Msg.LIST, [[Tag.PATH, path], ...userField(user)], timeoutMs);
  const entries: DirEntry[] = [];
  let group: Field[] | null = null;
  const flush = () => {
    if (group) entries.push({ name: strField(group, Tag.NAME) ?? "", ...toStat(group) });
  };
  for (const x of f) {
    if (x.tag === Tag.NAME) {
      flush();
      group = [];
    }
    group?.push(x);
  }
  flush();
  return entries;
}

export async function mkdir(
  conn: AgentConnection,
  path: string,
  opts: { parents?: boolean; mode?: number; user?: string } = {},
  timeoutMs = DEFAULT_TIMEOUT_MS,
): Promise<void> {
  const fields: FieldInput[] = [[Tag.PATH, path], ...userField(opts.user)];
  if (opts.mode !== undefined) fields.push([Tag.MODE, opts.mode]);
  if (opts.parents) fields.push([Tag.FLAGS, 1]);
  await conn.request(Msg.MKDIR, fields, timeoutMs);
}

export async function remove(
  conn: AgentConnection,
  path: string,
  opts: { recursive?: boolean; user?: string } = {},
  timeoutMs = DEFAULT_TIMEOUT_MS,
): Promise<void> {
  const fields: FieldInput[] = [[Tag.PATH, path], ...userField(opts.user)];
  if (opts.recursive) fields.push([Tag.FLAGS, 1]);
  await conn.request(Msg.REMOVE, fields, timeoutMs);
}

export async function rename(
  conn: AgentConnection,
  from: string,
  to: string,
  timeoutMs = DEFAULT_TIMEOUT_MS,
  user?: string,
): Promise<void> {
  await conn.request(Msg.RENAME, [[Tag.PATH, from], [Tag.PATH2, to], ...userField(user)], timeoutMs);
}

/** Flushes the guest's filesystems (SYNC) so a snapshot of its disk is whole. */
export async function sync(conn: AgentConnection, timeoutMs = 60_000): Promise<void> {
  await conn.request(Msg.SYNC, [], timeoutMs);
}

function toStat(f: Field[]): FileStat {
  const t = intField(f, Tag.FILE_TYPE) ?? 4;
  return {
    type: FILE_TYPES[t as keyof typeof FILE_TYPES] ?? "other",
    size: intField(f, Tag.SIZE) ?? 0,
    mode: intField(f, Tag.MODE) ?? 0,
    mtimeMs: Math.floor((intField(f, Tag.MTIME_NS) ?? 0) / 1e6),
  };
}
