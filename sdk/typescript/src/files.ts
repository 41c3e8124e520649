/** `sandbox.files`: read and write (text, bytes, streams), list, stat, exists, remove, mkdir, rename. */
import { Readable } from "node:stream";
import type { ReadableStream as WebReadableStream } from "node:stream/web";
import { ForkdError, NotFoundError } from "./errors.js";
import type { Transport } from "./transport.js";
import type { DirListWire, FileStatWire } from "./types.js";

export type FileType = "file" | "dir" | "symlink" | "other";

export interface EntryInfo {
  name: string;
  path: string;
  type: FileType;
  size: number;
  /** Permission bits. */
  mode: number;
  modifiedTime: Date;
}

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
  return { name, path, type: s.type, size: s.size, mode: s.mode, modifiedTime: new Date(s.mtime_ms) };
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

export class Files {
  /** @internal */
  constructor(
    private readonly t: Transport,
    private readonly id: string,
  ) {}

  #path(rest: string): string {
    return `/v1/sandboxes/${this.id}/files${rest}`;
  }

  /** Reads a file as text (default), bytes, or a stream of bytes. */
  read(path: string, opts?: { format?: "text"; requestTimeoutMs?: number }): Promise<string>;
  read(path: string, opts: { format: "bytes"; requestTimeoutMs?: number }): Promise<Uint8Array>;
  read(path: string, opts: { format: "stream"; requestTimeoutMs?: number }): Promise<NodeJS.ReadableStream>;
  async read(
    path: string,
    opts: { format?: "text" | "bytes" | "stream"; requestTimeoutMs?: number } = {},
  ): Promise<string | Uint8Array | NodeJS.ReadableStream> {
    const o = { query: { path }, timeoutMs: opts.requestTimeoutMs ?? 0 };
    if (opts.format === "stream") return this.t.send("GET", this.#path(""), o);
    const buf = await this.t.bytes("GET", this.#path(""), o);
    return opts.format === "bytes" ? new Uint8Array(buf) : buf.toString("utf8");
  }

  /**
   * Writes a file (parent directories are created), replacing it atomically. Large data and
   * streams are sent as they are read, never held whole in memory by the daemon.
   */
  write(path: string, data: FileData, opts?: { mode?: number }): Promise<WriteInfo>;
  write(files: WriteEntry[]): Promise<WriteInfo[]>;
  async write(
    pathOrFiles: string | WriteEntry[],
    data?: FileData,
    opts: { mode?: number } = {},
  ): Promise<WriteInfo | WriteInfo[]> {
    if (Array.isArray(pathOrFiles)) {
      const out: WriteInfo[] = [];
      for (const f of pathOrFiles) out.push(await this.write(f.path, f.data));
      return out;
    }
    if (data === undefined) throw new ForkdError("files.write: no data", { code: "invalid_argument" });
    const r = await this.t.json<{ path: string; size: number }>("PUT", this.#path(""), {
      query: { path: pathOrFiles, parents: 1, ...(opts.mode !== undefined ? { mode: opts.mode } : {}) },
      body: await toBody(data),
      timeoutMs: 0,
    });
    return { name: baseName(r.path), path: r.path, type: "file", size: r.size };
  }

  async list(path: string): Promise<EntryInfo[]> {
    const r = await this.t.json<DirListWire>("GET", this.#path("/list"), { query: { path } });
    return r.entries.map((e) => toEntry(joinPath(path, e.name), e, e.name));
  }

  async getInfo(path: string): Promise<EntryInfo> {
    const s = await this.t.json<FileStatWire>("GET", this.#path("/stat"), { query: { path } });
    return toEntry(path, s);
  }

  async exists(path: string): Promise<boolean> {
    try {
      await this.getInfo(path);
      return true;
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  }

  /** Removes a file, or a directory with everything in it. */
  async remove(path: string): Promise<void> {
    await this.t.json("DELETE", this.#path(""), { query: { path, recursive: 1 } });
  }

  /** Creates a directory and its parents. False if it already existed. */
  async makeDir(path: string): Promise<boolean> {
    if (await this.exists(path)) return false;
    try {
      await this.t.json("POST", this.#path("/mkdir"), { json: { path, parents: true } });
      return true;
    } catch (e) {
      // Created meanwhile by someone else.
      if (e instanceof ForkdError && (e.code === "conflict" || /exists/i.test(e.message))) return false;
      throw e;
    }
  }

  async rename(oldPath: string, newPath: string): Promise<EntryInfo> {
    await this.t.json("POST", this.#path("/rename"), { json: { from: oldPath, to: newPath } });
    return this.getInfo(newPath);
  }
}
