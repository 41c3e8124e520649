/**
 * The CLI against the daemon's real API (its routes and parsers; no VMs: fake snapshots on
 * disk) over TCP with a token: listing and inspecting snapshots, deleting them with and without
 * rmi's flags, the status and the running daemon's OpenAPI document.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import { REPO_DIR } from "../../src/host/paths.js";
import { testServices } from "../helpers/services.js";
import type { TestServices } from "../helpers/services.js";
import { fakeSnapshot } from "../helpers/snapshots.js";

const CLI = join(REPO_DIR, "dist/src/cli/main.js");
const TOKEN = "c".repeat(24) + "0123456789abcdef";
let url = "";
let t: TestServices;

before(async () => {
  t = await testServices();
  url = await t.serveTcp(TOKEN);
});

after(async () => {
  await t.cleanup();
});

async function cli(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const env = { ...process.env, FORKD_URL: url, FORKD_TOKEN: TOKEN, FORKD_DATA_DIR: "/nonexistent" };
  try {
    return { code: 0, ...(await promisify(execFile)(process.execPath, [CLI, ...args], { env })) };
  } catch (e) {
    const x = e as { code: number; stdout: string; stderr: string };
    return { code: x.code, stdout: x.stdout, stderr: x.stderr };
  }
}

test("images, image, and rmi with --cascade, --force or neither, against the real routes", async () => {
  for (const tag of ["a", "b", "c"]) await fakeSnapshot(t.services.store, tag, null);
  const ls = await cli(["images", "--json"]);
  assert.equal(ls.code, 0, ls.stderr);
  const list = JSON.parse(ls.stdout) as { snapshots: { tag: string }[] };
  assert.deepEqual(list.snapshots.map((s) => s.tag).sort(), ["a", "b", "c"]);
  const one = await cli(["image", "b"]);
  assert.equal(one.code, 0, one.stderr);
  assert.equal((JSON.parse(one.stdout) as { tag: string }).tag, "b");

  for (const args of [
    ["rmi", "a"],
    ["rmi", "--cascade", "b"],
    ["rmi", "--force", "c"],
  ]) {
    const r = await cli(args);
    assert.equal(r.code, 0, `${args.join(" ")}: ${r.stderr}`);
  }
  assert.deepEqual(await t.services.store.list(), []);
  const gone = await cli(["rmi", "a"]);
  assert.equal(gone.code, 3, gone.stderr);
  assert.match(gone.stderr, /\[not_found\]/);
});

test("status names the daemon; openapi prints the running daemon's document", async () => {
  const s = await cli(["status", "--json"]);
  assert.equal(s.code, 0, s.stderr);
  const st = JSON.parse(s.stdout) as { where: string; version: { api: string }; health: { ok: boolean } };
  assert.equal(st.where, url);
  assert.equal(st.version.api, "v1");
  const o = await cli(["openapi"]);
  assert.equal(o.code, 0, o.stderr);
  const served = JSON.parse(o.stdout) as { paths: Record<string, unknown> };
  const committed = JSON.parse(
    await readFile(join(REPO_DIR, "docs", "openapi.json"), "utf8"),
  ) as typeof served;
  assert.deepEqual(Object.keys(served.paths), Object.keys(committed.paths));
});
