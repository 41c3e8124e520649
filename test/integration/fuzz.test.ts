/**
 * The API fuzzed, against one real daemon with a small snapshot and running sandboxes (so
 * requests reach deep code): seeded requests generated from docs/openapi.json, every route and
 * method, on the unix socket as the local admin and on TCP as a tenant. Bodies, queries and path
 * parameters start valid and are mutated (wrong types, missing and extra fields, huge and
 * unicode strings, extreme numbers, path traversal, invalid JSON, wrong content types,
 * oversized bodies); hostile packs go to POST /v1/snapshots/unpack.
 *
 * Asserted: the daemon never dies (same pid, answering at the end), no reply is a 500 or has
 * the code `internal` (all are collected and printed with the request that caused them), every
 * reply matches the contract, and nothing is written outside the daemon's data and cache
 * directories (every path-like value carries a token unique to the run, searched for on the
 * whole host afterwards; the daemon's TMPDIR and a few places are listed before and after).
 *
 * Bounded: FORKD_FUZZ_REQUESTS (default 1500) requests or FORKD_FUZZ_SECONDS (default 45) of
 * fuzzing, whichever comes first, but never fewer than 400 requests (every operation at least
 * seven times, every hostile pack as both callers). FORKD_FUZZ_SEED (printed) reproduces a run's
 * requests; FORKD_FUZZ_VERBOSE=1 prints each with its reply.
 *
 * So that later requests stay meaningful, the fixtures are protected: nothing deletes, pauses
 * or branches them (a victim sandbox, recreated when gone, takes those), their idle timeout and
 * deadline are never shortened, writes in them stay under /tmp/fz, commands are bounded in time, and
 * expensive operations (forks, branches, compaction, packs, pushes) run a few times only; the
 * rest are pointed at things that do not exist. Registries and pack URLs are on loopback: a
 * hostile server of the run's own (test/helpers/junk-server.ts), or a port nothing listens on.
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import type { IncomingMessage } from "node:http";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { Ajv2020 } from "ajv/dist/2020.js";
import type { ValidateFunction } from "ajv/dist/2020.js";
import { rawRequest, readAll } from "../helpers/http.js";
import type { Endpoint } from "../helpers/http.js";
import { REPO_DIR } from "../../src/host/paths.js";
import { contractValidator } from "../helpers/contract.js";
import { checkedRequest } from "../helpers/contract.js";
import { makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";
import { b32, describe, hostileValues, mutate, traversals, validValue } from "../helpers/fuzz-values.js";
import type { Schema, ValueContext } from "../helpers/fuzz-values.js";
import { hostilePacks } from "../helpers/hostile-packs.js";
import { startJunkServer } from "../helpers/junk-server.js";
import type { JunkServer } from "../helpers/junk-server.js";
import type { HostilePack } from "../helpers/hostile-packs.js";
import { findNamed, listPlaces, newEntries } from "../helpers/host-files.js";
import type { Listing } from "../helpers/host-files.js";
import { rng } from "../helpers/rng.js";
import type { Rng } from "../helpers/rng.js";
import { steps } from "../helpers/steps.js";
import { freePort } from "../helpers/port.js";

const SEED = Number(process.env.FORKD_FUZZ_SEED ?? 1701);
const COUNT = Number(process.env.FORKD_FUZZ_REQUESTS ?? 1500);
/**
 * Requests sent whatever the time budget says (more when the hostile packs need more: every
 * tenth request is one): every operation of the contract several times over (52 of them now).
 */
const MIN_REQUESTS = Math.min(COUNT, 400);
const SECONDS = Number(process.env.FORKD_FUZZ_SECONDS ?? 45);
/** FORKD_FUZZ_VERBOSE=1: every request and its reply's status and message. */
const VERBOSE = process.env.FORKD_FUZZ_VERBOSE === "1";
/** In every path-like value sent: what it made on the host is found by name. */
const TOKEN = `fz${SEED}q`;
const TAG = "fz";
const TAG_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$";
const CACHE_DIR = process.env.FORKD_CACHE_DIR ?? "/var/cache/forkd";
/** Bounds the daemon runs with (small, so an oversized body is cheap to send). */
const LIMITS = { json: 1 << 20, code: 2 << 20, stdin: 1 << 20, upload: 4 << 20, pack: 8 << 20 };
const { step, failed } = steps();

process.stderr.write(`fuzz: seed ${SEED} (FORKD_FUZZ_SEED=${SEED} reproduces this run)\n`);

type Json = Record<string, unknown>;

interface Param {
  name: string;
  in: "path" | "query";
  required: boolean;
  schema: Schema;
}

interface Op {
  method: string;
  template: string;
  re: RegExp;
  params: Param[];
  body: { type: string; schema: Schema; limit: keyof typeof LIMITS } | null;
}

interface Sent {
  n: number;
  via: "socket" | "tcp";
  method: string;
  path: string;
  headers: Record<string, string>;
  body: string;
}

interface Finding {
  sent: Sent;
  status: number;
  reply: string;
}

let d: TestDaemon;
let daemonPid = 0;
let tcpBase = "";
let tenantToken = "";
let tenantTokenId = "";
let privateTmp = "";
let admin = ""; // the admin's sandbox (netns network where the host allows it)
let tenants = ""; // the tenant's sandbox
let victim: string | null = null; // takes deletes, pauses and branches; recreated when gone
let places: Listing;
let junk: JunkServer | null = null;
const placesToList = () => [...new Set(["/", REPO_DIR, dirname(d.dataDir), privateTmp])];

before(async () => {
  privateTmp = await mkdtemp(join(tmpdir(), "forkd-fuzz-tmp-"));
  const port = await freePort();
  tcpBase = `http://127.0.0.1:${port}`;
  d = await makeDaemon({
    FORKD_LISTEN: `127.0.0.1:${port}`,
    FORKD_POOL_SIZE: "0",
    FORKD_NET_SLOTS: "1",
    FORKD_MAX_SANDBOXES: "8",
    FORKD_RATE_RPS: "1000",
    FORKD_RATE_BURST: "1000",
    // The fuzzer sends wrong credentials on purpose; its tenant is not to be locked out.
    FORKD_AUTH_FAIL_BURST: "1000000",
    FORKD_MAX_JSON_BYTES: String(LIMITS.json),
    FORKD_MAX_CODE_BYTES: String(LIMITS.code),
    FORKD_MAX_STDIN_BYTES: String(LIMITS.stdin),
    FORKD_MAX_UPLOAD_BYTES: String(LIMITS.upload),
    FORKD_MAX_PACK_BYTES: String(LIMITS.pack),
    FORKD_REGISTRY_IDLE_S: "10",
    TMPDIR: privateTmp,
  });
  daemonPid = d.proc.pid ?? 0;
});

after(async () => {
  await junk?.close();
  await d?.destroy(failed());
  await rm(privateTmp, { recursive: true, force: true });
});

const tcp = (token?: string): Endpoint => ({ url: tcpBase, ...(token ? { token } : {}) });

/** Forks one child of TAG (a setup call, checked against the contract). */
async function forkOne(ep: Endpoint, network?: Json): Promise<string> {
  const r = await checkedRequest<{ sandboxes: { id: string }[] }>(
    ep,
    "POST",
    "/v1/sandboxes",
    { snapshot_tag: TAG, n: 1, ...(network ? { network } : {}) },
    600_000,
  );
  const id = r.sandboxes[0]?.id;
  assert.ok(id, "forked");
  return id;
}

step("fixtures: a small snapshot, an admin sandbox (netns), a tenant token and its sandbox", async () => {
  places = await listPlaces(placesToList());
  await checkedRequest(d.ep, "POST", "/v1/snapshots", { tag: TAG, memory_mib: 256 }, 1_800_000);
  const health = await checkedRequest<{ network?: { netns: boolean } }>(d.ep, "GET", "/v1/health");
  admin = await forkOne(
    d.ep,
    health.network?.netns ? { mode: "netns", egress: { mode: "deny" } } : undefined,
  );
  const t = await checkedRequest<{ token: string; info: { id: string } }>(d.ep, "POST", "/v1/tokens", {
    tenant: "fuzzer",
    max_sandboxes: 4,
  });
  tenantToken = t.token;
  tenantTokenId = t.info.id;
  tenants = await forkOne(tcp(tenantToken));
});

// ---------------------------------------------------------------- the contract, as operations

async function loadOps(): Promise<{ ops: Op[]; doc: Json }> {
  const doc = JSON.parse(await readFile(join(REPO_DIR, "docs", "openapi.json"), "utf8")) as Json;
  const ops: Op[] = [];
  for (const [template, methods] of Object.entries(doc.paths as Record<string, Record<string, Json>>)) {
    for (const [method, op] of Object.entries(methods)) {
      const content = ((op.requestBody as Json | undefined)?.content ?? {}) as Record<
        string,
        { schema: Schema }
      >;
      const [type, media] = Object.entries(content)[0] ?? [];
      const tooLarge = ((op.responses as Record<string, Json>)["413"]?.description ?? "") as string;
      const limit = (/\((\w+)\)$/.exec(tooLarge)?.[1] ?? "json") as keyof typeof LIMITS;
      ops.push({
        method: method.toUpperCase(),
        template,
        re: new RegExp("^" + template.replace(/\{\w+\}/g, "[^/]+") + "$"),
        params: ((op.parameters ?? []) as Param[]).map((p) => ({ ...p, required: p.required === true })),
        body: type && media ? { type, schema: media.schema, limit: limit in LIMITS ? limit : "json" } : null,
      });
    }
  }
  return { ops, doc };
}

// ---------------------------------------------------------------- the run's state

interface State {
  r: Rng;
  tags: string[]; // snapshots the run made (branches, compactions): deletable
  tokenIds: string[]; // tokens the run made: revocable
  pids: number[]; // guest pids of commands the run started
  /** Templates a guest image can be built for (guest/image/templates). */
  templates: string[];
  /** Loopback hosts pulls and pushes go to: the junk server, and a port nothing listens on. */
  registries: string[];
  budget: Record<"forks" | "branches" | "compacts" | "packs" | "pushes" | "pauses" | "victims", number>;
  newTags: number;
}

const ghostSandbox = (r: Rng) => "sb-" + b32(r, 16);
const ghostTag = () => `${TOKEN}-none`;

/** A hostile value for a path or a query (strings at most a few KiB: URLs have a bound). */
function hostileText(r: Rng): string {
  const v = r.chance(0.5) ? r.pick(traversals(TOKEN)) : r.pick(hostileValues(TOKEN));
  const s = typeof v === "string" ? v : (JSON.stringify(v) ?? "");
  return s.slice(0, 3000);
}

/** A path or query part (at most 4000 characters encoded: the request line has a bound). */
function encodePart(r: Rng, s: string): string {
  const raw = s.includes("..") && r.chance(0.3); // sometimes raw (slashes and dots kept) where it traverses
  for (let v = s; ; v = v.slice(0, Math.floor(v.length / 2))) {
    let e: string;
    try {
      e = raw ? encodeURI(v) : encodeURIComponent(v);
    } catch {
      e = encodeURIComponent(v.replace(/[\ud800-\udfff]/g, "\ufffd"));
    }
    if (e.length <= 4000) return e;
  }
}

function valueContext(st: State, caller: "admin" | "tenant"): ValueContext {
  const { r } = st;
  const guestPaths = ["/tmp/fz", "/tmp/fz/a.txt", "/", "/root", "/etc/hostname", `/tmp/fz/${TOKEN}`];
  return {
    r,
    resolve: (s) => s, // replaced by the caller (needs the document)
    hint(name, s) {
      if (s.pattern === TAG_PATTERN) {
        if (name === "snapshot_tag") return r.chance(0.8) ? TAG : r.pick([ghostTag(), ...st.tags]);
        if (name === "tag") return r.chance(0.2) ? TAG : `${TOKEN}-${st.newTags++}`;
        return r.pick([TAG, ghostTag(), ...st.tags]);
      }
      switch (name) {
        case "id":
          return caller === "admin"
            ? r.pick([admin, admin, admin, admin, admin, tenants, victim ?? ghostSandbox(r), ghostSandbox(r)])
            : r.pick([
                tenants,
                tenants,
                tenants,
                tenants,
                tenants,
                victim ?? ghostSandbox(r),
                admin,
                ghostSandbox(r),
              ]);
        case "token_id":
          return r.pick(["tok-" + b32(r, 12), ...st.tokenIds]);
        case "pid":
          return st.pids.length && r.chance(0.6) ? r.pick(st.pids) : r.int(1, 99_999);
        case "port":
          return r.pick([8000, 8080, r.int(1, 65_535)]);
        case "tenant":
          return `fz-${b32(r, 4)}`;
        case "template":
          return r.pick(["python", "python", "nosuchtemplate"]);
        case "ref":
          return r.pick([
            `127.0.0.1:1/${TOKEN}/x:1`,
            `localhost:1/a/b@sha256:${"0".repeat(64)}`,
            `127.0.0.1:1/../../escape-${TOKEN}`,
            "no-host-here",
          ]);
        case "url":
          return r.pick([
            `http://127.0.0.1:1/${TOKEN}.tar.zst`,
            "https://127.0.0.1:1/x",
            "file:///etc/passwd",
            `http://127.0.0.1:1/../../escape-${TOKEN}`,
          ]);
        case "cmd":
          return r.pick([
            "true",
            "echo fz",
            "ls /tmp",
            "cat /etc/hostname",
            ["true"],
            ["echo", "fz"],
            ["ls", "-la", "/"],
          ]);
        case "code":
          return r.pick(["1+1", "print('fz')", "import os; os.getcwd()", "x = 1"]);
        case "path":
        case "cwd":
        case "from":
        case "to":
          return r.pick(guestPaths);
        case "cidr":
          return r.pick(["203.0.113.0/24", "198.51.100.7", "0.0.0.0/0", "10.0.0.0/8"]);
        case "key:env":
          return r.pick(["FZ_A", "PATH", "LD_PRELOAD"]);
        case "key:metadata":
          return r.pick(["k1", "owner", "é"]);
        default:
          return undefined;
      }
    },
  };
}

// ---------------------------------------------------------------- taming (see the header)

const isObj = (v: unknown): v is Json => v !== null && typeof v === "object" && !Array.isArray(v);
const rebase = (p: unknown): unknown =>
  typeof p === "string" && p.startsWith("/") ? "/tmp/fz/" + p.slice(1).replaceAll("..", "__") : p;
/** A registry reference or a URL pointed at one of the run's own loopback hosts. */
const loopbackRef = (st: State, ref: unknown): unknown => {
  if (typeof ref !== "string") return ref;
  const m = /^([^/]+)\/(.*)$/s.exec(ref);
  return m && /[.:]|^localhost$/.test(m[1] ?? "") ? `${st.r.pick(st.registries)}/${m[2] ?? ""}` : ref;
};
const loopbackUrl = (st: State, url: unknown): unknown =>
  typeof url === "string"
    ? url.replace(
        /^([a-z][a-z0-9+.-]*:\/\/)[^/]*/i,
        (_m, scheme: string) => `${scheme}${st.r.pick(st.registries)}`,
      )
    : url;

interface Draft {
  op: Op;
  caller: "admin" | "tenant";
  pathVals: Record<string, string>;
  query: Array<[string, string]>;
  /** A JSON body not yet serialised (undefined: raw or none). */
  json: unknown;
  notes: string[];
}

/**
 * Operations that end, stop or pause the sandbox they name: never a fixture (the victim
 * instead), and on the victim within a budget where they are expensive.
 */
const DESTRUCTIVE = new Map<string, keyof State["budget"] | null>([
  ["DELETE /v1/sandboxes/{id}", null],
  ["POST /v1/sandboxes/{id}/pause", "pauses"],
  ["POST /v1/sandboxes/{id}/resume", "pauses"],
  ["POST /v1/sandboxes/{id}/branch", "branches"],
]);

/** Keeps the fixtures alive and the run bounded (see the header); returns notes of what it changed. */
function tame(st: State, x: Draft): void {
  const key = `${x.op.method} ${x.op.template}`;
  const fixtures = new Set([admin, tenants]);
  const pv = x.pathVals;
  const spend = (what: keyof State["budget"]): boolean => {
    if (st.budget[what] <= 0) return false;
    st.budget[what]--;
    return true;
  };
  const real = (tag: string | undefined) => tag === TAG || st.tags.includes(tag ?? "");
  const body = isObj(x.json) ? x.json : null;
  if (DESTRUCTIVE.has(key)) {
    if (fixtures.has(pv.id ?? "")) pv.id = victim ?? ghostSandbox(st.r);
    const budget = DESTRUCTIVE.get(key);
    if (pv.id === victim && budget && !spend(budget)) pv.id = ghostSandbox(st.r);
  }
  switch (key) {
    case "POST /v1/sandboxes/{id}/timeout":
      if (body && typeof body.timeout_ms === "number") body.timeout_ms = null;
      break;
    case "POST /v1/sandboxes/{id}/deadline":
      // A valid deadline is put past the run's end (a fixture killed by it would end the run's
      // meaning); the invalid ones (negative, fractional, too far) go as they are.
      if (
        body &&
        Number.isInteger(body.deadline_ms) &&
        (body.deadline_ms as number) >= 0 &&
        (body.deadline_ms as number) < 3_600_000
      )
        body.deadline_ms = 3_600_000;
      break;
    case "DELETE /v1/snapshots/{tag}":
      if (pv.tag === TAG) pv.tag = ghostTag();
      break;
    case "DELETE /v1/tokens/{token_id}":
      if (pv.token_id === tenantTokenId) pv.token_id = "tok-" + b32(st.r, 12);
      break;
    case "POST /v1/snapshots":
      // A new tag boots a VM, unless the template is one no image can be built for (refused
      // before anything starts): then the tag may be new.
      if (body && typeof body.tag === "string" && new RegExp(TAG_PATTERN).test(body.tag)) {
        const unbuildable = typeof body.template === "string" && !st.templates.includes(body.template);
        if (!unbuildable) body.tag = TAG;
      }
      break;
    case "POST /v1/sandboxes":
      if (body && typeof body.n === "number" && body.n > 1 && body.n <= 1000) body.n = 1;
      if (body && body.snapshot_tag === TAG && !spend("forks")) body.snapshot_tag = ghostTag();
      break;
    case "POST /v1/snapshots/{tag}/compact":
      if (real(pv.tag) && !spend("compacts")) pv.tag = ghostTag();
      break;
    case "GET /v1/snapshots/{tag}/pack":
      if (real(pv.tag) && !spend("packs")) pv.tag = ghostTag();
      break;
    case "POST /v1/snapshots/{tag}/push":
      if (real(pv.tag) && !spend("pushes")) pv.tag = ghostTag();
      if (body) body.ref = loopbackRef(st, body.ref);
      break;
    case "POST /v1/snapshots/pull":
      if (body) {
        body.ref = loopbackRef(st, body.ref);
        body.url = loopbackUrl(st, body.url);
        if (body.ref === undefined) delete body.ref;
        if (body.url === undefined) delete body.url;
      }
      break;
    case "POST /v1/sandboxes/{id}/exec":
    case "POST /v1/sandboxes/{id}/exec/stream":
    case "POST /v1/sandboxes/{id}/eval":
      if (body) {
        if (typeof body.timeout_ms === "number" && body.timeout_ms > 10_000) body.timeout_ms = 10_000;
        if (body.keep_stdin_open === true && typeof body.timeout_ms !== "number") body.timeout_ms = 5_000;
      }
      break;
    case "PUT /v1/sandboxes/{id}/files":
    case "DELETE /v1/sandboxes/{id}/files":
      x.query = x.query.map(([k, v]) => [k, k === "path" ? String(rebase(v)) : v]);
      break;
    case "POST /v1/sandboxes/{id}/files/mkdir":
      if (body) body.path = rebase(body.path);
      break;
    case "POST /v1/sandboxes/{id}/files/rename":
      if (body) {
        body.from = rebase(body.from);
        body.to = rebase(body.to);
      }
      break;
  }
}

// ---------------------------------------------------------------- requests

interface Built {
  sent: Sent;
  raw: Buffer | undefined;
  op: Op;
  caller: "admin" | "tenant";
}

const RAW_JSON_MUTANTS = [
  (t: string) => t.slice(0, Math.max(1, Math.floor(t.length / 2))),
  (t: string) => t + "}}}",
  () => "{",
  (t: string) => "\ufeff" + t,
  () => '{"a":1,"a":{"b":[1,2,}',
  () => "1e99999",
  () => "null",
  () => "[]",
  () => `{"__proto__":{"polluted":"${TOKEN}"},"constructor":{"prototype":{"x":1}}}`,
  () => "",
  () => "\u0000",
];

function build(
  st: State,
  op: Op,
  caller: "admin" | "tenant",
  resolve: (s: Schema) => Schema,
  n: number,
): Built {
  const { r } = st;
  const ctx = { ...valueContext(st, caller), resolve };
  const notes: string[] = [];
  const pathVals: Record<string, string> = {};
  const query: Array<[string, string]> = [];
  for (const p of op.params) {
    if (p.in === "path") {
      const v = r.chance(0.9) ? validValue(ctx, p.schema, p.name) : hostileText(r);
      pathVals[p.name] = String(v);
    } else {
      const roll = r.next();
      if (!p.required && roll < 0.45) continue;
      const v = roll < 0.9 ? validValue(ctx, p.schema, p.name) : hostileText(r);
      query.push([p.name, typeof v === "string" ? v.slice(0, 3000) : (JSON.stringify(v) ?? "")]);
    }
  }
  if (r.chance(0.08)) query.push([r.pick(["x", "__proto__", "stream", "path"]), hostileText(r)]);
  if (query.length && r.chance(0.05)) query.push(query[0] as [string, string]);

  let json: unknown;
  let raw: Buffer | undefined;
  let type: string | undefined = op.body?.type;
  if (op.body?.type === "application/json") {
    const valid = validValue(ctx, op.body.schema);
    const roll = r.next();
    if (roll < 0.35) {
      json = valid;
      notes.push("valid");
    } else {
      const m = mutate(r, valid, TOKEN);
      json = m.value;
      notes.push(...m.what);
    }
  } else if (op.body) {
    const size = r.pick([0, 1, 100, 4096, 65_536]);
    raw = r.bytes(size);
    notes.push(`${size} random bytes`);
  } else if (r.chance(0.05)) {
    json = r.pick(hostileValues(TOKEN));
    type = "application/json";
    notes.push("a body where none is expected");
  }

  const draft: Draft = { op, caller, pathVals, query, json, notes };
  tame(st, draft);

  if (json !== undefined) {
    let text = JSON.stringify(json) ?? "null";
    if (r.chance(0.12)) {
      text = r.pick(RAW_JSON_MUTANTS)(text);
      notes.push(`raw ${describe(text)}`);
    }
    raw = Buffer.from(text, "utf8");
    if (r.chance(0.03)) {
      raw = Buffer.concat([
        raw.subarray(0, Math.max(0, raw.length - 2)),
        Buffer.from([0xff, 0xfe]),
        raw.subarray(-2),
      ]);
      notes.push("invalid UTF-8");
    }
  }
  if (op.body && r.chance(0.03)) {
    // Past the route's bound by a little.
    const limit = LIMITS[op.body.limit];
    raw = Buffer.alloc(limit + 1024, 0x20);
    raw.write(op.body.type === "application/json" ? '{"x":"' : "x", 0);
    raw.write('"}', limit + 1020);
    notes.push(`oversized (${limit + 1024} bytes over a ${limit} bound)`);
  }
  const headers: Record<string, string> = {};
  if (raw !== undefined) {
    // Framed whatever the method (Node's client sends a GET's body unframed otherwise).
    headers["content-length"] = String(raw.length);
    headers["content-type"] = type ?? "application/json";
    if (r.chance(0.08)) {
      const wrong = r.pick([
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/json; charset=utf-16",
        op.body?.type === "application/json" ? "application/octet-stream" : "application/json",
        "",
      ]);
      if (wrong) headers["content-type"] = wrong;
      else delete headers["content-type"];
      notes.push(`content-type ${JSON.stringify(wrong)}`);
    }
  }
  if (caller === "tenant") {
    headers.authorization = `Bearer ${tenantToken}`;
    if (r.chance(0.04)) {
      const bad = r.pick([
        "",
        `Bearer ${tenantToken}x`,
        "Basic Zm9vOmJhcg==",
        `Bearer ${"A".repeat(600)}`,
        "Bearer  ",
        `bearer ${tenantToken}`,
      ]);
      if (bad) headers.authorization = bad;
      else delete headers.authorization;
      notes.push(`authorization ${describe(bad.replace(tenantToken, "<token>"))}`);
    }
  }
  let method = op.method;
  if (r.chance(0.03)) {
    method = r.pick(["PATCH", "OPTIONS", "PROPFIND"]);
    notes.push(`method ${method}`);
  }
  const path =
    op.template.replace(/\{(\w+)\}/g, (_m, k: string) => encodePart(r, pathVals[k] ?? "")) +
    (draft.query.length
      ? "?" + draft.query.map(([k, v]) => `${encodeURIComponent(k)}=${encodePart(r, v)}`).join("&")
      : "");
  return {
    op,
    caller,
    raw,
    sent: {
      n,
      via: caller === "admin" ? "socket" : "tcp",
      method,
      path,
      headers,
      body: notes.join("; "),
    },
  };
}

// ---------------------------------------------------------------- replies

interface Outcome {
  status: number;
  contentType: string;
  text: string;
  parsed: unknown;
  events: Json[];
}

/**
 * Routes whose successful reply only the client ends (a watch: events as they happen, none on
 * an idle guest path): read for OPEN_STREAM_MS, then hung up (a client that hangs up mid-stream,
 * which the daemon must survive too); the events that arrived whole are checked like any other.
 * Read to the end, one would wait for the idle timeout (60 s) with nothing to check.
 */
const OPEN_ENDED = /\/files\/watch$|^\/v1\/events$/;
const OPEN_STREAM_MS = 2_000;

/** The reply's bytes within `ms`, then the connection cut (whole lines only). */
async function readFor(res: IncomingMessage, ms: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let cut = false;
  const timer = setTimeout(() => {
    cut = true;
    res.destroy();
  }, ms);
  try {
    for await (const c of res) chunks.push(c as Buffer);
  } catch (e) {
    if (!cut) throw e;
  } finally {
    clearTimeout(timer);
  }
  const all = Buffer.concat(chunks);
  return cut ? all.subarray(0, all.lastIndexOf(10) + 1) : all;
}

async function send(b: Built, timeoutMs: number): Promise<Outcome> {
  const ep = b.sent.via === "socket" ? d.ep : tcp();
  const res = await rawRequest(ep, b.sent.method, b.sent.path, b.raw, timeoutMs, b.sent.headers);
  const openEnded = b.sent.method === "GET" && OPEN_ENDED.test(b.op.template) && res.statusCode === 200;
  const bytes = openEnded ? await readFor(res, OPEN_STREAM_MS) : await readAll(res);
  const contentType = res.headers["content-type"] ?? "";
  const binary = /^application\/(octet-stream|zstd)/.test(contentType);
  const text = binary ? `(${bytes.length} bytes)` : bytes.toString("utf8");
  let parsed: unknown = text;
  const events: Json[] = [];
  if (contentType.startsWith("application/json")) parsed = JSON.parse(text);
  else if (contentType.startsWith("application/x-ndjson")) {
    for (const line of text.split("\n").filter((l) => l.trim())) events.push(JSON.parse(line) as Json);
    parsed = events;
  }
  return { status: res.statusCode ?? 0, contentType, text, parsed, events };
}

function shuffle<T>(r: Rng, xs: readonly T[]): T[] {
  const out = [...xs];
  for (let i = out.length - 1; i > 0; i--) {
    const j = r.int(0, i);
    [out[i], out[j]] = [out[j] as T, out[i] as T];
  }
  return out;
}

const errorCode = (v: unknown): string | undefined =>
  isObj(v) && isObj(v.error) && typeof v.error.code === "string" ? v.error.code : undefined;

// ---------------------------------------------------------------- the run

step(
  `${COUNT} seeded requests from docs/openapi.json (socket as admin, TCP as a tenant), hostile packs included: no crash, no 500, every reply in the contract`,
  async () => {
    const { ops, doc } = await loadOps();
    const contract = await contractValidator();
    const ajv = new Ajv2020({ strict: false, allErrors: false });
    ajv.addSchema({ $id: "fz", components: doc.components }, "fz");
    const errorShape: ValidateFunction = ajv.compile({ $ref: "fz#/components/schemas/Error" });
    const schemas = (doc.components as Json).schemas as Record<string, Schema>;
    const resolve = (s: Schema): Schema => {
      for (let x = s; ;) {
        if (typeof x.$ref !== "string") return x;
        x = schemas[x.$ref.replace("#/components/schemas/", "")] ?? {};
      }
    };
    const packBodies = await hostilePacks(rng(SEED + 1), TOKEN);
    junk = await startJunkServer(
      rng(SEED + 2),
      TOKEN,
      packBodies.map((p) => p.body),
    );
    const st: State = {
      r: rng(SEED),
      registries: [junk.host, junk.host, `127.0.0.1:${await freePort()}`],
      templates: (await readdir(join(REPO_DIR, "guest", "image", "templates"))).map((f) =>
        f.replace(/\.packages$/, ""),
      ),
      tags: [],
      tokenIds: [],
      pids: [],
      budget: { forks: 4, branches: 2, compacts: 1, packs: 1, pushes: 2, pauses: 4, victims: 3 },
      newTags: 0,
    };
    const packs: Array<HostilePack & { via: "admin" | "tenant" }> = (
      await hostilePacks(rng(SEED + 1), TOKEN)
    ).flatMap((p) => [
      { ...p, via: "admin" as const },
      { ...p, via: "tenant" as const },
    ]);
    const unpack = ops.find((o) => o.template === "/v1/snapshots/unpack");
    assert.ok(unpack);
    // Enough that every hostile pack goes out, as both callers.
    const packCount = packs.length;
    const least = Math.min(COUNT, Math.max(MIN_REQUESTS, 10 * packCount));

    const internal: Finding[] = [];
    const violations: Array<Finding & { why: string }> = [];
    const transport: Array<{ sent: Sent; error: string }> = [];
    const statuses = new Map<number, number>();
    const byOp: Record<string, Record<number, number>> = {};
    const covered = new Set<string>();
    let crashed: Sent | null = null;
    const t0 = performance.now();
    let order: Op[] = [];
    let n = 0;

    for (; n < COUNT; n++) {
      // The time budget bounds a fast run's length; it never cuts one short of the minimum, so
      // a loaded machine makes the test slower, not failed.
      if (n >= least && performance.now() - t0 > SECONDS * 1000) break;
      // The victim (deletes, pauses, branches) is recreated while the budget lasts.
      if (victim === null && st.budget.victims > 0) {
        st.budget.victims--;
        victim = await forkOne(tcp(tenantToken)).catch(() => null);
      }
      let b: Built;
      const pack = n % 10 === 5 ? packs.shift() : undefined;
      if (pack) {
        b = build(st, unpack, pack.via, resolve, n);
        b.raw = pack.body;
        b.sent.headers["content-length"] = String(pack.body.length);
        b.sent.method = "POST";
        b.sent.path = "/v1/snapshots/unpack";
        b.sent.headers["content-type"] = "application/octet-stream";
        if (pack.via === "tenant") b.sent.headers.authorization = `Bearer ${tenantToken}`;
        b.sent.body = `hostile pack: ${pack.name}`;
      } else {
        // Every operation once per round, in a seeded order.
        if (order.length === 0) order = shuffle(st.r, ops);
        const op = order.pop() as Op;
        b = build(st, op, st.r.chance(0.5) ? "admin" : "tenant", resolve, n);
      }
      covered.add(`${b.op.method} ${b.op.template}`);
      const heavy = /\/pack$|\/branch$|\/compact$|\/push$/.test(b.op.template);
      let out: Outcome;
      try {
        out = await send(b, heavy ? 300_000 : 60_000);
      } catch (e) {
        transport.push({ sent: b.sent, error: String(e) });
        if (d.proc.exitCode !== null || d.proc.signalCode !== null) {
          crashed = b.sent;
          break;
        }
        continue;
      }
      statuses.set(out.status, (statuses.get(out.status) ?? 0) + 1);
      if (VERBOSE) {
        const msg = isObj(out.parsed) && isObj(out.parsed.error) ? String(out.parsed.error.message) : "";
        process.stderr.write(
          `fuzz: #${n} ${b.sent.via} ${b.sent.method} ${b.sent.path.slice(0, 160)} [${b.sent.body.slice(0, 160)}] → ${out.status} ${msg.slice(0, 200)}\n`,
        );
      }
      const per = (byOp[`${b.op.method} ${b.op.template}`] ??= {});
      per[out.status] = (per[out.status] ?? 0) + 1;
      const reply = out.text.slice(0, 1500);
      const codes = [errorCode(out.parsed), ...out.events.map(errorCode)];
      if (out.status === 500 || codes.includes("internal"))
        internal.push({ sent: b.sent, status: out.status, reply });
      // The contract: a documented route's reply, else an error envelope.
      const bare = b.sent.path.split("?")[0] ?? "";
      const documented = ops.some((o) => o.method === b.sent.method && o.re.test(bare));
      try {
        if (documented) contract.check(b.sent.method, b.sent.path, out.status, out.parsed, out.contentType);
        else if (out.status < 400) throw new Error("a success on a path or method outside the contract");
        else if (!errorShape(out.parsed)) throw new Error("not the error envelope");
      } catch (e) {
        violations.push({ sent: b.sent, status: out.status, reply, why: String(e).slice(0, 600) });
      }
      await bookkeeping(st, b, out);
      if (d.proc.exitCode !== null || d.proc.signalCode !== null) {
        crashed = b.sent;
        break;
      }
    }
    const elapsed = (performance.now() - t0) / 1000;

    const show = (f: { sent: Sent; status?: number; reply?: string; why?: string; error?: string }) =>
      `  #${f.sent.n} ${f.sent.via} ${f.sent.method} ${f.sent.path.slice(0, 300)}\n` +
      `     request: ${f.sent.body.slice(0, 400)}\n` +
      (f.status !== undefined ? `     reply ${f.status}: ${(f.reply ?? "").slice(0, 600)}\n` : "") +
      (f.why ? `     why: ${f.why}\n` : "") +
      (f.error ? `     error: ${f.error}\n` : "");
    process.stderr.write(
      `fuzz: seed ${SEED}: ${n} requests in ${elapsed.toFixed(0)} s; statuses ` +
        [...statuses]
          .sort(([a], [b2]) => a - b2)
          .map(([s, c]) => `${s}:${c}`)
          .join(" ") +
        `; ${internal.length} internal, ${violations.length} contract violations, ${transport.length} transport errors\n` +
        Object.entries(byOp)
          .sort()
          .map(
            ([k, v]) =>
              `fuzz:   ${k}: ${Object.entries(v)
                .map(([st, c]) => `${st}:${c}`)
                .join(" ")}\n`,
          )
          .join("") +
        (internal.length ? `fuzz: 500 / internal:\n${internal.map(show).join("")}` : "") +
        (violations.length ? `fuzz: contract violations:\n${violations.map(show).join("")}` : "") +
        (transport.length ? `fuzz: transport errors:\n${transport.slice(0, 20).map(show).join("")}` : ""),
    );

    assert.equal(crashed, null, `the daemon died after ${crashed ? show({ sent: crashed }) : ""}`);
    assert.equal(d.proc.pid, daemonPid, "same daemon");
    for (const ep of [d.ep, tcp(tenantToken)]) {
      const h = await checkedRequest<{ ok: boolean }>(ep, "GET", "/v1/health", undefined, 30_000);
      assert.equal(h.ok, true);
    }
    // The fixtures still work: the run stayed meaningful to its end.
    for (const [ep, id] of [
      [d.ep, admin],
      [tcp(tenantToken), tenants],
    ] as const) {
      const r = await checkedRequest<{ stdout: string }>(ep, "POST", `/v1/sandboxes/${id}/exec`, {
        cmd: "echo alive",
        timeout_ms: 30_000,
      });
      assert.equal(r.stdout, "alive\n");
    }
    assert.ok(n >= least, `only ${n} requests`);
    if (least >= 10 * packCount) assert.equal(packs.length, 0, "every hostile pack was sent");
    const missing = ops.map((o) => `${o.method} ${o.template}`).filter((k) => !covered.has(k));
    assert.deepEqual(missing, [], "every operation of the contract was fuzzed");
    assert.deepEqual(
      internal.map((f) => `#${f.sent.n} ${f.sent.method} ${f.sent.path.slice(0, 120)} → ${f.status}`),
      [],
      "replies with status 500 or code internal (printed above with their requests)",
    );
    assert.deepEqual(
      violations.map((f) => `#${f.sent.n} ${f.sent.method} ${f.sent.path.slice(0, 120)} → ${f.status}`),
      [],
      "replies outside the contract (printed above)",
    );
  },
);

/** What the run remembers from a reply (tags and tokens it made, pids), and what it cleans. */
async function bookkeeping(st: State, b: Built, out: Outcome): Promise<void> {
  const key = `${b.sent.method} ${b.op.template}`;
  const p = out.parsed;
  if (out.status >= 300) return;
  if (key === "POST /v1/sandboxes" && isObj(p) && Array.isArray(p.sandboxes)) {
    for (const s of p.sandboxes as Json[]) {
      await checkedRequest(d.ep, "DELETE", `/v1/sandboxes/${String(s.id)}`, undefined, 120_000).catch(
        () => undefined,
      );
    }
  }
  if ((key.endsWith("/branch") || key.endsWith("/compact")) && isObj(p) && typeof p.tag === "string")
    st.tags.push(p.tag);
  if (key === "POST /v1/snapshots/unpack" && isObj(p) && Array.isArray(p.published))
    st.tags.push(...(p.published as string[]));
  if (key === "DELETE /v1/snapshots/{tag}" && isObj(p)) {
    const gone = new Set([p.deleted, ...((p.cascaded as unknown[]) ?? [])]);
    st.tags = st.tags.filter((t) => !gone.has(t));
  }
  if (key === "DELETE /v1/sandboxes/{id}" && victim && b.sent.path.includes(victim)) victim = null;
  if (key === "POST /v1/tokens" && isObj(p) && isObj(p.info) && typeof p.info.id === "string")
    st.tokenIds.push(p.info.id);
  for (const ev of out.events) if (typeof ev.pid === "number") st.pids.push(ev.pid);
}

step("nothing was written outside the daemon's data and cache directories", async () => {
  // The search finds what it is looking for (a probe made here), then what the run left.
  const probe = join(tmpdir(), `forkd-fuzz-probe-${TOKEN}`);
  await writeFile(probe, "");
  try {
    assert.ok((await findNamed(TOKEN, ["/"], [d.dataDir, CACHE_DIR])).includes(probe), "the search works");
  } finally {
    await rm(probe, { force: true });
  }
  const found = await findNamed(TOKEN, ["/"], [d.dataDir, CACHE_DIR]);
  assert.deepEqual(found, [], `paths named after the run's token (${TOKEN}) outside the data and cache dirs`);
  assert.deepEqual(await readdir(privateTmp), [], "the daemon's TMPDIR is left empty");
  const now = await listPlaces(placesToList());
  // Nothing new at the top of / or of the repository (the daemon's working directory).
  const shared = dirname(d.dataDir);
  const own = (m: Listing) => new Map([...m].filter(([dir]) => dir !== shared));
  assert.deepEqual(newEntries(own(places), own(now)), [], "new entries in / or the repository");
  // In the data dir's parent (/tmp), which other test files share: their mkdtemp directories
  // are theirs; anything else that looks like the daemon's is not.
  const daemonLike = (name: string) =>
    !/^forkd-[a-z0-9-]+-[A-Za-z0-9]{6}$/.test(name) &&
    (name.includes(TOKEN) || /^\.?staging|^(unpack|pull|pack)-[0-9a-z]+-|\.tmp-|escape/.test(name));
  const only = (m: Listing) => new Map([...m].filter(([dir]) => dir === shared));
  assert.deepEqual(
    newEntries(only(places), only(now), (n) => !daemonLike(n)),
    [],
    `new entries in ${shared}`,
  );
});
