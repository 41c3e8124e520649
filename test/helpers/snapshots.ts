/** A fake but verifiable snapshot on disk (no VM): enough for the API's listing and scoping. */
import { mkdir, writeFile } from "node:fs/promises";
import { SNAPSHOT_FORMAT, sha256File, writeMeta } from "../../src/snapshot/meta.js";
import type { SnapshotMeta } from "../../src/snapshot/meta.js";
import type { SnapshotStore } from "../../src/snapshot/store.js";

export async function fakeSnapshot(
  store: SnapshotStore,
  tag: string,
  owner: string | null,
): Promise<SnapshotMeta> {
  const f = store.filesFor(tag);
  await mkdir(f.dir, { recursive: true });
  await writeFile(f.memory, Buffer.alloc(4096, 1));
  await writeFile(f.vmstate, `devices of ${tag}`);
  await writeFile(f.disk, Buffer.alloc(512, 2));
  await writeFile(f.childDisk, Buffer.alloc(512, 3));
  return writeMeta(
    f.meta,
    fakeMeta(tag, owner, {
      memory: await sha256File(f.memory),
      vmstate: await sha256File(f.vmstate),
      disk: await sha256File(f.disk),
    }),
  );
}

/** Metadata of a fake snapshot (what fakeSnapshot writes), checksum not included. */
export function fakeMeta(
  tag: string,
  owner: string | null,
  files: SnapshotMeta["files"],
): Omit<SnapshotMeta, "checksum"> {
  return {
    format: SNAPSHOT_FORMAT,
    tag,
    template: "python",
    source: { kind: "template", name: "python" },
    created: new Date().toISOString(),
    status: "ready",
    machine: { memoryMiB: 128, vcpus: 1, accel: "tcg", cpu: "qemu64" },
    image: { hash: "0", dir: "/nonexistent", kernelVersion: "0" },
    qemu: { binary: "/bin/false", version: "0" },
    warm: null,
    warmEval: null,
    diskSize: 1 << 20,
    files,
    timings: { bootMs: 0, warmMs: 0, freezeMs: 0 },
    owner,
  };
}
