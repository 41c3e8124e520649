/**
 * POST /v1/snapshots/build refuses bad input before any VM starts (no VM here): bad options, a
 * body that is not a context tar, a context without the Dockerfile, a Dockerfile error (naming
 * its line), a hostile tar entry, FROM what this daemon cannot resolve; and it leaves no working
 * directory behind.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createApp } from "../../src/api/app.js";
import { testServices } from "../helpers/services.js";

let dir: string;
let src: string;
let app: ReturnType<typeof createApp>;
let cleanup: () => Promise<void>;

before(async () => {
  const t = await testServices();
  dir = t.dir;
  cleanup = t.cleanup;
  app = createApp(t.services);
  src = await mkdtemp(join(tmpdir(), "forkd-dfapi-"));
});

after(async () => {
  await cleanup();
  await rm(src, { recursive: true, force: true });
});

/** A tar of `files` (name → content), made by GNU tar like the CLI's. */
async function tarOf(files: Record<string, string>, extra: string[] = []): Promise<Buffer> {
  const d = await mkdtemp(join(src, "ctx-"));
  for (const [name, content] of Object.entries(files)) {
    await mkdir(join(d, name, ".."), { recursive: true });
    await writeFile(join(d, name), content);
  }
  return execFileSync("tar", ["-c", "-f", "-", ...extra, ...Object.keys(files)], { cwd: d });
}

async function build(query: string, body: Buffer | null) {
  const res = await app.request(`/v1/snapshots/build?${query}`, {
    method: "POST",
    headers: { "content-type": "application/x-tar" },
    ...(body ? { body } : {}),
  });
  const json = (await res.json()) as {
    error?: { code: string; message: string; details?: { line?: number } };
  };
  return { status: res.status, error: json.error };
}

const cases: Array<[string, string, () => Promise<Buffer | null>, number, string, RegExp]> = [
  [
    "bad tag",
    "tag=../x",
    () => tarOf({ Dockerfile: "FROM forkd://python\n" }),
    400,
    "invalid_argument",
    /tag/,
  ],
  [
    "build_args not JSON",
    "tag=t&build_args=nope",
    () => tarOf({ Dockerfile: "FROM forkd://python\n" }),
    400,
    "invalid_argument",
    /build_args/,
  ],
  [
    "a warm_eval_language that is no kernel",
    "tag=t&warm_eval=1&warm_eval_language=ruby",
    () => tarOf({ Dockerfile: "FROM forkd://python\n" }),
    400,
    "invalid_argument",
    /warm_eval_language/,
  ],
  ["no body", "tag=t", async () => null, 400, "invalid_argument", /build context/],
  [
    "not a tar",
    "tag=t",
    async () => Buffer.alloc(1024, 7),
    400,
    "invalid_argument",
    /build context: not a readable tar/,
  ],
  ["no Dockerfile", "tag=t", () => tarOf({ "other.txt": "x" }), 400, "invalid_argument", /no Dockerfile/],
  [
    "a Dockerfile error",
    "tag=t",
    () => tarOf({ Dockerfile: "FROM forkd://python\nRUN true\nVOLUME /data\n" }),
    400,
    "invalid_argument",
    /line 3: VOLUME is not supported/,
  ],
  [
    "a tar entry outside the context",
    "tag=t",
    () => tarOf({ Dockerfile: "FROM forkd://python\n" }, ["-P", "--transform", "s,^,../,"]),
    400,
    "invalid_argument",
    /not a path inside the context/,
  ],
  [
    "the Dockerfile outside the context",
    "tag=t&dockerfile=../Dockerfile",
    () => tarOf({ Dockerfile: "FROM forkd://python\n" }),
    400,
    "invalid_argument",
    /not a path in the context/,
  ],
  [
    "FROM an unknown template",
    "tag=t",
    () => tarOf({ Dockerfile: "FROM forkd://nope\n" }),
    400,
    "invalid_argument",
    /unknown template/,
  ],
  [
    "FROM an image without a puller",
    "tag=t",
    () => tarOf({ Dockerfile: "FROM debian:bookworm\n" }),
    503,
    "unavailable",
    /cannot pull images/,
  ],
];

for (const [name, query, body, status, code, message] of cases) {
  test(`build: ${name} → ${status} ${code}`, async () => {
    const r = await build(query, await body());
    assert.equal(r.error?.code, code, JSON.stringify(r));
    assert.match(r.error?.message ?? "", message);
    assert.equal(r.status, status);
    if (name === "a Dockerfile error") assert.equal(r.error?.details?.line, 3);
  });
}

test("build: nothing is left in the build cache's working area", async () => {
  const tmp = await readdir(join(dir, "dockerfile", "tmp")).catch(() => [] as string[]);
  assert.deepEqual(tmp, []);
});
