import { test } from "node:test";
import assert from "node:assert/strict";
import {
  FrameDecoder,
  MAX_FRAME,
  Msg,
  Tag,
  decodeFields,
  encodeFrame,
  intField,
  strField,
} from "../../src/agent/codec.js";
import { ForkdError } from "../../src/util/errors.js";

test("a frame round-trips through encode and a byte-at-a-time decoder", () => {
  const buf = encodeFrame(Msg.EXEC, 7, [
    [Tag.ARG, "echo"],
    [Tag.ARG, "hé\0llo"],
    [Tag.TIMEOUT_MS, 1234],
    [Tag.DATA, new Uint8Array([0, 255, 10])],
  ]);
  const d = new FrameDecoder();
  const frames = [];
  for (const b of buf) frames.push(...d.push(Buffer.from([b])));
  assert.equal(frames.length, 1);
  const f = frames[0]!;
  assert.equal(f.type, Msg.EXEC);
  assert.equal(f.stream, 7);
  assert.deepEqual(
    f.fields.filter((x) => x.tag === Tag.ARG).map((x) => x.value.toString("utf8")),
    ["echo", "hé\0llo"],
  );
  assert.equal(intField(f.fields, Tag.TIMEOUT_MS), 1234);
  assert.deepEqual([...f.fields.find((x) => x.tag === Tag.DATA)!.value], [0, 255, 10]);
});

test("several frames in one chunk all decode, a partial tail waits", () => {
  const a = encodeFrame(Msg.OK, 1, [[Tag.MESSAGE, "one"]]);
  const b = encodeFrame(Msg.OK, 2, [[Tag.MESSAGE, "two"]]);
  const d = new FrameDecoder();
  const all = Buffer.concat([a, b]);
  const first = d.push(all.subarray(0, a.length + 3));
  assert.deepEqual(
    first.map((f) => strField(f.fields, Tag.MESSAGE)),
    ["one"],
  );
  const second = d.push(all.subarray(a.length + 3));
  assert.deepEqual(
    second.map((f) => f.stream),
    [2],
  );
});

test("a guest frame length beyond MAX_FRAME or below 5 is a protocol error", () => {
  for (const len of [MAX_FRAME + 1, 0, 4, 0xffffffff]) {
    const head = Buffer.alloc(9);
    head.writeUInt32BE(len, 0);
    assert.throws(
      () => new FrameDecoder().push(head),
      (e: unknown) => e instanceof ForkdError && e.code === "agent_protocol",
    );
  }
});

test("a field that overruns its frame is a protocol error", () => {
  const payload = Buffer.from([Tag.DATA, 0, 0, 0, 50, 1, 2]);
  assert.throws(
    () => decodeFields(payload),
    (e: unknown) => e instanceof ForkdError && e.code === "agent_protocol",
  );
  assert.throws(() => decodeFields(Buffer.from([1, 0])), /truncated/);
});

test("an integer field of the wrong width is rejected", () => {
  assert.throws(() => intField([{ tag: Tag.PID, value: Buffer.alloc(4) }], Tag.PID), /4 bytes/);
});

test("encoding refuses a frame larger than the protocol allows", () => {
  assert.throws(() => encodeFrame(Msg.WRITE_DATA, 1, [[Tag.DATA, new Uint8Array(MAX_FRAME)]]), /exceeds/);
});
