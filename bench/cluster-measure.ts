/**
 * The scale benchmark's measures over a running cluster (bench/cluster-scale.ts): creates
 * through a gateway until a count is reached (one child per request at a concurrency, or
 * `fork -n` batches); one cheap call through the gateway against the same call to the node
 * direct, interleaved; how long after a node's process is killed the gateway lists all its
 * sandboxes `lost`.
 */
import { request } from "./cluster-http.js";
import type { Reply } from "./cluster-http.js";
import { pct } from "./stats.js";

interface Child {
  id: string;
  node: string | null;
}
interface ForkReply {
  sandboxes?: Child[];
  failures?: { index: number; code: string; message: string }[];
  error?: { code: string; message: string };
}

export interface CreateRun {
  /** Children asked for and started. */
  asked: number;
  created: number;
  failed: number;
  /** The first few failures' messages. */
  failures: string[];
  wallMs: number;
  perSecond: number;
  /** Each request's time (ms). */
  requestMs: number[];
}

/**
 * Creates `total` children of `tag` through `base`: requests of `batch` children, `concurrency`
 * at once. Each started child is given to `seen`.
 */
export async function createMany(
  base: string,
  token: string,
  tag: string,
  total: number,
  o: { batch: number; concurrency: number; seen: (c: Child) => void },
): Promise<CreateRun> {
  let left = total;
  let created = 0;
  let failed = 0;
  const failures: string[] = [];
  const requestMs: number[] = [];
  const note = (m: string) => {
    if (failures.length < 5) failures.push(m);
  };
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: o.concurrency }, async () => {
      while (left > 0) {
        const n = Math.min(o.batch, left);
        left -= n;
        try {
          const r = await request<ForkReply>(base, "POST", "/v1/sandboxes", {
            token,
            body: o.batch === 1 ? { snapshot_tag: tag } : { snapshot_tag: tag, n },
            timeoutMs: 120_000,
          });
          requestMs.push(r.ms);
          const kids = r.status === 201 ? (r.body.sandboxes ?? (o.batch === 1 ? [r.body as Child] : [])) : [];
          for (const c of kids) o.seen(c);
          created += kids.length;
          failed += n - kids.length;
          if (kids.length < n)
            note(r.body.failures?.[0]?.message ?? r.body.error?.message ?? `status ${r.status}`);
        } catch (e) {
          failed += n;
          note(e instanceof Error ? e.message : String(e));
        }
      }
    }),
  );
  const wallMs = performance.now() - t0;
  return { asked: total, created, failed, failures, wallMs, perSecond: created / (wallMs / 1000), requestMs };
}

export interface LatencyPair {
  call: string;
  samples: number;
  gateway: { p50: number; p99: number };
  direct: { p50: number; p99: number };
  /** gateway − direct, at p50 and at p99 (ms). */
  added: { p50: number; p99: number };
}

const pick = (xs: number[]) => ({ p50: pct(xs, 50), p99: pct(xs, 99) });

/**
 * `samples` of one call through the gateway and to `node` direct, interleaved one for one (so
 * both see the same load), sequential; `paths` cycles over sandboxes of that node.
 */
export async function latencyPair(
  call: string,
  gateway: string,
  node: string,
  token: string,
  paths: readonly string[],
  samples: number,
  method = "GET",
  body?: unknown,
): Promise<LatencyPair> {
  const g: number[] = [];
  const d: number[] = [];
  // Warm both connections first.
  for (const base of [gateway, node]) await request(base, method, paths[0] ?? "/", { token, body });
  for (let i = 0; i < samples; i++) {
    const path = paths[i % paths.length] ?? "/";
    const order: [string, number[]][] =
      i % 2
        ? [
            [gateway, g],
            [node, d],
          ]
        : [
            [node, d],
            [gateway, g],
          ];
    for (const [base, into] of order) {
      const r = await request(base, method, path, { token, body });
      if (r.status >= 300) throw new Error(`${call} ${base}${path}: status ${r.status}`);
      into.push(r.ms);
    }
  }
  const gs = pick(g);
  const ds = pick(d);
  return { call, samples, gateway: gs, direct: ds, added: { p50: gs.p50 - ds.p50, p99: gs.p99 - ds.p99 } };
}

export interface LostRun {
  node: string;
  sandboxes: number;
  /** From the kill until the node's record left the gateway's view (GET /v1/nodes), ms. */
  nodeGoneMs: number | null;
  /** From the kill until the gateway listed the first and the last of them lost, ms. */
  firstLostMs: number | null;
  allLostMs: number | null;
}

/**
 * Kills (`kill`: SIGKILL of the node's process) and polls the gateway every `everyMs` until
 * every one of `ids` (the node's sandboxes) is listed `lost`, or `boundMs` passed.
 */
export async function timeToLost(
  gateway: string,
  token: string,
  node: string,
  ids: ReadonlySet<string>,
  kill: () => Promise<void>,
  o: { everyMs: number; boundMs: number },
): Promise<LostRun> {
  const t0 = performance.now();
  await kill();
  let nodeGoneMs: number | null = null;
  let firstLostMs: number | null = null;
  for (;;) {
    const at = performance.now() - t0;
    if (at > o.boundMs) return { node, sandboxes: ids.size, nodeGoneMs, firstLostMs, allLostMs: null };
    if (nodeGoneMs === null) {
      const r = await request<{ nodes?: { id: string }[] }>(gateway, "GET", "/v1/nodes", { token });
      if (r.status === 200 && !r.body.nodes?.some((n) => n.id === node)) nodeGoneMs = performance.now() - t0;
    }
    let lost = 0;
    for (let next: string | null = null, first = true; first || next; first = false) {
      const q: string = `/v1/sandboxes?state=lost&limit=1000${next ? `&next_token=${next}` : ""}`;
      const r: Reply<{ sandboxes?: Child[]; next_token?: string | null }> = await request(gateway, "GET", q, {
        token,
      });
      lost += (r.body.sandboxes ?? []).filter((s: Child) => s.node === node && ids.has(s.id)).length;
      next = r.body.next_token ?? null;
    }
    const now = performance.now() - t0;
    if (lost > 0 && firstLostMs === null) firstLostMs = now;
    if (lost >= ids.size) return { node, sandboxes: ids.size, nodeGoneMs, firstLostMs, allLostMs: now };
    await new Promise((r) => setTimeout(r, o.everyMs));
  }
}
