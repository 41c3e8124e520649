/**
 * The web console's daemon and CLI side against one real daemon (one snapshot, few forks):
 *   - GET /v1/events: `state` first, then a fork, a pause and a kill arrive as `sandbox`
 *     (running), `sandbox` (paused), `sandbox-gone`, in order; a client that stops reading and
 *     one that hangs up mid-stream leave the daemon serving;
 *   - the terminal WebSocket runs a command on a PTY: its output and the exit frame come back,
 *     a resize frame changes what `stty size` says, closing the socket kills the command;
 *   - a tenant's events and terminal do not reach another tenant's sandbox;
 *   - `forkd console`: the printed URL logs in once (refused without the secret and when
 *     reused); the cookie needs the page's key (a cookie alone is refused), and a POST needs
 *     X-Forkd-Console too; a terminal opens with a ticket.
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { request } from "node:http";
import type { IncomingMessage } from "node:http";
import { createInterface } from "node:readline";
import { WebSocket } from "ws";
import { CLI, makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";
import { rawRequest, readAll } from "../helpers/http.js";
import type { Endpoint } from "../helpers/http.js";
import { freePort } from "../helpers/port.js";
import { steps } from "../helpers/steps.js";
import { api, forkOne } from "../helpers/vm.js";
import { until } from "../helpers/fake-sandboxes.js";
import { withTimeout } from "../../src/util/time.js";

const TAG = "capi";
const { step, failed } = steps();
let d: TestDaemon;
let base = "";
let alice = "";
let bob = "";
let early: Events;

before(async () => {
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  d = await makeDaemon({ FORKD_LISTEN: `127.0.0.1:${port}`, FORKD_POOL_MAX: "2", FORKD_POOL_SIZE: "0" });
  // Watched from before it starts: the creation is told writing, then ready.
  early = await events(d.ep);
  await api(d, "POST", "/v1/snapshots", { tag: TAG, memory_mib: 256 });
  for (const tenant of ["alice", "bob"]) {
    const r = await api<{ token: string }>(d, "POST", "/v1/tokens", { tenant, scope: "tenant" });
    if (tenant === "alice") alice = r.token;
    else bob = r.token;
  }
});

after(async () => {
  await d?.destroy(failed());
});

interface SseEvent {
  id: string;
  event: string;
  data: Record<string, unknown>;
}

/** The events of a GET /v1/events reply as they come. */
class Events {
  readonly events: SseEvent[] = [];
  ended = false;
  private buf = "";
  private waiters: (() => void)[] = [];

  constructor(readonly res: IncomingMessage) {
    res.setEncoding("utf8");
    res.on("data", (s: string) => {
      this.buf += s;
      let i;
      while ((i = this.buf.indexOf("\n\n")) >= 0) {
        const block = this.buf.slice(0, i);
        this.buf = this.buf.slice(i + 2);
        const f: Record<string, string> = {};
        for (const line of block.split("\n")) {
          if (line.startsWith(":")) continue;
          const c = line.indexOf(": ");
          if (c > 0) f[line.slice(0, c)] = line.slice(c + 2);
        }
        if (f.event && f.data)
          this.events.push({
            id: f.id ?? "",
            event: f.event,
            data: JSON.parse(f.data) as Record<string, unknown>,
          });
      }
      this.wake();
    });
    const end = () => {
      this.ended = true;
      this.wake();
    };
    res.on("end", end);
    res.on("error", end);
    res.on("close", end);
  }

  private wake() {
    for (const w of this.waiters.splice(0)) w();
  }

  /** Waits until `pred` holds for the events so far. */
  async until(pred: (e: SseEvent[]) => boolean, what: string, ms = 120_000): Promise<void> {
    const deadline = Date.now() + ms;
    while (!pred(this.events)) {
      if (this.ended) throw new Error(`stream ended before ${what}`);
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await new Promise<void>((r) => {
        this.waiters.push(r);
        setTimeout(r, 500);
      });
    }
  }

  /** The events about sandbox `id`, as "type:state". */
  about(id: string): string[] {
    return this.events
      .filter((e) => (e.event === "sandbox" || e.event === "sandbox-gone") && e.data.id === id)
      .map((e) => (e.event === "sandbox" ? `sandbox:${String(e.data.state)}` : "sandbox-gone"));
  }
}

async function events(ep: Endpoint): Promise<Events> {
  const res = await rawRequest(ep, "GET", "/v1/events");
  assert.equal(res.statusCode, 200);
  assert.match(res.headers["content-type"] ?? "", /^text\/event-stream/);
  const e = new Events(res);
  await e.until((l) => l.length > 0, "the first event");
  assert.equal(e.events[0]?.event, "state", "state comes first");
  return e;
}

/** A terminal WebSocket: its output so far, and its control frames. */
interface Term {
  ws: WebSocket;
  out: () => string;
  controls: Record<string, unknown>[];
  closed: Promise<number>;
}

function terminal(
  ep: Endpoint,
  id: string,
  query: string,
  headers: Record<string, string> = {},
): Promise<Term | { status: number; body: string }> {
  const path = `/v1/sandboxes/${id}/terminal${query}`;
  const url = ep.socket
    ? `ws+unix://${ep.socket}:${path}`
    : `${(ep.url ?? "").replace(/^http/, "ws")}${path}`;
  const ws = new WebSocket(url, {
    headers: { ...(ep.token ? { authorization: `Bearer ${ep.token}` } : {}), ...headers },
  });
  let out = "";
  const controls: Record<string, unknown>[] = [];
  ws.on("message", (m: Buffer, binary) => {
    if (binary) out += m.toString("utf8");
    else controls.push(JSON.parse(m.toString("utf8")) as Record<string, unknown>);
  });
  const closed = new Promise<number>((r) => ws.on("close", (code) => r(code)));
  return new Promise((resolve, reject) => {
    ws.on("open", () => resolve({ ws, out: () => out, controls, closed }));
    ws.on("unexpected-response", (_req, res) => {
      void readAll(res).then((b) => resolve({ status: res.statusCode ?? 0, body: b.toString("utf8") }));
    });
    ws.on("error", reject);
  });
}

let id = "";

step("events: a creation its client waits on is told writing, then ready; one that fails, gone", async () => {
  const e = early;
  const about = (tag: string) =>
    e.events
      .filter((x) => (x.event === "snapshot" || x.event === "snapshot-gone") && x.data.tag === tag)
      .map((x) => (x.event === "snapshot" ? `snapshot:${String(x.data.status)}` : "snapshot-gone"));
  await e.until(() => about(TAG).includes("snapshot:ready"), "the snapshot ready");
  assert.deepEqual(about(TAG), ["snapshot:writing", "snapshot:ready"]);
  // While it failed nothing was left: told gone, and not listed.
  await assert.rejects(api(d, "POST", "/v1/snapshots", { tag: "capi-bad", template: "no-such-template" }));
  await e.until(() => about("capi-bad").includes("snapshot-gone"), "the failed creation gone");
  assert.deepEqual(about("capi-bad"), ["snapshot:writing", "snapshot-gone"]);
  const list = await api<{ pending: { tag: string }[] }>(d, "GET", "/v1/snapshots");
  assert.equal(
    list.pending.some((p) => p.tag === "capi-bad"),
    false,
  );
  // A creation of a tag that exists says nothing of it (it fails with a conflict).
  const before = about(TAG).length;
  await assert.rejects(api(d, "POST", "/v1/snapshots", { tag: TAG, memory_mib: 256 }));
  // Sends go in the order things happened: anything told of it comes before the second usage
  // sample after the reply (the first may have been queued before it).
  const usages = e.events.filter((x) => x.event === "usage").length;
  await e.until((l) => l.filter((x) => x.event === "usage").length > usages + 1, "two more usage samples");
  assert.equal(about(TAG).length, before);
  e.res.destroy();
});

step("events: a fork, a pause and a kill arrive in order after state", async () => {
  const e = await events(d.ep);
  id = await forkOne(d, TAG);
  await api(d, "POST", `/v1/sandboxes/${id}/pause`);
  await api(d, "POST", `/v1/sandboxes/${id}/resume`);
  const other = await forkOne(d, TAG);
  await api(d, "DELETE", `/v1/sandboxes/${other}`);
  await e.until((l) => l.some((x) => x.event === "sandbox-gone" && x.data.id === other), "the kill");
  assert.deepEqual(e.about(id), ["sandbox:running", "sandbox:paused", "sandbox:running"]);
  assert.deepEqual(e.about(other), ["sandbox:running", "sandbox-gone"]);
  const gone = e.events.find((x) => x.event === "sandbox-gone");
  assert.equal(gone?.data.exit_reason, "killed");
  const ids = e.events.map((x) => Number(x.id));
  assert.deepEqual(
    ids,
    [...ids].sort((a, b) => a - b),
    "ids increase",
  );
  await e.until(
    (l) => l.some((x) => x.event === "usage" && id in (x.data.sandboxes as object)),
    "usage of the sandbox",
  );
  e.res.destroy();
});

step("a client that stops reading, and one that hangs up mid-stream, leave the daemon serving", async () => {
  const stalled = await events(d.ep);
  stalled.res.pause();
  const cut = await rawRequest(d.ep, "GET", "/v1/events");
  await new Promise<void>((r) => cut.once("data", () => r()));
  cut.destroy();
  const more = await forkOne(d, TAG);
  await api(d, "DELETE", `/v1/sandboxes/${more}`);
  const h = await api<{ ok: boolean }>(d, "GET", "/v1/health");
  assert.equal(h.ok, true);
  const fresh = await events(d.ep);
  assert.ok(fresh.events[0]?.event === "state");
  fresh.res.destroy();
  stalled.res.destroy();
});

step("terminal: output and the exit frame, a resize, and closing the socket kills the command", async () => {
  const t = await terminal(
    d.ep,
    id,
    `?rows=30&cols=100&cmd=${encodeURIComponent("stty size; echo hi-$((6*7)); exit 3")}`,
  );
  assert.ok("ws" in t, JSON.stringify(t));
  assert.equal(await t.closed, 1000);
  assert.match(t.out(), /30 100/);
  assert.match(t.out(), /hi-42/);
  assert.deepEqual(t.controls, [{ type: "exit", exit_code: 3, signal: null }]);

  const sh = await terminal(d.ep, id, "?rows=24&cols=80&cmd=/bin/sh");
  assert.ok("ws" in sh);
  sh.ws.send(JSON.stringify({ type: "resize", rows: 40, cols: 120 }));
  sh.ws.send(Buffer.from("stty size\n"));
  await until("the new size", () => /40 120/.test(sh.out()), 60_000);
  sh.ws.send(Buffer.from("exit 0\n"));
  assert.equal(await sh.closed, 1000);
  assert.deepEqual(sh.controls, [{ type: "exit", exit_code: 0, signal: null }]);

  const long = await terminal(d.ep, id, `?cmd=${encodeURIComponent("sleep 600")}`);
  assert.ok("ws" in long);
  const running = async () =>
    (
      await api<{ commands: { cmd: unknown; pty: boolean }[] }>(d, "GET", `/v1/sandboxes/${id}/commands`)
    ).commands.some((c) => c.pty && c.cmd === "sleep 600");
  await until("the terminal's command", running, 60_000);
  long.ws.close();
  await until("the command killed when the socket closed", async () => !(await running()), 60_000);
});

step("a tenant's events and terminal do not reach another tenant's sandbox", async () => {
  const asBob = { url: base, token: bob };
  const bobEvents = await events(asBob);
  const state = bobEvents.events[0]?.data as { sandboxes: unknown[]; snapshots: { tag: string }[] };
  assert.deepEqual(state.sandboxes, [], "bob sees none of the admin's sandboxes");
  assert.ok(
    state.snapshots.some((s) => s.tag === TAG),
    "the shared snapshot is visible",
  );
  const r = await rawRequest(
    { url: base, token: alice },
    "POST",
    "/v1/sandboxes",
    JSON.stringify({ snapshot_tag: TAG }),
    600_000,
    { "content-type": "application/json" },
  );
  const forked = JSON.parse((await readAll(r)).toString("utf8")) as { sandboxes: { id: string }[] };
  assert.equal(r.statusCode, 201, JSON.stringify(forked));
  const aliceId = forked.sandboxes[0]?.id ?? "";
  // Two usage events after the fork: any event about it would have come before them.
  const usages = () => bobEvents.events.filter((x) => x.event === "usage").length;
  const n = usages();
  await bobEvents.until(() => usages() >= n + 2, "two usage events");
  assert.deepEqual(bobEvents.about(aliceId), []);
  for (const u of bobEvents.events.filter((x) => x.event === "usage"))
    assert.ok(!(aliceId in (u.data.sandboxes as object)), "bob's usage leaves alice's sandbox out");
  bobEvents.res.destroy();

  const denied = await terminal(asBob, aliceId, "?cmd=id");
  assert.ok("status" in denied);
  assert.equal(denied.status, 404, "another tenant's sandbox is not found");
  const mine = await terminal(
    { url: base, token: alice },
    aliceId,
    `?cmd=${encodeURIComponent("echo mine")}`,
  );
  assert.ok("ws" in mine);
  assert.equal(await mine.closed, 1000);
  assert.match(mine.out(), /mine/);
  await rawRequest({ url: base, token: alice }, "DELETE", `/v1/sandboxes/${aliceId}`).then(readAll);
});

let consoleProc: ChildProcess | null = null;

step(
  "forkd console: the printed URL logs in once; the cookie needs the page's key; a POST needs X-Forkd-Console",
  async () => {
    consoleProc = spawn(process.execPath, [CLI, "console"], { env: d.env, stdio: ["pipe", "pipe", "pipe"] });
    const proc = consoleProc;
    try {
      const rl = createInterface({ input: proc.stdout! });
      const nextLine = () =>
        new Promise<string>((resolve, reject) => {
          rl.once("line", resolve);
          proc.once("exit", (code) => reject(new Error(`forkd console exited (${code})`)));
        });
      const first = await nextLine();
      /** A line on its stdin prints another one-time URL: its secret. */
      const nextSecret = async () => {
        const line = nextLine();
        proc.stdin!.write("\n");
        return /login\?secret=([\w-]+)$/.exec(await line)?.[1];
      };
      const m = /^(http:\/\/127\.0\.0\.1:\d+)\/console\/login\?secret=([\w-]+)$/.exec(first);
      assert.ok(m, `the first line is the login URL: ${first}`);
      const origin = m[1] ?? "";
      const get = (path: string, headers: Record<string, string> = {}, method = "GET", body?: string) =>
        new Promise<{ status: number; headers: IncomingMessage["headers"]; body: string }>(
          (resolve, reject) => {
            const req = request(`${origin}${path}`, { method, headers }, (res) => {
              void readAll(res).then((b) =>
                resolve({ status: res.statusCode ?? 0, headers: res.headers, body: b.toString("utf8") }),
              );
            });
            req.on("error", reject);
            req.end(body);
          },
        );
      const without = await get("/console/login");
      assert.equal(without.status, 401);
      assert.equal(without.headers["set-cookie"], undefined);
      const port = new URL(origin).port;
      /** The page's login: the URL sends it the secret, which it posts for the cookie and key. */
      const login = async (secret: string) => {
        const sent = await get(`/console/login?secret=${secret}`);
        assert.equal(sent.status, 303);
        assert.equal(sent.headers.location, `/console/#login=${secret}`);
        const r = await get(
          "/v1/console/session",
          { "x-forkd-console": "1", "content-type": "application/json" },
          "POST",
          JSON.stringify({ secret }),
        );
        assert.equal(r.status, 200, r.body);
        const cookie = (r.headers["set-cookie"]?.[0] ?? "").split(";")[0] ?? "";
        assert.match(cookie, new RegExp(`^forkd_console_${port}=`), "one cookie per console port");
        return { cookie, "x-forkd-console-key": (JSON.parse(r.body) as { key: string }).key };
      };
      const s1 = await login(m[2] ?? "");
      const reused = await get(`/console/login?secret=${m[2] ?? ""}`);
      assert.equal(reused.status, 401, "the secret works once");
      assert.equal(reused.headers["set-cookie"], undefined);

      const health = await get("/v1/health", s1);
      assert.equal(health.status, 200);
      assert.equal((JSON.parse(health.body) as { ok: boolean }).ok, true);
      assert.equal((await get("/v1/health")).status, 401, "nothing");
      assert.equal((await get("/v1/health", { cookie: s1.cookie })).status, 401, "the cookie alone");
      const post = { ...s1, "content-type": "application/json" };
      const forged = await get(`/v1/sandboxes/${id}/pause`, post, "POST", "{}");
      assert.equal(forged.status, 403, "no POST without X-Forkd-Console");
      const stolen = await get(
        `/v1/sandboxes/${id}/pause`,
        { cookie: s1.cookie, "x-forkd-console": "1", "content-type": "application/json" },
        "POST",
        "{}",
      );
      assert.equal(stolen.status, 401, "a cookie replayed without the key");
      const real = await get(`/v1/sandboxes/${id}/pause`, { ...post, "x-forkd-console": "1" }, "POST");
      assert.equal(real.status, 200, real.body);
      assert.equal((JSON.parse(real.body) as { state: string }).state, "paused");
      const resumed = await get(`/v1/sandboxes/${id}/resume`, { ...post, "x-forkd-console": "1" }, "POST");
      assert.equal(resumed.status, 200, resumed.body);

      // Logging out ends this server's session: the old cookie and key no longer work.
      const who = await get("/v1/console/session", s1);
      assert.equal((JSON.parse(who.body) as { caller: { kind: string } }).caller.kind, "local");
      const s2 = await login((await nextSecret()) ?? "");
      assert.equal((await get("/v1/console/session", s2)).status, 200);
      const out = await get("/v1/console/session", { ...s1, "x-forkd-console": "1" }, "DELETE");
      assert.equal(out.status, 200, out.body);
      assert.match(out.headers["set-cookie"]?.[0] ?? "", new RegExp(`^forkd_console_${port}=;.*Max-Age=0`));
      assert.equal((await get("/v1/health", s1)).status, 401, "the session is ended");
      assert.equal((await get("/v1/health", s2)).status, 200, "another session is not");
      const ticket = await get("/v1/console/ticket", { ...s2, "x-forkd-console": "1" }, "POST");
      assert.equal(ticket.status, 200, ticket.body);
      const tk = (JSON.parse(ticket.body) as { ticket: string }).ticket;

      // Stopping the console ends its open terminals (and their commands) instead of waiting on them.
      const t = await terminal(
        { url: origin },
        id,
        `?cmd=${encodeURIComponent("sleep 700")}&console_ticket=${tk}`,
        {
          cookie: s2.cookie,
          origin,
        },
      );
      assert.ok("ws" in t, JSON.stringify(t));
      const running = async () =>
        (
          await api<{ commands: { cmd: unknown; pty: boolean }[] }>(d, "GET", `/v1/sandboxes/${id}/commands`)
        ).commands.some((c) => c.pty && c.cmd === "sleep 700");
      await until("the console terminal's command", running, 60_000);
      const exited = new Promise<number | null>((r) =>
        proc.exitCode !== null ? r(proc.exitCode) : proc.once("exit", r),
      );
      proc.kill("SIGTERM");
      assert.equal(await withTimeout(exited, 30_000, "forkd console exiting with a terminal open"), 0);
      await t.closed;
      await until("the terminal's command killed with the console", async () => !(await running()), 60_000);
    } finally {
      proc.kill("SIGTERM");
      await new Promise((r) => (proc.exitCode !== null ? r(null) : proc.once("exit", r)));
    }
  },
);
