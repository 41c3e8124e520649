/**
 * The local cluster's network, made and removed with iproute2 and nft (each call bounded): a hub
 * namespace with a bridge, a link from the root namespace onto it (10.240.K.1), one namespace
 * per etcd member and node with a link onto the bridge and an address of the /24, and a root
 * nft table that masquerades the cluster's own traffic leaving the host (a node pulls images, a
 * networked sandbox reaches out, as on a host of its own). Every name comes from ./layout.ts;
 * each thing is recorded in the state before it is made (./state.ts).
 */
import { readdir, readFile, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import { ForkdError, run } from "../util/index.js";
import type { RunResult } from "../util/index.js";
import {
  HUB_BRIDGE,
  HUB_UPLINK,
  MEMBER_IF,
  hubNetns,
  memberNetns,
  natTable,
  rootAddr,
  rootLink,
  subnetOf,
} from "./layout.js";
import { recordMade } from "./state.js";
import type { ClusterState, Made } from "./state.js";

const T = 15_000;
export const NETNS_DIR = "/run/netns";
/** Where forkd daemons record whose network instance each id is (src/net/owners.ts). */
const NET_OWNERS_DIR = "/run/forkd/net";

const ip = (args: string[]): Promise<RunResult> => run("ip", args, { timeoutMs: T });
const nft = (script: string): Promise<RunResult> => run("nft", ["-f", "-"], { timeoutMs: T, input: script });

/** Runs `cmd` in network namespace `netns` (nsenter: no mount namespace needed). */
export const inNetns = (netns: string, cmd: string, args: string[], input?: string): Promise<RunResult> =>
  run("nsenter", [`--net=${NETNS_DIR}/${netns}`, "--", cmd, ...args], { timeoutMs: T, input });

export async function listNetns(): Promise<string[]> {
  return readdir(NETNS_DIR).catch(() => [] as string[]);
}

export async function listRootLinks(): Promise<string[]> {
  return readdir("/sys/class/net").catch(() => [] as string[]);
}

/** 10.240.<k>.0/24 with `k` overlapping no route or address of the root namespace (from `want` on). */
export async function freeSubnet(want?: number): Promise<number> {
  const { stdout } = await ip(["-4", "-o", "route", "show", "table", "all"]);
  const addrs = await ip(["-4", "-o", "addr", "show"]);
  const used = new Set<number>();
  const take = (text: string) => {
    for (const m of text.matchAll(/\b10\.240\.(\d+)\.\d+(?:\/(\d+))?/g)) {
      const prefix = m[2] === undefined ? 32 : Number(m[2]);
      // A /16 or shorter route covering 10.240/16 is someone's whole range: no /24 of it is free.
      if (prefix <= 16)
        throw new ForkdError("conflict", `a route covers 10.240.0.0/16 (${m[0]}): pass a subnet`);
      used.add(Number(m[1]));
    }
  };
  take(stdout);
  take(addrs.stdout);
  if (want !== undefined) {
    if (used.has(want)) throw new ForkdError("conflict", `${subnetOf(want)} is in use on this host`);
    return want;
  }
  const start = 1 + ((randomBytes(1)[0] ?? 0) % 254);
  for (let j = 0; j < 254; j++) {
    const k = 1 + ((start - 1 + j) % 254);
    if (!used.has(k)) return k;
  }
  throw new ForkdError("conflict", "no free /24 in 10.240.0.0/16");
}

/** `n` forkd network instance ids (FORKD_NET_ID) no daemon of this host uses. */
export async function freeNetIds(n: number): Promise<string[]> {
  const taken = new Set(await readdir(NET_OWNERS_DIR).catch(() => [] as string[]));
  for (const ns of await listNetns()) {
    const m = /^forkd-([0-9a-f]{4})-/.exec(ns);
    if (m?.[1]) taken.add(m[1]);
  }
  for (const l of await listRootLinks()) {
    const m = /^fk([0-9a-f]{4})h/.exec(l);
    if (m?.[1]) taken.add(m[1]);
  }
  const out: string[] = [];
  while (out.length < n) {
    const id = randomBytes(2).toString("hex");
    if (!taken.has(id)) {
      taken.add(id);
      out.push(id);
    }
  }
  return out;
}

/** The hub namespace, its bridge, and the root link onto it. */
export async function makeHub(st: ClusterState): Promise<void> {
  const hub = hubNetns(st.id);
  await recordMade(st, { kind: "netns", name: hub });
  await ip(["netns", "add", hub]);
  await ip(["-n", hub, "link", "set", "lo", "up"]);
  await ip(["-n", hub, "link", "add", HUB_BRIDGE, "type", "bridge"]);
  await ip(["-n", hub, "link", "set", HUB_BRIDGE, "up"]);
  const link = rootLink(st.id);
  await recordMade(st, { kind: "link", name: link });
  await ip(["link", "add", link, "type", "veth", "peer", "name", HUB_UPLINK, "netns", hub]);
  await ip(["addr", "add", `${rootAddr(st.k)}/24`, "dev", link]);
  await ip(["link", "set", link, "up"]);
  await ip(["-n", hub, "link", "set", HUB_UPLINK, "master", HUB_BRIDGE, "up"]);
}

/** A member's namespace (`member`: e1.., n1..) on the hub with address `addr`. */
export async function makeMember(st: ClusterState, member: string, addr: string): Promise<string> {
  const ns = memberNetns(st.id, member);
  const hub = hubNetns(st.id);
  await recordMade(st, { kind: "netns", name: ns });
  await ip(["netns", "add", ns]);
  await ip(["-n", hub, "link", "add", member, "type", "veth", "peer", "name", MEMBER_IF, "netns", ns]);
  await ip(["-n", hub, "link", "set", member, "master", HUB_BRIDGE, "up"]);
  await ip(["-n", ns, "link", "set", "lo", "up"]);
  await ip(["-n", ns, "addr", "add", `${addr}/24`, "dev", MEMBER_IF]);
  await ip(["-n", ns, "link", "set", MEMBER_IF, "up"]);
  await ip(["-n", ns, "route", "add", "default", "via", rootAddr(st.k)]);
  return ns;
}

/**
 * The root table that masquerades what the cluster sends past the host, and IPv4 forwarding on
 * (forkd's daemons turn it on as well: their slots route through the host).
 */
export async function makeNat(st: ClusterState): Promise<void> {
  const table = natTable(st.id);
  await recordMade(st, { kind: "nft", family: "ip", name: table });
  const net = subnetOf(st.k);
  await nft(
    `table ip ${table} {\n` +
      `  chain post {\n    type nat hook postrouting priority srcnat; policy accept;\n` +
      `    ip saddr ${net} ip daddr != ${net} oifname != "${rootLink(st.id)}" masquerade\n  }\n}\n`,
  );
  const fwd = "/proc/sys/net/ipv4/ip_forward";
  if ((await readFile(fwd, "utf8")).trim() !== "1") await writeFile(fwd, "1\n");
}

/** Removes one thing `up` made (nothing there already is fine). */
export async function unmake(m: Made): Promise<void> {
  switch (m.kind) {
    case "netns":
      if ((await listNetns()).includes(m.name)) await ip(["netns", "del", m.name]);
      return;
    case "link":
      if ((await listRootLinks()).includes(m.name)) await ip(["link", "del", m.name]);
      return;
    case "nft":
      await nft(`add table ${m.family} ${m.name}\ndelete table ${m.family} ${m.name}\n`);
      return;
    case "netid":
      for (const ns of await listNetns())
        if (ns.startsWith(`forkd-${m.id}-`)) await ip(["netns", "del", ns]).catch(() => undefined);
      await rm(join(NET_OWNERS_DIR, m.id), { force: true });
      return;
  }
}

/** What of `made` is still in the kernel, by name ("netns …", "link …", "table …"). */
export async function stillMade(made: Made[]): Promise<string[]> {
  const netns = await listNetns();
  const links = await listRootLinks();
  const tables = (await run("nft", ["list", "tables"], { timeoutMs: T }).catch(() => ({ stdout: "" })))
    .stdout;
  const out: string[] = [];
  for (const m of made) {
    if (m.kind === "netns" && netns.includes(m.name)) out.push(`netns ${m.name}`);
    if (m.kind === "link" && links.includes(m.name)) out.push(`link ${m.name}`);
    if (m.kind === "nft" && new RegExp(`^table ${m.family} ${m.name}$`, "m").test(tables))
      out.push(`table ${m.family} ${m.name}`);
    if (m.kind === "netid")
      for (const ns of netns) if (ns.startsWith(`forkd-${m.id}-`)) out.push(`netns ${ns}`);
  }
  return out;
}
