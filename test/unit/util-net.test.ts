import assert from "node:assert/strict";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { dialUnix } from "../../src/util/net.js";

test("dialUnix waits for a socket that appears later, then connects", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-dial-"));
  const path = join(dir, "s.sock");
  const server = createServer((c) => c.end("hello"));
  try {
    setTimeout(() => server.listen(path), 60);
    const s = await dialUnix(path, 5_000, "test");
    const got = await new Promise<string>((r) => {
      let b = "";
      s.on("data", (d: Buffer) => (b += d.toString()));
      s.on("end", () => r(b));
    });
    assert.equal(got, "hello");
  } finally {
    server.close();
    await rm(dir, { recursive: true, force: true });
  }
});

test("dialUnix gives up at its timeout: a missing socket and a path that is not a listening socket", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-dial-"));
  try {
    await assert.rejects(dialUnix(join(dir, "never.sock"), 100, "QMP"), /QMP socket .*never\.sock: .*ENOENT/);
    const file = join(dir, "file.sock");
    await writeFile(file, "");
    await assert.rejects(
      dialUnix(file, 100, "agent"),
      /agent socket .*file\.sock: .*(ECONNREFUSED|ENOTSOCK)/,
    );
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("dialUnix stops waiting when its signal aborts", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-dial-"));
  try {
    const ac = new AbortController();
    setTimeout(() => ac.abort(new Error("gave up")), 50);
    await assert.rejects(dialUnix(join(dir, "never.sock"), 10_000, "QMP", ac.signal), /gave up/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
