/** E2B's sandbox-plane routing, envd's error mapping and its signed file URLs. */
import { test } from "node:test";
import assert from "node:assert/strict";
import type { IncomingMessage } from "node:http";
import { Code } from "@connectrpc/connect";
import { sandboxTarget } from "../../src/http/sandbox-route.js";
import { connectCode, httpError, toConnectError } from "../../src/e2b/envd/errors.js";
import { fileSignature, signatureValid } from "../../src/e2b/envd/signature.js";
import { requestedUser, resolvePath } from "../../src/e2b/envd/accounts.js";
import { ForkdError } from "../../src/util/errors.js";

const req = (headers: Record<string, string>) => ({ headers }) as unknown as IncomingMessage;
const ID = "sb-abcdefghijklmnop";

test("routing: the E2b-Sandbox-* headers, then a <port>-<id>.<domain> Host", () => {
  assert.deepEqual(sandboxTarget(req({ "e2b-sandbox-id": ID, "e2b-sandbox-port": "49983" })), {
    sandboxId: ID,
    port: 49983,
  });
  assert.deepEqual(sandboxTarget(req({ host: `8080-${ID}.e2b.local:3000` })), { sandboxId: ID, port: 8080 });
  assert.equal(sandboxTarget(req({ host: "api.e2b.local" })), null, "the control plane");
  assert.equal(sandboxTarget(req({ host: `8080-sb-abc.x` })), null, "not forkd's id");
  assert.equal(sandboxTarget(req({ host: `0-${ID}.x` })), null);
  assert.equal(sandboxTarget(req({ "e2b-sandbox-id": ID })), null);
  assert.equal(sandboxTarget(req({ "e2b-sandbox-id": ID, "e2b-sandbox-port": "65536" })), null);
  assert.equal(sandboxTarget(req({ "e2b-sandbox-id": ID, "e2b-sandbox-port": "0x50" })), null);
  assert.equal(sandboxTarget(req({ "e2b-sandbox-id": "../etc", "e2b-sandbox-port": "1" })), null);
});

test("errors: forkd's codes and the guest's errno as Connect codes and envd's HTTP statuses", () => {
  assert.equal(connectCode(new ForkdError("not_found", "x")), Code.NotFound);
  assert.equal(connectCode(new ForkdError("invalid_argument", "x")), Code.InvalidArgument);
  assert.equal(connectCode(new ForkdError("conflict", "x", { errno_name: "EEXIST" })), Code.AlreadyExists);
  assert.equal(
    connectCode(new ForkdError("guest_error", "x", { errno_name: "EACCES" })),
    Code.PermissionDenied,
  );
  assert.equal(connectCode(new ForkdError("timeout", "x")), Code.DeadlineExceeded);
  assert.equal(connectCode(new ForkdError("unavailable", "x")), Code.Unavailable);
  assert.equal(toConnectError(new Error("secret host path")).rawMessage, "internal error");
  assert.equal(httpError(new ForkdError("not_found", "gone")).status, 404);
  assert.deepEqual(httpError(new ForkdError("resource_exhausted", "full", { errno_name: "ENOSPC" })).body, {
    code: 507,
    message: "full",
  });
  assert.equal(httpError(new ForkdError("unauthenticated", "who")).status, 401);
});

test("signed file URLs: the SDK's signature is accepted; another path, operation or an expiry is not", () => {
  const token = "tok123";
  const url = (path: string, sig: string, exp?: number) => {
    const u = new URL("http://x/files");
    u.searchParams.set("path", path);
    u.searchParams.set("username", "user");
    u.searchParams.set("signature", sig);
    if (exp !== undefined) u.searchParams.set("signature_expiration", String(exp));
    return u;
  };
  const now = Date.now();
  const exp = Math.floor(now / 1000) + 60;
  const sig = fileSignature("a.txt", "read", "user", token, exp);
  assert.match(sig, /^v1_[A-Za-z0-9+/]+$/);
  assert.equal(signatureValid(url("a.txt", sig, exp), "read", token, now), true);
  assert.equal(signatureValid(url("b.txt", sig, exp), "read", token, now), false);
  assert.equal(signatureValid(url("a.txt", sig, exp), "write", token, now), false);
  assert.equal(signatureValid(url("a.txt", sig, exp), "read", token, (exp + 1) * 1000), false);
  const forever = fileSignature("a.txt", "write", "user", token, null);
  assert.equal(signatureValid(url("a.txt", forever), "write", token, now), true);
});

test("users and paths: Basic auth's user, a username, relative paths against the home", () => {
  assert.equal(requestedUser(`Basic ${Buffer.from("root:").toString("base64")}`), "root");
  assert.equal(requestedUser(undefined, "user"), "user");
  assert.equal(requestedUser(undefined), null);
  assert.throws(() => requestedUser(undefined, "../x"), /invalid user/);
  const a = { name: "user", uid: 1000, gid: 1000, home: "/home/user" };
  assert.equal(resolvePath("x/y.txt", a), "/home/user/x/y.txt");
  assert.equal(resolvePath("~/z", a), "/home/user/z");
  assert.equal(resolvePath("/etc/../tmp/f", a), "/tmp/f");
  assert.throws(() => resolvePath("a\0b", a), /NUL/);
});
