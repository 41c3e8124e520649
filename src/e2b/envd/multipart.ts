/**
 * The file parts of a multipart/form-data body, streamed one at a time (busboy): each part is
 * read straight into its consumer, never held whole; header sizes (busboy's own 16 KiB bound),
 * header pairs, part and field counts are bounded, and a body that ends or fails mid-part fails
 * that part's stream, so a half-sent file is never taken for a whole one.
 */
import type { Readable } from "node:stream";
import busboy from "busboy";
import { ForkdError, errorMessage } from "../../util/index.js";

export interface FilePart {
  /** The part's filename (its full path: E2B's SDK names each file so), "" when it has none. */
  filename: string;
  /** Its bytes; a body that ends or fails mid-part fails this with why (a ForkdError). */
  data: AsyncIterable<Uint8Array>;
}

export interface MultipartLimits {
  files: number;
}

const MAX_FIELDS = 100;
const MAX_FIELD_SIZE = 64 << 10;
const MAX_HEADER_PAIRS = 32;

/** The body's file parts in order; the next one is parsed once the last was read (or skipped). */
export async function* fileParts(
  body: Readable,
  contentType: string,
  limits: MultipartLimits,
): AsyncGenerator<FilePart> {
  let bb: busboy.Busboy;
  try {
    bb = busboy({
      headers: { "content-type": contentType },
      preservePath: true,
      defParamCharset: "utf8",
      limits: {
        files: limits.files,
        fields: MAX_FIELDS,
        parts: limits.files + MAX_FIELDS,
        fieldSize: MAX_FIELD_SIZE,
        headerPairs: MAX_HEADER_PAIRS,
      },
    });
  } catch {
    throw new ForkdError("invalid_argument", "unreadable multipart body (no boundary?)");
  }
  const queue: { filename: string; stream: Readable }[] = [];
  let current: Readable | null = null;
  let failure: Error | null = null;
  let ended = false;
  let wake: (() => void) | null = null;
  const notify = () => {
    const w = wake;
    wake = null;
    w?.();
  };
  const why = (e: unknown): Error =>
    e instanceof ForkdError
      ? e
      : new ForkdError("invalid_argument", `unreadable multipart body: ${errorMessage(e)}`);
  async function* dataOf(stream: Readable): AsyncGenerator<Uint8Array> {
    try {
      for await (const chunk of stream as AsyncIterable<Uint8Array>) yield chunk;
    } catch (e) {
      throw failure ?? why(e);
    }
    if (failure !== null) throw failure;
  }
  const fail = (e: unknown) => {
    if (failure !== null) return;
    failure = why(e);
    current?.destroy(failure);
    for (const p of queue) p.stream.destroy(failure);
    const t = taken;
    taken = null;
    t?.();
    notify();
  };
  bb.on("error", () => undefined); // seen by pipeline's callback
  bb.on("file", (_name, stream, info) => {
    stream.on("error", () => undefined); // its reader sees it (dataOf), or nobody needs to
    stream.on("limit", () => fail(new ForkdError("payload_too_large", "a file part is too large")));
    queue.push({ filename: info.filename ?? "", stream });
    notify();
  });
  bb.on("field", () => undefined);
  bb.on("filesLimit", () => fail(new ForkdError("invalid_argument", `more than ${limits.files} files`)));
  bb.on("partsLimit", () => fail(new ForkdError("invalid_argument", "too many parts")));
  bb.on("fieldsLimit", () => fail(new ForkdError("invalid_argument", "too many fields")));
  bb.on("close", () => {
    ended = true;
    notify();
  });
  // Fed by hand, not piped: a part that fits in its stream's buffer gives the parser no
  // back-pressure, so the feeder also waits while a part is queued that nobody reads yet.
  let taken: (() => void) | null = null;
  const settled = (): Promise<void> =>
    new Promise((resolve) => {
      const done = () => {
        bb.off("drain", done);
        bb.off("close", done);
        resolve();
      };
      bb.once("drain", done);
      bb.once("close", done);
    });
  const feed = async () => {
    for await (const chunk of body as AsyncIterable<Uint8Array>) {
      if (failure !== null || bb.destroyed) return;
      if (!bb.write(chunk)) await settled();
      while (queue.length > 0 && failure === null && !bb.destroyed)
        await new Promise<void>((resolve) => (taken = resolve));
    }
    bb.end();
  };
  feed().catch(fail);
  try {
    for (;;) {
      const failed = failure as Error | null;
      if (failed !== null) throw failed;
      const next = queue.shift();
      const t = taken as (() => void) | null;
      taken = null;
      t?.();
      if (next) {
        current = next.stream;
        yield { filename: next.filename, data: dataOf(next.stream) };
        // A part its consumer did not read is skipped, so the parser goes on to the next.
        if (!next.stream.readableEnded) next.stream.resume();
        await new Promise<void>((resolve) => {
          if (next.stream.readableEnded || next.stream.destroyed) return resolve();
          next.stream.once("end", resolve);
          next.stream.once("close", resolve);
        });
        current = null;
        continue;
      }
      if (ended) return;
      await new Promise<void>((resolve) => (wake = resolve));
    }
  } finally {
    // However it ends (a part refused, a failure), the body is let go (files-http.ts drains it).
    body.unpipe(bb);
    body.destroy();
    bb.destroy();
  }
}
