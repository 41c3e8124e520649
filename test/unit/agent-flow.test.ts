/**
 * Flow control against the real guest agent binary over a socketpair: a consumer that holds its
 * output stops the guest at one window (the command or file waits in the guest, not in our
 * heap), other streams of the same agent go on meanwhile, and everything arrives once released.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { AgentClient } from "../../src/agent/client.js";
import { CHUNK } from "../../src/agent/codec.js";
import { WINDOW } from "../../src/agent/flow.js";
import { ForkdError } from "../../src/util/errors.js";
import { startHostAgent } from "../helpers/agent.js";
import type { HostAgent } from "../helpers/agent.js";

let host: HostAgent;
let agent: AgentClient;
let dir: string;

before(async () => {
  host = await startHostAgent({});
  agent = host.agent;
  dir = host.dir;
});

after(async () => {
  await host.close();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A consumer that holds every chunk until release(). */
function holder() {
  let got = 0;
  const chunks: Buffer[] = [];
  let gate!: () => void;
  let released = false;
  const open = new Promise<void>((r) => (gate = r));
  return {
    on: (d: Buffer) => {
      got += d.length;
      chunks.push(Buffer.from(d));
      return released ? undefined : open;
    },
    get got() {
      return got;
    },
    data: () => Buffer.concat(chunks),
    release: () => {
      released = true;
      gate();
    },
  };
}

/** Waits until `f()` stops changing for `quietMs`. */
async function settle(f: () => number, quietMs = 400): Promise<number> {
  let last = -1;
  while (f() !== last) {
    last = f();
    await sleep(quietMs);
  }
  return last;
}

test("a held exec stops the guest at one window; the rest comes when the consumer takes it", async () => {
  const total = 16 << 20;
  const h = holder();
  const ex = agent.exec({ shell: `head -c ${total} /dev/zero` }, { onStdout: h.on });
  await ex.started;
  const held = await settle(() => h.got);
  assert.ok(held >= WINDOW / 2 && held <= WINDOW, `delivered ${held} bytes while held (window ${WINDOW})`);
  // Another stream of the same agent is not held up by the stalled one.
  const out: Buffer[] = [];
  const r2 = await agent.exec({ argv: ["echo", "other"] }, { onStdout: (d) => out.push(d) }).result;
  assert.equal(r2.exitCode, 0);
  assert.equal(Buffer.concat(out).toString(), "other\n");
  assert.equal(h.got, held, "nothing more while held");
  h.release();
  const r = await ex.result;
  assert.equal(r.exitCode, 0);
  assert.equal(h.got, total);
});

test("a consumer that takes its time gets every byte, paced", async () => {
  const total = 4 << 20;
  let got = 0;
  let inFlight = 0;
  let maxInFlight = 0;
  const r = await agent.exec(
    { shell: `head -c ${total} /dev/urandom | od -An -v -tx1 | head -c ${total}` },
    {
      onStdout: async (d) => {
        got += d.length;
        inFlight += d.length;
        maxInFlight = Math.max(maxInFlight, inFlight);
        await sleep(2);
        inFlight -= d.length;
      },
    },
  ).result;
  assert.equal(r.exitCode, 0);
  assert.equal(got, total);
  assert.ok(maxInFlight <= WINDOW + CHUNK, `at most a window held at once (${maxInFlight})`);
});

test("a held read stops at one window; released, the file arrives whole", async () => {
  const path = join(dir, "big.bin");
  const blob = randomBytes(6 << 20);
  await writeFile(path, blob);
  const h = holder();
  const reading = agent.readFileStream(path, h.on, 5_000);
  const held = await settle(() => h.got);
  assert.ok(held >= WINDOW / 2 && held <= WINDOW, `delivered ${held} bytes while held`);
  // Held longer than the read's timeout: the guest is waiting on us, that is no timeout.
  await sleep(5_500);
  h.release();
  assert.equal(await reading, blob.length);
  assert.ok(h.data().equals(blob));
});

test("a consumer that fails a read ends it and frees the guest's stream", async () => {
  const path = join(dir, "fail.bin");
  await writeFile(path, randomBytes(3 << 20));
  await assert.rejects(
    agent.readFileStream(path, () => Promise.reject(new Error("client went away"))),
    /client went away/,
  );
  await assert.rejects(
    agent.readFile(path, { maxBytes: 100_000 }),
    (e: unknown) => e instanceof ForkdError && e.code === "resource_exhausted",
  );
  // The agent is not stuck on either (CANCEL freed them): more reads work.
  assert.equal((await agent.readFile(path)).length, 3 << 20);
  assert.equal((await agent.ping()).version, 1);
});
