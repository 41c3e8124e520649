/**
 * E2B's error reply (src/http/e2b-error.ts), the one shape a daemon's E2B doors and a gateway's
 * answer with: a ForkdError keeps its code's HTTP status and its message (rewritten by `tell`, a
 * tenant's redaction, and by nothing else), a refusal its Retry-After; anything else is a 500
 * that tells nothing of itself. On a raw response (sendJson) the body is whole and not cached, and
 * a reply already started is cut, never answered twice.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { e2bErrorReply, sendJson } from "../../src/http/index.js";
import { ForkdError } from "../../src/util/index.js";

test("E2B's error shape: the code's status and message, Retry-After for a refusal, 500 for the rest", () => {
  assert.deepEqual(e2bErrorReply(new ForkdError("not_found", "no sandbox sb-x")), {
    status: 404,
    body: { code: 404, message: "no sandbox sb-x" },
    headers: {},
  });
  assert.deepEqual(e2bErrorReply(new ForkdError("rate_limited", "too many", { retry_after_s: 3 })), {
    status: 429,
    body: { code: 429, message: "too many" },
    headers: { "retry-after": "3" },
  });
  const told = e2bErrorReply(new ForkdError("invalid_argument", "bad /var/lib/x"), (m) =>
    m.replace("/var/lib", "<data>"),
  );
  assert.deepEqual(told.body, { code: 400, message: "bad <data>/x" });
  for (const e of [new Error("secret /etc/path"), "a string", undefined])
    assert.deepEqual(
      e2bErrorReply(e, () => "never called"),
      {
        status: 500,
        body: { code: 500, message: "internal error" },
        headers: {},
      },
    );
});

test("sendJson: a whole JSON body, not cached; a reply already started is cut", async () => {
  const server = createServer((req, res) => {
    if (req.url === "/twice") {
      res.writeHead(200, { "content-type": "application/json" });
      res.write('{"partial":');
    }
    sendJson(res, 503, { code: 503, message: "down" }, { "retry-after": "1" });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  try {
    const r = await fetch(`${url}/once`);
    assert.equal(r.status, 503);
    assert.deepEqual(
      [r.headers.get("cache-control"), r.headers.get("retry-after"), r.headers.get("content-type")],
      ["no-store", "1", "application/json"],
    );
    assert.deepEqual(await r.json(), { code: 503, message: "down" });
    // The client sees a broken reply (at its headers or its body), never a whole one.
    await assert.rejects(async () => (await fetch(`${url}/twice`)).text());
  } finally {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
});
