/**
 * PacedReader: a streamed reply's producer is asked to wait once about a highWaterMark of bytes
 * is queued, resumes when the reader pulls, and is never thrown at once the reply ended or its
 * reader went away.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { PacedReader } from "../../src/api/paced-reader.js";

function paced() {
  const reader = new PacedReader();
  let controller!: ReadableStreamDefaultController<Uint8Array>;
  const stream = new ReadableStream<Uint8Array>(
    {
      start: (c) => void (controller = c),
      pull: () => reader.pulled(),
      cancel: () => reader.gone(),
    },
    reader.strategy,
  );
  return {
    reader,
    stream,
    enqueue: (n: number) => reader.enqueue(controller, new Uint8Array(n)),
    controller,
  };
}

test("the producer waits once the queue is full and goes on as the reader reads", async () => {
  const { stream, enqueue } = paced();
  const hwm = 256 << 10;
  let waits: Promise<void> | undefined;
  let queued = 0;
  while (!(waits = enqueue(64 << 10))) queued += 64 << 10;
  assert.ok(queued < hwm, `asked to wait after ${queued} bytes`);
  let resumed = false;
  void waits.then(() => (resumed = true));
  await new Promise((r) => setTimeout(r, 20));
  assert.equal(resumed, false, "no reader, no progress");
  const r = stream.getReader();
  await r.read();
  await new Promise((r) => setTimeout(r, 20));
  assert.equal(resumed, true);
});

test("a reader gone: waiting producers are released, later chunks dropped without a throw", async () => {
  const { reader, stream, enqueue } = paced();
  let w: Promise<void> | undefined;
  while (!(w = enqueue(64 << 10)));
  await stream.cancel();
  await w; // released
  assert.equal(reader.isGone, true);
  assert.equal(enqueue(10), undefined);
  assert.throws(() => reader.checkGone(), /went away/);
});

test("after close or error nothing is enqueued and nothing throws", async () => {
  const { reader, stream, enqueue, controller } = paced();
  assert.equal(enqueue(10), undefined);
  reader.close(controller);
  assert.equal(enqueue(10), undefined);
  reader.error(controller, new Error("late"));
  const r = stream.getReader();
  assert.equal((await r.read()).value?.length, 10);
  assert.equal((await r.read()).done, true);
  reader.checkGone(); // ended is not gone
});
