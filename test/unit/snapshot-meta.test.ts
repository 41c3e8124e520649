import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { readMeta, SNAPSHOT_FORMAT, writeMeta } from "../../src/snapshot/meta.js";
import { fakeMeta } from "../helpers/snapshots.js";

const sum = { size: 1, sha256: "a".repeat(64) };
const sha = (s: string) => createHash("sha256").update(s).digest("hex");
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

/** JSON with sorted keys: how every writer of format 1 checksummed its metadata. */
const canonical = (v: unknown): string =>
  Array.isArray(v)
    ? `[${v.map(canonical).join(",")}]`
    : v !== null && typeof v === "object"
      ? `{${Object.entries(v)
          .filter(([, x]) => x !== undefined)
          .sort(([a], [b]) => (a < b ? -1 : 1))
          .map(([k, x]) => `${JSON.stringify(k)}:${canonical(x)}`)
          .join(",")}}`
      : JSON.stringify(v);

test("format-1 metadata (no source) reads as made from its template; a rewrite is format 2", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-meta-"));
  try {
    const p = join(dir, "meta.json");
    const { source: _s, ...v1 } = { ...base, format: 1, template: "python" };
    await writeFile(p, JSON.stringify({ ...v1, checksum: sha(canonical(v1)) }));
    const m = await readMeta(p);
    assert.equal(m.format, 1);
    assert.deepEqual(m.source, { kind: "template", name: "python" });
    // Any rewrite (compact, flatten, unpack) records it in the current format, source included.
    const { checksum: _c, ...rest } = m;
    await writeMeta(p, rest);
    const raw = JSON.parse(await readFile(p, "utf8")) as { format: number; source: unknown };
    assert.equal(raw.format, SNAPSHOT_FORMAT);
    assert.deepEqual(raw.source, { kind: "template", name: "python" });
    assert.deepEqual((await readMeta(p)).source, { kind: "template", name: "python" });
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("format-2 metadata keeps an image source; without one, or of an unknown format, it is refused", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-meta-"));
  try {
    const p = join(dir, "meta.json");
    const source = {
      kind: "image" as const,
      ref: "docker.io/library/busybox:1",
      digest: `sha256:${"b".repeat(64)}`,
    };
    await writeMeta(p, { ...base, template: "image", source });
    assert.deepEqual((await readMeta(p)).source, source);
    const { source: _s, ...noSource } = { ...base, format: 2 };
    await writeFile(p, JSON.stringify({ ...noSource, checksum: sha(canonical(noSource)) }));
    await assert.rejects(readMeta(p), /without a source/);
    const v4 = { ...base, format: 4 };
    await writeFile(p, JSON.stringify({ ...v4, checksum: sha(canonical(v4)) }));
    await assert.rejects(readMeta(p), /not valid snapshot metadata/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
