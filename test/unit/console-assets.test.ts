/**
 * The console's front end as served (src/http/console-assets.ts): a path that would leave dist
 * (dot segments, encoded or not, backslashes, NUL, absolute paths, a symlink out) is 404;
 * index.html is no-store, hashed assets immutable, both with the CSP and the other security
 * headers; unknown paths are the SPA's index; a missing build is 503 saying what to run.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdir, mkdtemp, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CSP, consoleDist, resolveAsset, serveAsset } from "../../src/http/console-assets.js";
import { REPO_DIR } from "../../src/host/paths.js";

async function dist(): Promise<{ root: string; dist: string }> {
  const root = await mkdtemp(join(tmpdir(), "forkd-assets-"));
  const d = join(root, "dist");
  await mkdir(join(d, "assets"), { recursive: true });
  await writeFile(join(d, "index.html"), "<!doctype html><title>console</title>");
  await writeFile(join(d, "assets", "app-1234.js"), "export {};");
  await writeFile(join(root, "secret.txt"), "not for browsers");
  await symlink(join(root, "secret.txt"), join(d, "assets", "link.js"));
  return { root, dist: d };
}

test("paths that would leave dist resolve to nothing", () => {
  for (const p of [
    "../secret.txt",
    "..%2fsecret.txt",
    "%2e%2e/secret.txt",
    "%2e%2e%2fsecret.txt",
    "assets/../../secret.txt",
    "..\\secret.txt",
    "%5c..%5csecret.txt",
    "/etc/passwd",
    "%2fetc%2fpasswd",
    "index.html%00.js",
    "%zz",
  ])
    assert.equal(resolveAsset("/srv/dist", p), null, p);
  assert.equal(resolveAsset("/srv/dist", "assets/app.js"), "/srv/dist/assets/app.js");
  assert.equal(resolveAsset("/srv/dist", "a/../index.html"), "/srv/dist/index.html");
});

test("index.html, assets, SPA routes, escapes and a symlink out", async () => {
  const { root, dist: d } = await dist();
  try {
    const index = await serveAsset(d, "/console/");
    assert.equal(index.status, 200);
    assert.equal(index.headers["cache-control"], "no-store");
    assert.equal(index.headers["content-security-policy"], CSP);
    assert.equal(index.headers["x-frame-options"], "DENY");
    assert.equal(index.headers["x-content-type-options"], "nosniff");
    assert.equal(index.headers["referrer-policy"], "no-referrer");
    assert.match(index.headers["content-type"] ?? "", /^text\/html/);

    const js = await serveAsset(d, "/console/assets/app-1234.js");
    assert.equal(js.status, 200);
    assert.match(js.headers["cache-control"] ?? "", /immutable/);
    assert.match(js.headers["content-type"] ?? "", /^text\/javascript/);
    assert.equal(js.body.toString(), "export {};");

    const route = await serveAsset(d, "/console/sandboxes/sb-x");
    assert.equal(route.status, 200);
    assert.equal(route.body.toString(), index.body.toString(), "a front-end route is the index");

    assert.equal((await serveAsset(d, "/console/assets/gone-99.js")).status, 404, "a stale asset");
    assert.equal((await serveAsset(d, "/console/assets/link.js")).status, 404, "a symlink out of dist");
    for (const p of ["/console/../secret.txt", "/console/%2e%2e/secret.txt", "/console/..%2fsecret.txt"]) {
      const r = await serveAsset(d, p);
      assert.equal(r.status, 404, p);
      assert.doesNotMatch(r.body.toString(), /not for browsers/);
    }
    assert.equal((await serveAsset(d, "/console")).status, 308);
    assert.equal((await serveAsset(d, "/elsewhere")).status, 404);
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});

test("without a build: 503 saying to run scripts/install.sh", async () => {
  const r = await serveAsset("/nonexistent/dist", "/console/");
  assert.equal(r.status, 503);
  assert.match(r.body.toString(), /scripts\/install\.sh/);
});

test("the icon: linked from the built page, served at /console/favicon.svg and at /favicon.ico", async () => {
  const { root, dist: d } = await dist();
  const svg = '<svg xmlns="http://www.w3.org/2000/svg"/>';
  try {
    assert.equal((await serveAsset(d, "/favicon.ico")).status, 404, "no icon in this build");
    await writeFile(join(d, "favicon.svg"), svg);
    for (const p of ["/console/favicon.svg", "/favicon.ico"]) {
      const r = await serveAsset(d, p);
      assert.equal(r.status, 200, p);
      assert.equal(r.headers["content-type"], "image/svg+xml", p);
      assert.equal(r.body.toString(), svg, p);
    }
    // The real build ships it and its page links it.
    const real = consoleDist(REPO_DIR);
    assert.match(
      await readFile(join(real, "index.html"), "utf8"),
      /<link rel="icon"[^>]*href="\/console\/favicon\.svg"/,
    );
    assert.equal((await serveAsset(real, "/favicon.ico")).status, 200);
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});
