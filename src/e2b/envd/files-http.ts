/**
 * envd's HTTP file routes: GET /files downloads a file (streamed, paced by the client, gzip
 * when asked), POST /files uploads one as application/octet-stream (also gzip-encoded) or
 * several as multipart/form-data (streamed part by part), replacing each atomically and
 * creating its parents. Paths resolve against the user's home (`username`, else the Basic user,
 * else `user`), and each file is read and written as that user, as commands run: the guest
 * agent opens it with the user's credentials (USER on READ and WRITE_OPEN), so a file the user
 * may not read is refused (403, EACCES) and one written is the user's (the parents it needed
 * too). An agent older than that is driven through helper commands run as the user instead.
 *
 * A signed URL (a `signature` parameter: the SDK's downloadUrl/uploadUrl, checked by auth.ts)
 * does exactly what was signed: it acts as the signed `username` (a Basic header is ignored)
 * and, when a `path` was signed, every part of an upload goes to that path (as E2B's envd).
 * A client that hangs up or stalls mid-body ends the upload (and its lease) at once.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { posix } from "node:path";
import { PassThrough, Readable } from "node:stream";
import { createGunzip, createGzip } from "node:zlib";
import type { AgentClient } from "../../agent/index.js";
import type { Lease } from "../../sandbox/index.js";
import { ForkdError, errorMessage } from "../../util/index.js";
import type { Account } from "./accounts.js";
import { agentUser, requestedUser, resolvePath } from "./accounts.js";
import type { EnvdState } from "./context.js";
import { findEntries } from "./entry-info.js";
import { httpError } from "./errors.js";
import { helperExec, helperSh } from "./helper-env.js";
import { fileParts } from "./multipart.js";

const MAX_FILES = 1000;
/** An upload whose client sends nothing for this long is ended. */
export const BODY_IDLE_MS = 60_000;

function sendJson(res: ServerResponse, status: number, body: unknown): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const text = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
  res.end(text);
}

export function sendError(res: ServerResponse, e: unknown): void {
  const { status, body } = httpError(e);
  sendJson(res, status, body);
}

/**
 * The request body, decoded: failing with payload_too_large past `max` bytes (after decoding),
 * and ending the request when its client waits more than `idleMs` between chunks. A client
 * that hangs up fails it at once. Left early (a part refused), the rest of the body is read
 * and dropped so the reply reaches the client; past `max`, the request is cut instead.
 */
async function* bodyOf(
  req: IncomingMessage,
  gzip: boolean,
  max: number,
  idleMs: number,
): AsyncGenerator<Uint8Array> {
  const target = gzip ? createGunzip() : new PassThrough();
  const onError = (e: Error) => target.destroy(e);
  const onClose = () => {
    if (!req.complete) target.destroy(new ForkdError("unavailable", "the client went away mid-upload"));
  };
  req.once("error", onError);
  req.once("close", onClose);
  req.pipe(target);
  const it = (target as AsyncIterable<Uint8Array>)[Symbol.asyncIterator]();
  let size = 0;
  let cut = false;
  try {
    for (;;) {
      const timer = setTimeout(
        () => req.destroy(new ForkdError("timeout", `the upload sent nothing for ${idleMs / 1000} s`)),
        idleMs,
      );
      let r: IteratorResult<Uint8Array>;
      try {
        r = await it.next();
      } catch (e) {
        cut = true;
        if (e instanceof ForkdError) throw e;
        if (/^Z_/.test(String((e as { code?: unknown }).code)))
          throw new ForkdError("invalid_argument", "the gzip body is corrupt");
        throw new ForkdError("unavailable", "the client went away mid-upload");
      } finally {
        clearTimeout(timer);
      }
      if (r.done) return;
      size += r.value.length;
      if (size > max) {
        cut = true;
        throw new ForkdError("payload_too_large", `upload is larger than ${max} bytes`);
      }
      yield r.value;
    }
  } finally {
    req.off("error", onError);
    req.off("close", onClose);
    req.unpipe(target);
    target.destroy();
    if (!req.complete && !req.destroyed) {
      if (cut) req.destroy();
      else drain(req, max, idleMs);
    }
  }
}

/** Reads and drops the rest of a request (at most `max` bytes, never idle past `idleMs`). */
function drain(req: IncomingMessage, max: number, idleMs: number): void {
  let n = 0;
  req.on("error", () => undefined);
  req.on("data", (d: Buffer) => {
    n += d.length;
    if (n > max) req.destroy();
  });
  req.setTimeout(idleMs, () => req.destroy());
  req.resume();
}

/**
 * Writes one file as `account`: by the agent as that user (the kernel checks the directory, and
 * the file and the parents it made are the user's). An agent older than that writes as root
 * after a check run as the user, then gives the file to the user.
 */
async function writeAs(
  agent: AgentClient,
  account: Account,
  path: string,
  data: AsyncIterable<Uint8Array> | Uint8Array,
): Promise<void> {
  if (path.endsWith("/") || path === "/")
    throw new ForkdError("invalid_argument", `path ${path} is a directory`);
  const user = await agentUser(agent, account);
  if (user !== null) {
    await agent.writeFile(path, data, { makeParents: true, user });
    return;
  }
  await helperSh(
    agent,
    account.name,
    'd=$(dirname -- "$1"); [ -d "$d" ] || mkdir -p -- "$d" || exit 1; ' +
      '[ -w "$d" ] || { echo "$d: Permission denied" >&2; exit 1; }; ' +
      '[ ! -e "$1" ] || [ -w "$1" ] || { echo "$1: Permission denied" >&2; exit 1; }',
    [path],
  );
  await agent.writeFile(path, data, { makeParents: true });
  await helperSh(agent, "root", 'chown -h -- "$2:$3" "$1"', [path, String(account.uid), String(account.gid)]);
}

/** A file to download: what it is, and its bytes to a paced consumer (resolves once all are sent). */
interface Source {
  stat(): Promise<{ type: "file" | "dir" | "other"; size: number }>;
  read(onChunk: (chunk: Buffer) => Promise<void> | undefined): Promise<void>;
}

/** The agent reads it, as `user` (undefined: root). */
function agentSource(agent: AgentClient, path: string, user: string | undefined): Source {
  return {
    async stat() {
      const st = await agent.stat(path, undefined, user);
      return { type: st.type === "file" || st.type === "dir" ? st.type : "other", size: st.size };
    },
    async read(onChunk) {
      await agent.readFileStream(path, onChunk, undefined, user);
    },
  };
}

/** An agent that acts only as root on files: `cat` run as the user reads it. */
function helperSource(agent: AgentClient, path: string, user: string): Source {
  return {
    async stat() {
      const [f] = await findEntries(agent, user, path, 0);
      const t = f?.typeChar;
      return { type: t === "f" ? "file" : t === "d" ? "dir" : "other", size: Number(f?.entry.size ?? 0) };
    },
    async read(onChunk) {
      let err = "";
      // The consumer's failure (its client gone): set from the handlers, read after the exit.
      const out: { failed: Error | null } = { failed: null };
      const stop = (e: unknown) => {
        out.failed ??= e instanceof Error ? e : new Error(errorMessage(e));
        h.signal(9);
      };
      const h = agent.exec(helperExec({ argv: ["cat", "--", path], user }), {
        onStdout: (d) => {
          if (out.failed) return undefined;
          try {
            const r = onChunk(d);
            return r?.catch(stop);
          } catch (e) {
            stop(e);
            return undefined;
          }
        },
        onStderr: (d) => void (err.length < 4096 && (err += d.toString("utf8"))),
      });
      const r = await h.result;
      if (out.failed) throw out.failed;
      if (r.exitCode === 0) return;
      if (/Permission denied/.test(err))
        throw new ForkdError("forbidden", `open ${path}: Permission denied`, { errno_name: "EACCES" });
      throw new ForkdError("guest_error", err.trim().slice(0, 500) || `reading ${path} failed`);
    },
  };
}

const entry = (path: string) => ({ name: posix.basename(path), type: "file", path });

export async function download(
  st: EnvdState,
  req: IncomingMessage,
  res: ServerResponse,
  url: URL,
  lease: Lease,
  sandboxId: string,
): Promise<void> {
  const account = await st.accounts.resolve(sandboxId, lease.agent, userOf(req, url));
  const path = resolvePath(url.searchParams.get("path") ?? "", account);
  const user = await agentUser(lease.agent, account);
  const src =
    user === null ? helperSource(lease.agent, path, account.name) : agentSource(lease.agent, path, user);
  const info = await src.stat();
  if (info.type === "dir") throw new ForkdError("invalid_argument", `path ${path} is a directory`);
  if (info.type !== "file") throw new ForkdError("invalid_argument", `path ${path} is not a regular file`);
  const gzip = /\bgzip\b/.test(String(req.headers["accept-encoding"] ?? "")) && info.size > 0;
  const headers: Record<string, string | number> = {
    "content-type": "application/octet-stream",
    "content-disposition": `attachment; filename=${encodeURIComponent(posix.basename(path))}`,
  };
  if (gzip) headers["content-encoding"] = "gzip";
  else if (info.size === 0) headers["content-length"] = 0;
  let gone = false;
  res.on("close", () => {
    if (!res.writableFinished) gone = true;
  });
  const out = gzip ? createGzip() : null;
  if (out) {
    out.pipe(res);
    out.on("error", () => res.destroy());
  }
  const sink = out ?? res;
  let started = false;
  try {
    await src.read((chunk) => {
      if (gone) throw new ForkdError("unavailable", "the client went away");
      if (!started) {
        res.writeHead(200, headers);
        started = true;
      }
      if (sink.write(chunk)) return undefined;
      return new Promise<void>((resolve, reject) => {
        const check = () => {
          sink.off("drain", check);
          res.off("close", check);
          if (gone) reject(new ForkdError("unavailable", "the client went away"));
          else resolve();
        };
        sink.on("drain", check);
        res.on("close", check);
      });
    });
  } catch (e) {
    if (started) res.destroy();
    throw e;
  }
  if (!started) res.writeHead(200, headers);
  sink.end();
}

/** Upload: octet-stream (one file at `path`) or multipart (each part's filename, or `path`). */
export async function upload(
  st: EnvdState,
  req: IncomingMessage,
  res: ServerResponse,
  url: URL,
  lease: Lease,
  sandboxId: string,
): Promise<void> {
  const idleMs = st.bodyIdleMs ?? BODY_IDLE_MS;
  const account = await st.accounts.resolve(sandboxId, lease.agent, userOf(req, url));
  const max = st.s.limits.body.upload;
  const type = String(req.headers["content-type"] ?? "");
  const encoding = String(req.headers["content-encoding"] ?? "identity").toLowerCase();
  if (encoding !== "identity" && encoding !== "gzip")
    throw new ForkdError("invalid_argument", `content-encoding ${encoding} is not supported (gzip is)`);
  const declared = Number(req.headers["content-length"] ?? "0");
  if (declared > max) throw new ForkdError("payload_too_large", `upload is larger than ${max} bytes`);
  const queryPath = url.searchParams.get("path");
  const body = () => bodyOf(req, encoding === "gzip", max, idleMs);
  if (/^multipart\/form-data/i.test(type)) {
    // A signed URL's path is the only one it may write; unsigned, a lone part goes to `path`.
    const pinned = signed(url) && queryPath ? queryPath : null;
    const written = [];
    let count = 0;
    for await (const part of fileParts(Readable.from(body()), type, { files: MAX_FILES })) {
      count++;
      const target = pinned ?? (part.filename || queryPath);
      if (!target) throw new ForkdError("invalid_argument", "a file without a path");
      const path = resolvePath(target, account);
      await writeAs(lease.agent, account, path, part.data);
      written.push(entry(path));
    }
    if (count === 0) throw new ForkdError("invalid_argument", "no file in the multipart body");
    return sendJson(res, 200, written);
  }
  if (!queryPath) throw new ForkdError("invalid_argument", "path is required for an octet-stream upload");
  const path = resolvePath(queryPath, account);
  await writeAs(lease.agent, account, path, body());
  sendJson(res, 200, [entry(path)]);
}

/** Whether the request is a signed URL's (auth.ts let it in on its signature, or it has one). */
const signed = (url: URL): boolean => url.searchParams.has("signature");

/** Who the request acts as: a signed URL's `username` only; else Basic, else `username`. */
function userOf(req: IncomingMessage, url: URL): string | null {
  const username = url.searchParams.get("username");
  return requestedUser(signed(url) ? undefined : req.headers.authorization, username);
}
