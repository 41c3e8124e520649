/**
 * A local cluster's record, `<dir>/cluster.json` (0600, written atomically): what it is (its id,
 * /24, admin token, members, nodes, gateways) and everything `up` made in the kernel and every
 * process it started, each written down *before* it is made or started (a process: its spec
 * before, its pid right after), so that `down` removes exactly what `up` made, even after `up`
 * died midway. Read back through a schema: the file is checked, not trusted.
 */
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { z } from "zod";
import { ForkdError, errorMessage, writeJsonAtomic } from "../util/index.js";
import { CLUSTER_ID_RE } from "./layout.js";

export const STATE_FILE = "cluster.json";
const NAME = z.string().regex(/^[A-Za-z0-9_.-]{1,40}$/);

/** Something `up` made in the kernel (`down` removes it). */
export const Made = z.discriminatedUnion("kind", [
  /** A network namespace (/run/netns/<name>). */
  z.object({ kind: z.literal("netns"), name: NAME }),
  /** A link of the root namespace. */
  z.object({ kind: z.literal("link"), name: NAME }),
  /** An nft table of the root namespace. */
  z.object({ kind: z.literal("nft"), family: z.enum(["ip", "inet"]), name: NAME }),
  /**
   * A node's forkd network instance (FORKD_NET_ID): its slot namespaces forkd-<id>-* and its
   * owner marker /run/forkd/net/<id> (src/net/owners.ts); the rest of it is in the node's namespace.
   */
  z.object({ kind: z.literal("netid"), id: z.string().regex(/^[0-9a-f]{4}$/) }),
]);
export type Made = z.infer<typeof Made>;

export const Role = z.enum(["etcd", "node", "gateway"]);
export type Role = z.infer<typeof Role>;

/** A process of the cluster: how to start it (again), and the one started last. */
export const Proc = z.object({
  name: NAME,
  role: Role,
  /** Its network namespace (null: the root one). */
  netns: NAME.nullable(),
  /** A /sys of its namespace (a forkd node: src/localcluster/launch.ts). */
  sysfs: z.boolean(),
  argv: z.array(z.string()).min(1),
  env: z.record(z.string(), z.string()),
  log: z.string().min(1),
  /** GET this URL answers 200 once it serves (with the admin token when `auth`). */
  probe: z.string().url(),
  auth: z.boolean(),
  pid: z.number().int().positive().nullable(),
  /** Its start time (/proc/PID/stat field 22): a pid alone may have been reused. */
  start: z.number().int().nonnegative().nullable(),
});
export type Proc = z.infer<typeof Proc>;

export const ClusterState = z.object({
  format: z.literal(1),
  id: z.string().regex(CLUSTER_ID_RE),
  dir: z.string().min(1),
  /** The /24 is 10.240.<k>.0. */
  k: z.number().int().min(1).max(254),
  created: z.string(),
  phase: z.enum(["starting", "up", "failed"]),
  /** The admin token (FORKD_TOKEN) of every node and gateway; also an E2B API key (`e2b_` + hex). */
  token: z.string().min(32),
  secretFile: z.string().min(1),
  etcd: z.array(z.object({ name: NAME, addr: z.string(), clientUrl: z.string(), dataDir: z.string() })),
  nodes: z.array(
    z.object({
      id: NAME,
      addr: z.string(),
      url: z.string(),
      e2bUrl: z.string(),
      dataDir: z.string(),
      cacheDir: z.string(),
      netId: z.string().regex(/^[0-9a-f]{4}$/),
    }),
  ),
  gateways: z.array(z.object({ name: NAME, url: z.string(), e2bUrl: z.string() })),
  made: z.array(Made),
  procs: z.array(Proc),
});
export type ClusterState = z.infer<typeof ClusterState>;

export const statePath = (dir: string): string => join(dir, STATE_FILE);

/** The record in `dir`, or null when there is none. */
export async function readState(dir: string): Promise<ClusterState | null> {
  let text: string;
  try {
    text = await readFile(statePath(dir), "utf8");
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw e;
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new ForkdError("internal", `${statePath(dir)} is not JSON: ${errorMessage(e)}`);
  }
  const parsed = ClusterState.safeParse(json);
  if (!parsed.success)
    throw new ForkdError(
      "internal",
      `${statePath(dir)} is not a local cluster's record: ${parsed.error.message}`,
    );
  return parsed.data;
}

export async function writeState(st: ClusterState): Promise<void> {
  await writeJsonAtomic(statePath(st.dir), st, 0o600);
}

/** Records `m` (written before it is made). */
export async function recordMade(st: ClusterState, m: Made): Promise<void> {
  st.made.push(m);
  await writeState(st);
}

export function procOf(st: ClusterState, name: string): Proc {
  const p = st.procs.find((x) => x.name === name);
  if (!p) throw new ForkdError("not_found", `the cluster has no process ${JSON.stringify(name)}`);
  return p;
}
