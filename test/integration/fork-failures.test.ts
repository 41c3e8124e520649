/**
 * A child that fails while being forked is reported and cleaned up, and its siblings are not
 * affected. The failure is real: a wrapper around QEMU refuses one start in a fan-out.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { chmod, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { apiRequest } from "../helpers/http.js";
import { findQemu } from "../../src/vmm/qemu-binary.js";
import { makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";

let d: TestDaemon;
let failed = false;
let work = "";
let wrapper = "";

before(async () => {
  const qemu = await findQemu(process.env, "tcg");
  // Children's QEMUs run jailed, each as its own uid: the counter must be writable by all of them.
  work = await mkdtemp(join(tmpdir(), "forkd-qemu-wrapper-"));
  await chmod(work, 0o777);
  wrapper = join(work, "qemu");
  const dir = wrapper;
  // Start 1 is the parent's boot; starts 2-5 are the four children; the third child fails. (In
  // the script: a QEMU gets none of the daemon's environment.)
  const FAIL_AT = 4;
  for (const f of [".lock", ".count"]) {
    await writeFile(`${dir}${f}`, f === ".count" ? "0\n" : "");
    await chmod(`${dir}${f}`, 0o666);
  }
  await writeFile(
    `${dir}.sh`,
    `#!/bin/bash
# Counts QEMU starts under a lock; start number FAIL_AT exits like a QEMU that cannot start.
exec 9>"${dir}.lock"; flock 9
n=$(( $(cat "${dir}.count" 2>/dev/null || echo 0) + 1 )); echo "$n" > "${dir}.count"
flock -u 9
if [ "$n" = "${FAIL_AT}" ]; then echo "injected failure: QEMU start $n" >&2; exit 1; fi
exec ${qemu} "$@"
`,
  );
  await chmod(`${dir}.sh`, 0o755);
  d = await makeDaemon({ FORKD_QEMU: `${dir}.sh`, FORKD_POOL_SIZE: "0" });
});

after(async () => {
  await d.destroy(failed);
  await rm(work, { recursive: true, force: true });
});

test("one child failing mid-fan-out: reported with its error, cleaned up, siblings fine", async () => {
  try {
    const ep = d.ep;
    await apiRequest(ep, "POST", "/v1/snapshots", { tag: "f", memory_mib: 256 }, 600_000);
    const r = await apiRequest<{
      sandboxes: { id: string }[];
      failures: { index: number; code: string; message: string }[];
    }>(ep, "POST", "/v1/sandboxes", { snapshot_tag: "f", n: 4 }, 300_000);
    assert.equal(r.sandboxes.length, 3);
    assert.equal(r.failures.length, 1);
    assert.equal(r.failures[0]!.code, "vmm_error");
    assert.match(r.failures[0]!.message, /QEMU/);
    for (const s of r.sandboxes) {
      const e = await apiRequest<{ stdout: string }>(
        ep,
        "POST",
        `/v1/sandboxes/${s.id}/exec`,
        { cmd: "echo ok" },
        60_000,
      );
      assert.equal(e.stdout, "ok\n");
    }
    // Nothing of the failed child is left: one directory per live sandbox.
    assert.deepEqual(
      (await readdir(join(d.dataDir, "sandboxes"))).sort(),
      r.sandboxes.map((s) => s.id).sort(),
    );
  } catch (e) {
    failed = true;
    throw e;
  }
});
