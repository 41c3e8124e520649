/**
 * The API contract: the app serves exactly the routes the contract describes, the committed
 * OpenAPI document is the one the code generates, and the document is valid JSON Schema that a
 * standard validator accepts (the integration tests validate live responses with it).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { createApp } from "../../src/api/app.js";
import { buildOpenApi } from "../../src/api/contract/openapi.js";
import { ROUTES } from "../../src/api/contract/routes.js";
import { REPO_DIR } from "../../src/host/paths.js";
import { VERSION } from "../../src/host/version.js";
import { contractValidator } from "../helpers/contract.js";
import { testServices } from "../helpers/services.js";

test("the app serves exactly the routes in the contract", async () => {
  const { services, cleanup } = await testServices();
  try {
    const app = createApp(services);
    const served = new Set(
      app.routes
        .filter((r) => r.method !== "ALL")
        .map((r) => `${r.method.toLowerCase()} ${r.path.replace(/:(\w+)/g, "{$1}")}`),
    );
    const described = new Set(ROUTES.map((r) => `${r.method} ${r.path}`));
    assert.deepEqual([...served].sort(), [...described].sort());
  } finally {
    await cleanup();
  }
});

test("docs/openapi.json is the generated document (run `npm run openapi` after changing the API)", async () => {
  const committed = JSON.parse(await readFile(join(REPO_DIR, "docs", "openapi.json"), "utf8")) as unknown;
  assert.deepEqual(committed, JSON.parse(JSON.stringify(buildOpenApi(VERSION))));
});

test("operation ids are unique; the validator accepts a valid reply and rejects an invalid one", async () => {
  const v = await contractValidator();
  const ids = new Set<string>();
  for (const r of ROUTES) {
    assert.ok(!ids.has(r.operationId), `duplicate operationId ${r.operationId}`);
    ids.add(r.operationId);
  }
  // A known-good and a known-bad body for one schema prove the validator is really checking.
  v.check("get", "/v1/sandboxes/sb-aaaaaaaaaaaaaaaa/files/stat", 200, {
    path: "/x",
    type: "file",
    size: 1,
    mode: 420,
    mtime_ms: 0,
  });
  assert.throws(
    () => v.check("get", "/v1/sandboxes/sb-aaaaaaaaaaaaaaaa/files/stat", 200, { path: "/x", type: "pipe" }),
    /does not match the contract/,
  );
  assert.throws(() => v.check("get", "/v1/nowhere", 200, {}), /no route/);
});

test("served /v1/openapi.json equals the generator's output and needs no token", async () => {
  const { services, cleanup, tcp } = await testServices();
  try {
    const res = await createApp(services, tcp("t".repeat(22) + "0123456789abcdef")).request(
      "/v1/openapi.json",
    );
    assert.equal(res.status, 200);
    assert.deepEqual(await res.json(), JSON.parse(JSON.stringify(buildOpenApi(services.info.version))));
  } finally {
    await cleanup();
  }
});
