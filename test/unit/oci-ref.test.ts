/** Image references: Docker Hub short names resolved the usual way, explicit hosts kept, bad ones refused. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { parseImageRef } from "../../src/oci/ref.js";
import { ForkdError } from "../../src/util/errors.js";

const D = "sha256:" + "cd".repeat(32);

test("image references: Docker Hub short names", () => {
  const cases: Array<[string, { normalized: string; apiHost: string; name: string; tag: string | null }]> = [
    [
      "python:3.11",
      {
        normalized: "docker.io/library/python:3.11",
        apiHost: "registry-1.docker.io",
        name: "library/python",
        tag: "3.11",
      },
    ],
    [
      "python",
      {
        normalized: "docker.io/library/python:latest",
        apiHost: "registry-1.docker.io",
        name: "library/python",
        tag: "latest",
      },
    ],
    [
      "user/x",
      {
        normalized: "docker.io/user/x:latest",
        apiHost: "registry-1.docker.io",
        name: "user/x",
        tag: "latest",
      },
    ],
    [
      "user/x:1",
      { normalized: "docker.io/user/x:1", apiHost: "registry-1.docker.io", name: "user/x", tag: "1" },
    ],
    [
      "docker.io/python",
      {
        normalized: "docker.io/library/python:latest",
        apiHost: "registry-1.docker.io",
        name: "library/python",
        tag: "latest",
      },
    ],
    [
      "index.docker.io/library/debian:12",
      {
        normalized: "docker.io/library/debian:12",
        apiHost: "registry-1.docker.io",
        name: "library/debian",
        tag: "12",
      },
    ],
    [
      `alpine@${D}`,
      {
        normalized: `docker.io/library/alpine@${D}`,
        apiHost: "registry-1.docker.io",
        name: "library/alpine",
        tag: null,
      },
    ],
  ];
  for (const [text, want] of cases) {
    const r = parseImageRef(text);
    assert.deepEqual({ normalized: r.normalized, apiHost: r.apiHost, name: r.name, tag: r.tag }, want, text);
  }
});

test("image references: explicit hosts (a '.' or ':' in the first component, or localhost)", () => {
  const r = parseImageRef("127.0.0.1:5000/forkd/py:v1");
  assert.equal(r.normalized, "127.0.0.1:5000/forkd/py:v1");
  assert.equal(r.apiHost, "127.0.0.1:5000");
  assert.equal(r.hostname, "127.0.0.1");
  assert.equal(parseImageRef("ghcr.io/o/x").normalized, "ghcr.io/o/x:latest");
  assert.equal(parseImageRef("localhost/x:2").normalized, "localhost/x:2");
  assert.equal(parseImageRef("localhost:5000/x").apiHost, "localhost:5000");
  assert.equal(parseImageRef(`r.io/a:t@${D}`).normalized, `r.io/a:t@${D}`);
  assert.equal(parseImageRef(`r.io/a:t@${D}`).digest, D);
  assert.equal(parseImageRef("[::1]:5000/x").hostname, "::1");
});

test("image references: malformed ones are refused with invalid_argument", () => {
  for (const bad of [
    "",
    "Python",
    "python:",
    "a b",
    "x@sha256:12",
    "http://r.io/x",
    "r.io/",
    "user/X",
    "r.io/a:" + "t".repeat(200),
    "a".repeat(600),
  ]) {
    assert.throws(
      () => parseImageRef(bad),
      (e: unknown) => e instanceof ForkdError && e.code === "invalid_argument",
      JSON.stringify(bad),
    );
  }
});
