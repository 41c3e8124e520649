import assert from "node:assert/strict";
import { test } from "node:test";
import { gzipSync } from "node:zlib";
import { gunzipBounded } from "../../src/api/routes/files.js";
import { ForkdError } from "../../src/util/errors.js";

async function* pieces(b: Buffer, size = 1000): AsyncIterable<Uint8Array> {
  for (let i = 0; i < b.length; i += size) yield b.subarray(i, i + size);
}

async function collect(it: AsyncIterable<Uint8Array>): Promise<Buffer> {
  const parts: Uint8Array[] = [];
  for await (const c of it) parts.push(c);
  return Buffer.concat(parts);
}

test("a gzipped upload is decompressed", async () => {
  const data = Buffer.from("hello gzip\n".repeat(5000));
  assert.deepEqual(await collect(gunzipBounded(pieces(gzipSync(data)), data.length)), data);
});

test("the bound applies to the decompressed bytes: a small bomb is a 413", async () => {
  const bomb = gzipSync(Buffer.alloc(8 << 20));
  assert.ok(bomb.length < 64 << 10);
  await assert.rejects(
    collect(gunzipBounded(pieces(bomb), 1 << 20)),
    (e: unknown) => e instanceof ForkdError && e.code === "payload_too_large",
  );
});

test("a body that is not gzip is a 400; a body cut short fails with its own error, and is released", async () => {
  await assert.rejects(
    collect(gunzipBounded(pieces(Buffer.from("not gzip at all")), 1 << 20)),
    (e: unknown) => e instanceof ForkdError && e.code === "invalid_argument",
  );
  let released = false;
  const cut = async function* (): AsyncIterable<Uint8Array> {
    try {
      yield gzipSync(Buffer.from("x")).subarray(0, 5);
      throw new ForkdError("invalid_argument", "the request body was cut short: aborted");
    } finally {
      released = true;
    }
  };
  await assert.rejects(collect(gunzipBounded(cut(), 1 << 20)), /cut short/);
  assert.ok(released);
});

test("a consumer that stops early tears the pipeline down (the body is released)", async () => {
  let released = false;
  const endless = async function* (): AsyncIterable<Uint8Array> {
    try {
      const member = gzipSync(Buffer.alloc(1 << 16, 97));
      for (;;) {
        yield member; // gzip members one after another, for ever
        await new Promise((r) => setTimeout(r, 5));
      }
    } finally {
      released = true;
    }
  };
  for await (const c of gunzipBounded(endless(), 4 << 20)) {
    assert.ok(c.length > 0);
    break;
  }
  await new Promise((r) => setTimeout(r, 50));
  assert.ok(released);
});
