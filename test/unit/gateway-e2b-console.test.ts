/**
 * E2B's API and the web console through the gateway (src/gateway/e2b.ts, console.ts), over a
 * fake etcd and fake nodes: E2B's create is placed on a node with the caller's key; its listings
 * merge; its sandbox plane goes to the sandbox's node with the envd access token, by header or
 * by Host. The console's session works on any gateway replica, is forwarded to nodes as the
 * token it stands for, and its tickets are single use across replicas.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { REPO_DIR } from "../../src/host/paths.js";
import { fakeCluster, until } from "../helpers/fake-cluster.js";
import { call } from "../helpers/gateway.js";

test("E2B: create placed with the caller's key, listings merged, a sandbox's calls to its node", async () => {
  const c = await fakeCluster({ nodes: 2 });
  try {
    const made: { sandboxID: string; clientID: string }[] = [];
    for (let i = 0; i < 4; i++) {
      const r = await call<{ sandboxID: string; clientID: string }>(c.gw.e2bUrl, "POST", "/v2/sandboxes", {
        headers: { "x-api-key": "alice-token" },
        body: { templateID: "own", timeout: 60 },
      });
      assert.equal(r.status, 201, JSON.stringify(r.body));
      made.push(r.body);
    }
    assert.deepEqual(new Set(made.map((m) => m.clientID)), new Set(["n1", "n2"]));
    const seen = c.nodes[0]!.seen.find(
      (s) => s.door === "e2b" && s.path === "/v2/sandboxes" && s.method === "POST",
    );
    assert.equal(seen?.headers.authorization ?? seen?.headers["x-api-key"], "Bearer alice-token");
    assert.deepEqual(JSON.parse(seen?.body ?? "{}"), { templateID: "own", timeout: 60 });
    // A template the caller cannot see is E2B's "template not found"; no key is a 401.
    const hidden = await call<{ code: number; message: string }>(c.gw.e2bUrl, "POST", "/sandboxes", {
      headers: { "x-api-key": "bob-token" },
      body: { templateID: "alice/own" },
    });
    assert.deepEqual(hidden.body, { code: 404, message: "template alice/own not found" });
    assert.equal((await call(c.gw.e2bUrl, "GET", "/v2/sandboxes")).status, 401);
    // The v2 listing: both nodes' items, newest first, the running total summed.
    const list = await call<{ sandboxID: string }[]>(c.gw.e2bUrl, "GET", "/v2/sandboxes?limit=3", {
      headers: { "x-api-key": "alice-token" },
    });
    assert.equal(list.status, 200);
    assert.equal(list.body.length, 3);
    assert.equal(list.headers.get("x-total-running"), "4");
    assert.ok(list.headers.get("x-next-token"));
    const v1 = await call<unknown[]>(c.gw.e2bUrl, "GET", "/sandboxes", {
      headers: { "x-api-key": "alice-token" },
    });
    assert.equal(v1.body.length, 4);
    // A sandbox's own call goes to its node; another tenant's is not found.
    const one = made[1]!;
    const killed = await call<{ node: string; method: string }>(
      c.gw.e2bUrl,
      "DELETE",
      `/sandboxes/${one.sandboxID}`,
      {
        headers: { "x-api-key": "alice-token" },
      },
    );
    assert.deepEqual(killed.body, {
      node: one.clientID,
      method: "DELETE",
      path: `/sandboxes/${one.sandboxID}`,
    });
    const other = await call<{ code: number }>(c.gw.e2bUrl, "GET", `/sandboxes/${one.sandboxID}`, {
      headers: { "x-api-key": "bob-token" },
    });
    assert.equal(other.body.code, 404);
  } finally {
    await c.close();
  }
});

test("E2B's sandbox plane goes to the sandbox's node with its access token, by header or by Host", async () => {
  const c = await fakeCluster({ nodes: 2 });
  try {
    const ids: { sandboxID: string; clientID: string }[] = [];
    // Until one lands on n2 (n1's warmth and holding take the first few).
    for (let i = 0; i < 8 && !ids.some((x) => x.clientID === "n2"); i++)
      ids.push(
        (
          await call<{ sandboxID: string; clientID: string }>(c.gw.e2bUrl, "POST", "/sandboxes", {
            headers: { "x-api-key": "bob-token" },
            body: { templateID: "app" },
          })
        ).body,
      );
    const sb = ids.find((x) => x.clientID === "n2") ?? ids[0]!;
    const byHeader = await call<{ node: string; accessToken: string; sandboxId: string; path: string }>(
      c.gw.e2bUrl,
      "POST",
      "/process.Process/List",
      {
        headers: {
          "e2b-sandbox-id": sb.sandboxID,
          "e2b-sandbox-port": "49983",
          "x-access-token": "envd-secret",
        },
        body: {},
      },
    );
    assert.equal(byHeader.status, 200);
    assert.deepEqual(
      [byHeader.body.node, byHeader.body.accessToken, byHeader.body.sandboxId, byHeader.body.path],
      [sb.clientID, "envd-secret", sb.sandboxID, "/process.Process/List"],
    );
    // By Host (E2B's <port>-<id>.<domain>): the Host reaches the node as it came.
    const port = new URL(c.gw.e2bUrl).port;
    const byHost = await new Promise<{ node: string; host: string }>((resolve, reject) => {
      import("node:http")
        .then(({ request }) => {
          const req = request(
            {
              host: "127.0.0.1",
              port,
              path: "/files?path=/x",
              headers: { host: `49983-${sb.sandboxID}.e2b.example:${port}` },
            },
            (res) => {
              let t = "";
              res.on("data", (d: Buffer) => (t += d.toString()));
              res.on("end", () => resolve(JSON.parse(t) as { node: string; host: string }));
            },
          );
          req.on("error", reject);
          req.end();
        })
        .catch(reject);
    });
    assert.equal(byHost.node, sb.clientID);
    assert.equal(byHost.host, `49983-${sb.sandboxID}.e2b.example:${port}`);
    // A sandbox no node serves: E2B's proxy answer.
    const gone = await call<{ code: number; message: string }>(c.gw.e2bUrl, "GET", "/health", {
      headers: { "e2b-sandbox-id": "sb-zzzzzzzzzzzzzzzz", "e2b-sandbox-port": "49983" },
    });
    assert.equal(gone.status, 502);
    assert.match(gone.body.message, /^The sandbox sb-zzzzzzzzzzzzzzzz was not found/);
    // A lost one answers the same (the plane checks no credential first: it tells nothing).
    const lostOne = ids.find((x) => x.clientID === "n2");
    assert.ok(lostOne, "a sandbox on n2");
    {
      c.nodes[1]!.kill();
      await until(async () => (await c.gw.running.gateway.view.sandbox(lostOne.sandboxID))?.state === "lost");
      const lost = await call<{ code: number; message: string }>(c.gw.e2bUrl, "GET", "/health", {
        headers: { "e2b-sandbox-id": lostOne.sandboxID, "e2b-sandbox-port": "49983" },
      });
      assert.deepEqual(
        [lost.status, lost.body.message],
        [502, `The sandbox ${lostOne.sandboxID} was not found (or is not running)`],
      );
    }
  } finally {
    await c.close();
  }
});

test("the console's session: any replica opens it, nodes get the token it stands for, tickets are used once", async () => {
  const c = await fakeCluster({ nodes: 1, consoleDist: join(REPO_DIR, "console", "dist") });
  try {
    const other = await c.another();
    const login = (headers: Record<string, string>, token: string) =>
      call<{ key: string; caller: { tenant: string; kind: string } }>(
        c.gw.url,
        "POST",
        "/v1/console/session",
        {
          headers,
          body: { token },
        },
      );
    assert.equal((await login({}, "alice-token")).status, 403);
    assert.equal((await login({ "x-forkd-console": "1" }, "wrong")).status, 401);
    const ok = await login({ "x-forkd-console": "1" }, "alice-token");
    assert.equal(ok.status, 200);
    assert.deepEqual(ok.body.caller, {
      kind: "token",
      name: "alice",
      tenant: "alice",
      admin: false,
      token: "tok-aliceaaaaaaa",
    });
    const cookie = /^(forkd_console=[^;]+);/.exec(ok.headers.get("set-cookie") ?? "")?.[1] ?? "";
    assert.match(ok.headers.get("set-cookie") ?? "", /HttpOnly; SameSite=Strict/);
    const session = { cookie, "x-forkd-console-key": ok.body.key, "x-forkd-console": "1" };
    // Another replica knows the session; the cookie alone is nobody.
    const who = await call<{ caller: { name: string } }>(other.url, "GET", "/v1/console/session", {
      headers: session,
    });
    assert.equal(who.body.caller.name, "alice");
    assert.equal((await call(other.url, "GET", "/v1/console/session", { headers: { cookie } })).status, 401);
    // Its calls reach nodes as the token's, without the console's own headers.
    const fork = await call<{ sandboxes: { id: string }[] }>(other.url, "POST", "/v1/sandboxes", {
      headers: session,
      body: { snapshot_tag: "app" },
    });
    assert.equal(fork.status, 201);
    const id = fork.body.sandboxes[0]!.id;
    const r = await call<{ authorization: string }>(
      c.gw.url,
      "GET",
      `/v1/sandboxes/${id}/files/stat?path=/`,
      { headers: session },
    );
    assert.equal(r.body.authorization, "Bearer alice-token");
    const relayed = c.nodes[0]!.seen.filter((s) => s.path.startsWith(`/v1/sandboxes/${id}/files/stat`));
    assert.equal(relayed.length, 1);
    assert.equal(relayed[0]?.headers["x-forkd-console-key"], undefined);
    assert.equal(relayed[0]?.headers.cookie, undefined);
    // A change without the console's header is refused (another site's form cannot add it).
    const csrf = await call(c.gw.url, "POST", "/v1/sandboxes", {
      headers: { cookie, "x-forkd-console-key": ok.body.key },
      body: { snapshot_tag: "app" },
    });
    assert.equal(csrf.status, 403);
    // A ticket from one replica, used on the other once; the node never sees it.
    const t = await call<{ ticket: string }>(c.gw.url, "POST", "/v1/console/ticket", { headers: session });
    const path = `/v1/sandboxes/${id}/files?path=/a&console_ticket=${encodeURIComponent(t.body.ticket)}`;
    const first = await call<{ path: string; authorization: string }>(other.url, "GET", path, {
      headers: { cookie },
    });
    assert.equal(first.status, 200);
    assert.equal(first.body.path, `/v1/sandboxes/${id}/files?path=%2Fa`);
    assert.equal(first.body.authorization, "Bearer alice-token");
    assert.equal((await call(c.gw.url, "GET", path, { headers: { cookie } })).status, 401);
    // Logging out drops the cookie.
    const out = await call(c.gw.url, "DELETE", "/v1/console/session", { headers: session });
    assert.match(out.headers.get("set-cookie") ?? "", /Max-Age=0/);
    // The front end itself.
    const page = await fetch(`${c.gw.url}/console/`);
    assert.equal(page.status, 200);
    assert.match(page.headers.get("content-security-policy") ?? "", /default-src 'self'/);
    await other.close();
  } finally {
    await c.close();
  }
});
