/**
 * Sandboxes as E2B's control plane shows them (its openapi's Sandbox, ListedSandbox and
 * SandboxDetail), from forkd's records: templateID is the snapshot tag, startedAt the creation,
 * endAt its deadline (else its lifetime's end, else when its idle timeout would end it, else a
 * day from now: a forkd sandbox with neither has no end), envdAccessToken its derived token for
 * the caller's API key (src/e2b/access-token.ts: revoking the key revokes it).
 */
import type { Caller } from "../../access/index.js";
import type { E2bServices } from "../context.js";
import { tagNames } from "../../app/index.js";
import type { TagNames } from "../../app/index.js";
import { endsAt, expiresAt } from "../../sandbox/index.js";
import type { ReadonlySandbox } from "../../sandbox/index.js";
import type { E2bContext } from "../context.js";
import { ENVD_VERSION } from "../envd-version.js";

/** E2B's deprecated `clientID`: one value for every sandbox of this daemon. */
export const CLIENT_ID = "forkd";

export interface E2bSandbox {
  templateID: string;
  sandboxID: string;
  alias: string;
  clientID: string;
  envdVersion: string;
  envdAccessToken?: string;
  domain: string | null;
  /**
   * The access token again: E2B's code interpreter SDKs send it (E2B-Traffic-Access-Token) on
   * their /contexts calls, which carry no X-Access-Token (src/e2b/auth.ts).
   */
  trafficAccessToken: string | null;
}

export interface E2bListedSandbox {
  templateID: string;
  alias: string;
  sandboxID: string;
  clientID: string;
  startedAt: string;
  endAt: string;
  cpuCount: number;
  memoryMB: number;
  diskSizeMB: number;
  metadata: Record<string, string>;
  state: "running" | "paused";
  envdVersion: string;
  volumeMounts: never[];
}

export interface E2bSandboxDetail extends E2bListedSandbox {
  envdAccessToken?: string;
  domain: string | null;
  allowInternetAccess: boolean | null;
  network?: { allowOut?: string[]; denyOut?: string[] };
  lifecycle: { autoResume: boolean; onTimeout: "kill" | "pause" };
}

const DAY_MS = 24 * 3600_000;

/**
 * The access token of a sandbox for this caller's key (all but `secure: false` sandboxes show one
 * in replies; a caller without a credential, which E2B's API never has, gets none).
 */
const tokenOf = (e: E2bContext, sb: ReadonlySandbox, caller: Caller): string | undefined =>
  sb.record.e2b?.secure === false
    ? undefined
    : (e.accessTokens.of(sb.record.id, caller.credential) ?? undefined);

/** How the caller is shown its sandbox's snapshot (its tag: src/app/scope.ts tagNames), and its access token. */
export function sandboxReply(e: E2bContext, sb: ReadonlySandbox, caller: Caller): E2bSandbox {
  const names = tagNames(caller);
  const token = tokenOf(e, sb, caller);
  return {
    templateID: names(sb.record.tag),
    sandboxID: sb.record.id,
    alias: names(sb.record.tag),
    clientID: CLIENT_ID,
    envdVersion: ENVD_VERSION,
    ...(token !== undefined ? { envdAccessToken: token } : {}),
    domain: e.domain,
    trafficAccessToken: token ?? null,
  };
}

/** When E2B would say it ends (see the header). */
export function endAtOf(sb: ReadonlySandbox): number {
  const d = sb.record.deadline ?? null;
  if (d !== null) return Date.parse(d);
  return endsAt(sb) ?? expiresAt(sb) ?? Date.now() + DAY_MS;
}

/** Its machine: the paused image's, else its snapshot's (read once per listing). */
async function machineOf(
  s: E2bServices,
  sb: ReadonlySandbox,
  cache: Map<string, Promise<{ cpus: number; memoryMiB: number; diskMiB: number }>>,
): Promise<{ cpus: number; memoryMiB: number; diskMiB: number }> {
  const tag = sb.record.tag;
  let p = cache.get(tag);
  if (!p) {
    p = s.store.get(tag).then(
      (snap) => ({
        cpus: snap.meta.machine.vcpus,
        memoryMiB: snap.meta.machine.memoryMiB,
        diskMiB: Math.round(snap.meta.diskSize / 2 ** 20),
      }),
      () => ({ cpus: 1, memoryMiB: 0, diskMiB: 0 }),
    );
    cache.set(tag, p);
  }
  const m = await p;
  const paused = sb.record.paused?.machine;
  return paused ? { ...m, cpus: paused.vcpus, memoryMiB: paused.memoryMiB } : m;
}

export type MachineCache = Map<string, Promise<{ cpus: number; memoryMiB: number; diskMiB: number }>>;

export async function listedView(
  s: E2bServices,
  sb: ReadonlySandbox,
  names: TagNames,
  cache: MachineCache = new Map(),
): Promise<E2bListedSandbox> {
  const m = await machineOf(s, sb, cache);
  return {
    templateID: names(sb.record.tag),
    alias: names(sb.record.tag),
    sandboxID: sb.record.id,
    clientID: CLIENT_ID,
    startedAt: sb.record.created,
    endAt: new Date(endAtOf(sb)).toISOString(),
    cpuCount: m.cpus,
    memoryMB: m.memoryMiB,
    diskSizeMB: sb.record.limits?.diskMiB ?? m.diskMiB,
    metadata: sb.record.metadata ?? {},
    state: sb.state === "paused" ? "paused" : "running",
    envdVersion: ENVD_VERSION,
    volumeMounts: [],
  };
}

export async function detailView(
  s: E2bServices,
  e: E2bContext,
  sb: ReadonlySandbox,
  caller: Caller,
): Promise<E2bSandboxDetail> {
  const token = tokenOf(e, sb, caller);
  const names = tagNames(caller);
  const x = sb.record.e2b;
  return {
    ...(await listedView(s, sb, names)),
    ...(token !== undefined ? { envdAccessToken: token } : {}),
    domain: e.domain,
    allowInternetAccess: x?.allowInternetAccess ?? null,
    ...(x?.network ? { network: x.network } : {}),
    lifecycle: { autoResume: x?.autoResume === true, onTimeout: sb.record.onDeadline ?? "kill" },
  };
}
