/**
 * A Connect request's binary (protobuf) messages decoded once before @connectrpc/connect reads
 * them, so that one that does not decode is the caller's error: `invalid_argument` (HTTP 400 for
 * a unary call, the end-of-stream or trailer error of a stream), where the library answers
 * `internal` (it names its own decoding failures so, for replies and requests alike). The body
 * is passed on unchanged: a unary message whole, a stream envelope by envelope as each arrives
 * (a client stream is not held back). What this does not judge goes on untouched for the
 * library to refuse in its own way: JSON, compressed messages, a message past the read bound,
 * a broken envelope.
 */
import { fromBinary } from "@bufbuild/protobuf";
import type { DescMessage } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";

/** How a request's content type frames its binary messages (null: not binary, not judged). */
export function binaryFraming(contentType: string | null | undefined): "unary" | "envelopes" | null {
  const type = (contentType ?? "").split(";")[0]!.trim().toLowerCase();
  if (type === "application/proto") return "unary";
  if (
    type === "application/connect+proto" ||
    type === "application/grpc-web" ||
    type === "application/grpc-web+proto" ||
    type === "application/grpc" ||
    type === "application/grpc+proto"
  )
    return "envelopes";
  return null;
}

function decodes(schema: DescMessage, data: Uint8Array): void {
  try {
    fromBinary(schema, data);
  } catch (e) {
    const m = e instanceof Error ? e.message : String(e);
    throw new ConnectError(`the request message does not decode: ${m}`, Code.InvalidArgument);
  }
}

const concat = (parts: Uint8Array[]): Uint8Array => (parts.length === 1 ? parts[0]! : Buffer.concat(parts));

/** A unary body: gathered (up to maxBytes), decoded, then passed on as one chunk. */
async function* unary(
  body: AsyncIterable<Uint8Array>,
  schema: DescMessage,
  maxBytes: number,
  compressed: boolean,
): AsyncGenerator<Uint8Array> {
  const parts: Uint8Array[] = [];
  let size = 0;
  const it = body[Symbol.asyncIterator]();
  for (;;) {
    const r = await it.next();
    if (r.done) break;
    parts.push(r.value);
    size += r.value.byteLength;
    if (size > maxBytes) {
      // Past the bound: the library refuses it (resource_exhausted); the rest as it comes.
      yield concat(parts);
      for (let n = await it.next(); !n.done; n = await it.next()) yield n.value;
      return;
    }
  }
  const whole = concat(parts);
  if (!compressed) decodes(schema, whole);
  yield whole;
}

/** A stream of envelopes (flags byte, 32-bit length, message): each plain message decoded. */
async function* envelopes(
  body: AsyncIterable<Uint8Array>,
  schema: DescMessage,
  maxBytes: number,
): AsyncGenerator<Uint8Array> {
  let buf: Uint8Array = new Uint8Array(0);
  const it = body[Symbol.asyncIterator]();
  for (;;) {
    const r = await it.next();
    if (r.done) break;
    buf = buf.byteLength === 0 ? r.value : concat([buf, r.value]);
    while (buf.byteLength >= 5) {
      const flags = buf[0]!;
      const len = new DataView(buf.buffer, buf.byteOffset, buf.byteLength).getUint32(1);
      if (len > maxBytes) {
        // The library refuses it; nothing more is judged here.
        yield buf;
        for (let n = await it.next(); !n.done; n = await it.next()) yield n.value;
        return;
      }
      if (buf.byteLength < 5 + len) break;
      const envelope = buf.subarray(0, 5 + len);
      // Flag 0x01: compressed (the library inflates it); 0x02: the end of the stream.
      if (flags === 0) decodes(schema, envelope.subarray(5));
      yield envelope;
      buf = buf.subarray(5 + len);
    }
  }
  if (buf.byteLength > 0) yield buf; // an incomplete envelope: the library's protocol error
}

/**
 * `body` passed on unchanged, its binary messages of `schema` decoded on the way: a message that
 * does not decode ends it with ConnectError invalid_argument.
 */
export function checkedBinaryBody(
  body: AsyncIterable<Uint8Array>,
  o: {
    schema: DescMessage;
    contentType: string | null | undefined;
    contentEncoding: string | null | undefined;
    maxBytes: number;
  },
): AsyncIterable<Uint8Array> {
  const framing = binaryFraming(o.contentType);
  if (framing === null) return body;
  const enc = (o.contentEncoding ?? "").trim().toLowerCase();
  if (framing === "unary") return unary(body, o.schema, o.maxBytes, enc !== "" && enc !== "identity");
  return envelopes(body, o.schema, o.maxBytes);
}
