/**
 * A cluster of fake nodes (./fake-node.ts) and a gateway (./gateway.ts) over one fake etcd, for
 * the gateway's unit tests: nodes n1..nN (the snapshot `app` held on n1 and in the catalog,
 * `alice/own` alice's), the tests' tokens, quick bounds. close() stops everything.
 */
import { randomBytes } from "node:crypto";
import type { Caller } from "../../src/access/caller.js";
import { ClusterKeys } from "../../src/cluster/keys.js";
import type { GatewayBounds } from "../../src/gateway/context.js";
import { FakeKv } from "../fakes/kv.js";
import { FakeNode, catalogEntry } from "./fake-node.js";
import type { FakeNodeOptions } from "./fake-node.js";
import { TOKENS, startTestGateway } from "./gateway.js";
import type { TestGateway } from "./gateway.js";

export interface FakeCluster {
  kv: FakeKv;
  keys: ClusterKeys;
  nodes: FakeNode[];
  gw: TestGateway;
  tokens: ReadonlyMap<string, Caller>;
  /** Another gateway over the same etcd. */
  another(): Promise<TestGateway>;
  close(): Promise<void>;
}

export async function fakeCluster(
  o: {
    nodes?: number;
    node?: Partial<FakeNodeOptions>;
    bounds?: Partial<GatewayBounds>;
    consoleDist?: string | null;
  } = {},
): Promise<FakeCluster> {
  const kv = new FakeKv();
  const keys = new ClusterKeys("/c/");
  const nodes: FakeNode[] = [];
  for (let i = 1; i <= (o.nodes ?? 3); i++)
    nodes.push(
      await FakeNode.start({
        id: `n${i}`,
        kv,
        keys,
        tokens: TOKENS,
        holds: i === 1 ? { app: 1, "alice/own": 0 } : {},
        onKill: async (lease) => kv.expireLease(lease),
        ...o.node,
      }),
    );
  await kv.put(keys.catalogEntry("app"), JSON.stringify(catalogEntry("app", "n1")));
  await kv.put(keys.catalogEntry("alice/own"), JSON.stringify(catalogEntry("alice/own", "n1", "alice")));
  const gateways: TestGateway[] = [];
  // One cluster secret: any of its gateways opens another's console sessions.
  const secret = randomBytes(32);
  const start = async () => {
    const g = await startTestGateway({
      kv,
      keys,
      tokens: TOKENS,
      secret,
      bounds: o.bounds ?? {},
      consoleDist: o.consoleDist ?? null,
    });
    gateways.push(g);
    return g;
  };
  const gw = await start();
  return {
    kv,
    keys,
    nodes,
    gw,
    tokens: TOKENS,
    another: start,
    async close() {
      for (const g of gateways) await g.close();
      for (const n of nodes) await n.stop().catch(() => undefined);
    },
  };
}

/** Resolves once `ok()` holds (polled), or fails after `ms`. */
export async function until(
  ok: () => boolean | Promise<boolean>,
  ms = 5000,
  what = "a condition",
): Promise<void> {
  const end = Date.now() + ms;
  while (!(await ok())) {
    if (Date.now() > end) throw new Error(`${what} did not come within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 10));
  }
}
