/** Registry references are parsed strictly, before any request: what is accepted and what not. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { formatRef, isLoopback, parseRef, reference } from "../../src/registry/ref.js";
import { ForkdError } from "../../src/util/errors.js";

const D = "sha256:" + "ab".repeat(32);

test("references: host, port, nested names, tags, digests", () => {
  const cases: Array<[string, Partial<ReturnType<typeof parseRef>>]> = [
    [
      "127.0.0.1:5000/forkd/py:v1",
      { host: "127.0.0.1:5000", hostname: "127.0.0.1", name: "forkd/py", tag: "v1" },
    ],
    [
      "registry.example.com/a/b/c",
      { host: "registry.example.com", name: "a/b/c", tag: "latest", digest: null },
    ],
    ["localhost/x:1.0-rc_1", { hostname: "localhost", name: "x", tag: "1.0-rc_1" }],
    ["[::1]:5000/snap", { host: "[::1]:5000", hostname: "::1", name: "snap" }],
    [`ghcr.io/org/snap@${D}`, { name: "org/snap", tag: null, digest: D }],
    [`ghcr.io/org/snap:v2@${D}`, { tag: "v2", digest: D }],
    ["docker.io/ubuntu-snap", { apiHost: "registry-1.docker.io", name: "library/ubuntu-snap" }],
    ["docker.io/me/snap:t", { apiHost: "registry-1.docker.io", name: "me/snap" }],
    ["r.io/a__b/c-d/e.f/g--h", { name: "a__b/c-d/e.f/g--h" }],
  ];
  for (const [text, want] of cases) {
    const r = parseRef(text);
    for (const [k, v] of Object.entries(want)) assert.deepEqual(r[k as keyof typeof r], v, `${text}: ${k}`);
  }
  assert.equal(reference(parseRef(`r.io/a:t@${D}`)), D, "the digest wins over the tag");
  assert.equal(reference(parseRef("r.io/a")), "latest");
  assert.equal(formatRef(parseRef("r.io:443/a/b:t")), "r.io:443/a/b:t");
});

test("references: malformed ones are refused with invalid_argument", () => {
  const bad = [
    "",
    "snap", // no host
    "forkd/py:v1", // a Docker Hub namespace is not guessed
    "https://r.io/a", // no scheme
    "r.io/A", // uppercase name
    "r.io/a/../b",
    "r.io/a//b",
    "r.io/a/",
    "r.io/-a",
    "r.io/a:",
    "r.io/a:-t",
    "r.io/a:" + "t".repeat(129),
    "r.io/a@sha256:xyz",
    "r.io/a@md5:" + "a".repeat(32),
    "r.io:99999/a",
    "r.io:/a",
    "-r.io/a",
    "r.io/a b",
    "r.io/a\0",
    "r.io/a\n",
    "r_io.com/a",
    "r.io/" + "a".repeat(256),
    "[zz]:5000/a",
  ];
  for (const b of bad) {
    assert.throws(
      () => parseRef(b),
      (e: unknown) => e instanceof ForkdError && e.code === "invalid_argument",
      JSON.stringify(b),
    );
  }
});

test("loopback hosts", () => {
  for (const h of ["localhost", "127.0.0.1", "127.1.2.3", "::1", "[::1]"]) assert.ok(isLoopback(h), h);
  for (const h of ["10.0.0.1", "localhost.example.com", "127.0.0.1.nip.io", "::ffff:1.2.3.4", "0.0.0.0"]) {
    assert.ok(!isLoopback(h), h);
  }
});
