/**
 * `sandbox.files`: read and write (text, bytes, streams, batches), list, stat, exists, remove,
 * mkdir, rename, watch, download and upload URLs. Relative paths resolve against the user's home.
 */
import { Readable } from "node:stream";
import { createGzip, gzipSync } from "node:zlib";
import type { ReadableStream as WebReadableStream } from "node:stream/web";
import { ForkdError, NotFoundError } from "./errors.js";
import { execOutput } from "./layout.js";
import type { Layout } from "./layout.js";
import type { Transport } from "./transport.js";
import type { DirListWire, FileStatWire } from "./types.js";
import { WatchHandle } from "./watch.js";
import type { FilesystemEvent } from "./watch.js";

/** E2B's FileType; its values are forkd's strings. */
export const FileType = { FILE: "file", DIR: "dir", SYMLINK: "symlink", OTHER: "other" } as const;
export type FileType = (typeof FileType)[keyof typeof FileType];

/** E2B's EntryInfo (owner, group and symlinkTarget where forkd could read them: getInfo). */
export interface EntryInfo {
  name: string;
  path: string;
  type: FileType;
  /** Bytes (0 for a directory, as E2B). */
  size: number;
  /** Permission bits. */
  mode: number;
  /** `ls -l`'s permission string, e.g. "-rw-r--r--". */
  permissions: string;
  owner?: string;
  group?: string;
  modifiedTime: Date;
  symlinkTarget?: string;
}

/** `ls -l`'s permission string of a type and mode. */
export function permissionsOf(type: FileType, mode: number): string {
  const kind = type === "dir" ? "d" : type === "symlink" ? "l" : "-";
  let out = kind;
  for (const shift of [6, 3, 0]) {
    const b = (mode >> shift) & 7;
    out += (b & 4 ? "r" : "-") + (b & 2 ? "w" : "-") + (b & 1 ? "x" : "-");
  }
  return out;
}

const quote = (s: string): string => `'${s.replace(/'/g, `'\\''`)}'`;

export interface WriteInfo {
  name: string;
  path: string;
  type: "file";
  size: number;
}

export type FileData =
  string | Uint8Array | ArrayBuffer | Blob | NodeJS.ReadableStream | ReadableStream<Uint8Array>;

export interface WriteEntry {
  path: string;
  data: FileData;
}

const baseName = (p: string): string => p.replace(/\/+$/, "").split("/").pop() ?? p;
const joinPath = (dir: string, name: string): string => (dir.endsWith("/") ? dir + name : `${dir}/${name}`);

function toEntry(path: string, s: Omit<FileStatWire, "path">, name = baseName(path)): EntryInfo {
  return {
    name,
    path,
    type: s.type,
    size: s.type === "dir" ? 0 : s.size,
    mode: s.mode,
    permissions: permissionsOf(s.type, s.mode),
    modifiedTime: new Date(s.mtime_ms),
  };
}

async function toBody(data: FileData): Promise<Uint8Array | NodeJS.ReadableStream> {
  if (typeof data === "string") return Buffer.from(data, "utf8");
  if (data instanceof Uint8Array) return data;
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  if (typeof Blob !== "undefined" && data instanceof Blob) return new Uint8Array(await data.arrayBuffer());
  if (typeof (data as ReadableStream<Uint8Array>).getReader === "function") {
    return Readable.fromWeb(data as WebReadableStream<Uint8Array>);
  }
  return data as NodeJS.ReadableStream;
}

/** Options of a file operation: the user it acts as (its home is where relative paths start). */
export interface FileOpts {
  user?: string;
  requestTimeoutMs?: number;
}

export class Files {
  /** @internal */
  constructor(
    private readonly t: Transport,
    private readonly id: string,
    private readonly layout: Layout | null = null,
  ) {}

  #path(rest: string): string {
    return `/v1/sandboxes/${this.id}/files${rest}`;
  }

  #abs(path: string, user?: string): Promise<string> {
    return this.layout ? this.layout.resolve(path, user) : Promise.resolve(path);
  }

  /** Hands files forkd's agent wrote (as root) to the user they were written for. */
  async #chown(paths: string[], user?: string): Promise<void> {
    if (!this.layout || paths.length === 0) return;
    const owner = user ?? (await this.layout.user());
    if (owner === "root" || owner === "0") return;
    await execOutput(this.t, this.id, `chown ${quote(owner)}: -- ${paths.map(quote).join(" ")}`);
  }

  /** Reads a file as text (default), bytes, or a stream of bytes. */
  read(path: string, opts?: FileOpts & { format?: "text" }): Promise<string>;
  read(path: string, opts: FileOpts & { format: "bytes" }): Promise<Uint8Array>;
  read(path: string, opts: FileOpts & { format: "blob" }): Promise<Blob>;
  read(path: string, opts: FileOpts & { format: "stream" }): Promise<NodeJS.ReadableStream>;
  async read(
    path: string,
    opts: FileOpts & { format?: "text" | "bytes" | "blob" | "stream" } = {},
  ): Promise<string | Uint8Array | Blob | NodeJS.ReadableStream> {
    const o = { query: { path: await this.#abs(path, opts.user) }, timeoutMs: opts.requestTimeoutMs ?? 0 };
    if (opts.format === "stream") return this.t.send("GET", this.#path(""), o);
    const buf = await this.t.bytes("GET", this.#path(""), o);
    if (opts.format === "blob") return new Blob([new Uint8Array(buf)]);
    return opts.format === "bytes" ? new Uint8Array(buf) : buf.toString("utf8");
  }

  async #put(path: string, data: FileData | undefined, mode?: number, gzip = false): Promise<WriteInfo> {
    if (data === undefined) throw new ForkdError("files.write: no data", { code: "invalid_argument" });
    const raw = await toBody(data);
    // gzip: sent compressed (Content-Encoding: gzip), the daemon decompresses it
    const body = !gzip ? raw : raw instanceof Uint8Array ? gzipSync(raw) : raw.pipe(createGzip());
    const r = await this.t.json<{ path: string; size: number }>("PUT", this.#path(""), {
      query: { path, parents: 1, ...(mode !== undefined ? { mode } : {}) },
      body,
      ...(gzip ? { headers: { "content-encoding": "gzip" } } : {}),
      timeoutMs: 0,
    });
    return { name: baseName(r.path), path: r.path, type: "file", size: r.size };
  }

  /**
   * Writes a file (parent directories are created), replacing it atomically, owned by the user
   * (default: the sandbox's). Large data and streams are sent as they are read (always an
   * octet-stream body: E2B's useOctetStream is what forkd always does). `gzip`: the body is sent
   * gzip-compressed (Content-Encoding: gzip), as E2B's option.
   */
  write(
    path: string,
    data: FileData,
    opts?: FileOpts & { mode?: number; useOctetStream?: boolean; gzip?: boolean },
  ): Promise<WriteInfo>;
  write(files: WriteEntry[], opts?: FileOpts & { gzip?: boolean }): Promise<WriteInfo[]>;
  async write(
    pathOrFiles: string | WriteEntry[],
    data?: FileData | (FileOpts & { gzip?: boolean }),
    opts: FileOpts & { mode?: number; gzip?: boolean } = {},
  ): Promise<WriteInfo | WriteInfo[]> {
    if (Array.isArray(pathOrFiles)) return this.writeFiles(pathOrFiles, (data as FileOpts | undefined) ?? {});
    const info = await this.#put(
      await this.#abs(pathOrFiles, opts.user),
      data as FileData | undefined,
      opts.mode,
      opts.gzip,
    );
    await this.#chown([info.path], opts.user);
    return info;
  }

  /** Writes several files; their WriteInfo in order. */
  async writeFiles(files: WriteEntry[], opts: FileOpts & { gzip?: boolean } = {}): Promise<WriteInfo[]> {
    const out: WriteInfo[] = [];
    for (const f of files) {
      out.push(await this.#put(await this.#abs(f.path, opts.user), f.data, undefined, opts.gzip));
    }
    await this.#chown(
      out.map((i) => i.path),
      opts.user,
    );
    return out;
  }

  /** A directory's entries; `depth` > 1 descends into subdirectories (E2B's depth). */
  async list(path: string, opts: FileOpts & { depth?: number } = {}): Promise<EntryInfo[]> {
    const abs = await this.#abs(path, opts.user);
    const r = await this.t.json<DirListWire>("GET", this.#path("/list"), { query: { path: abs } });
    const out: EntryInfo[] = [];
    for (const e of r.entries) {
      const entry = toEntry(joinPath(abs, e.name), e, e.name);
      out.push(entry);
      if ((opts.depth ?? 1) > 1 && entry.type === "dir")
        out.push(...(await this.list(entry.path, { depth: (opts.depth ?? 1) - 1 })));
    }
    return out;
  }

  /** E2B's EntryInfo of a path, owner and group included (NotFoundError if it is not there). */
  async getInfo(path: string, opts: FileOpts = {}): Promise<EntryInfo> {
    const abs = await this.#abs(path, opts.user);
    const s = await this.t.json<FileStatWire>("GET", this.#path("/stat"), { query: { path: abs } });
    const info = toEntry(abs, s);
    // owner, group, link target: what the REST stat does not carry, asked of the guest
    const lines = (
      await execOutput(this.t, this.id, `stat -c '%U:%G' -- ${quote(abs)}; readlink -- ${quote(abs)} || true`)
    ).split("\n");
    const [owner, group] = (lines[0] ?? "").split(":");
    if (owner && group !== undefined) Object.assign(info, { owner, group });
    if (info.type === "symlink" && lines[1]) info.symlinkTarget = lines[1];
    return info;
  }

  async exists(path: string, opts: FileOpts = {}): Promise<boolean> {
    try {
      await this.t.json("GET", this.#path("/stat"), { query: { path: await this.#abs(path, opts.user) } });
      return true;
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  }

  /** Removes a file, or a directory with everything in it. */
  async remove(path: string, opts: FileOpts = {}): Promise<void> {
    await this.t.json("DELETE", this.#path(""), {
      query: { path: await this.#abs(path, opts.user), recursive: 1 },
    });
  }

  /** Creates a directory and its parents, owned by the user. False if it already existed. */
  async makeDir(path: string, opts: FileOpts = {}): Promise<boolean> {
    const abs = await this.#abs(path, opts.user);
    if (await this.exists(abs)) return false;
    try {
      await this.t.json("POST", this.#path("/mkdir"), { json: { path: abs, parents: true } });
    } catch (e) {
      // Created meanwhile by someone else.
      if (e instanceof ForkdError && (e.code === "conflict" || /exists/i.test(e.message))) return false;
      throw e;
    }
    await this.#chown([abs], opts.user);
    return true;
  }

  async rename(oldPath: string, newPath: string, opts: FileOpts = {}): Promise<EntryInfo> {
    const from = await this.#abs(oldPath, opts.user);
    const to = await this.#abs(newPath, opts.user);
    await this.t.json("POST", this.#path("/rename"), { json: { from, to } });
    return toEntry(to, await this.t.json<FileStatWire>("GET", this.#path("/stat"), { query: { path: to } }));
  }

  /**
   * Watches a directory (E2B's watchDir): `onEvent` gets each FilesystemEvent (name relative to
   * the directory); stop() ends it. Needs the daemon's GET /v1/sandboxes/{id}/files/watch.
   */
  async watchDir(
    path: string,
    onEvent: (e: FilesystemEvent) => void | Promise<void>,
    opts: FileOpts & { recursive?: boolean; onExit?: (err?: Error) => void } = {},
  ): Promise<WatchHandle> {
    const abs = await this.#abs(path, opts.user);
    return WatchHandle.start(
      this.t,
      this.#path("/watch"),
      abs,
      opts.recursive ?? false,
      onEvent,
      opts.onExit,
    );
  }

  /** A URL the file downloads from: the daemon's own file route (with its token; no signed URLs). */
  async downloadUrl(path: string, opts: FileOpts = {}): Promise<string> {
    return `${this.t.baseUrl}${this.#path("")}?${new URLSearchParams({ path: await this.#abs(path, opts.user) }).toString()}`;
  }

  /** A URL a PUT of the file's bytes writes it at (the daemon's own file route). */
  async uploadUrl(path = "", opts: FileOpts = {}): Promise<string> {
    return this.downloadUrl(path, opts);
  }
}
