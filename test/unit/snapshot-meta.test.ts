import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { readMeta, writeMeta } from "../../src/snapshot/meta.js";
import { fakeMeta } from "../helpers/snapshots.js";

const sum = { size: 1, sha256: "a".repeat(64) };
const base = { ...fakeMeta("t", null, { memory: sum, vmstate: sum, disk: sum }), diskSize: 1024 };

test("metadata checksums do not depend on the order its keys were written in", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-meta-"));
  try {
    const p = join(dir, "meta.json");
    // `parent` last, after `owner`: the schema (and the parsed object) has it before.
    await writeMeta(p, { ...base, parent: null });
    assert.equal((await readMeta(p)).parent, null);
    // Metadata written before keys were sorted: the checksum over the schema's key order.
    const { owner: _o, ...legacy } = base;
    const checksum = createHash("sha256")
      .update(JSON.stringify({ ...legacy, checksum: undefined }))
      .digest("hex");
    await writeFile(p, JSON.stringify({ ...legacy, checksum }));
    assert.equal((await readMeta(p)).tag, "t");
    // Anything changed is refused.
    const text = await readFile(p, "utf8");
    await writeFile(p, text.replace('"diskSize":1024', '"diskSize":2048'));
    await assert.rejects(readMeta(p), /checksum mismatch/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
