/**
 * What a local cluster tells its user: the gateways' URLs, the admin token, every node and etcd
 * member, and the environment that points forkd's CLI and SDKs (FORKD_URL, FORKD_TOKEN) and E2B's
 * SDKs (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY: as `forkd e2b env` prints for one daemon) at
 * it: the first gateway, or node n1 when there is none.
 */
import type { ClusterState } from "./state.js";
import { memberNetns } from "./layout.js";

export interface ClusterInfo {
  id: string;
  dir: string;
  subnet: string;
  token: string;
  etcd: Array<{ name: string; clientUrl: string }>;
  nodes: Array<{ id: string; url: string; e2bUrl: string; netns: string; dataDir: string; cacheDir: string }>;
  gateways: Array<{ name: string; url: string; e2bUrl: string }>;
  /** FORKD_URL, FORKD_TOKEN, E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY. */
  env: Record<string, string>;
  /** How long `up` took (ms), when it was just brought up. */
  upMs?: number;
}

export function clientEnv(st: ClusterState): Record<string, string> {
  const front = st.gateways[0] ?? (st.nodes[0] ? { url: st.nodes[0].url, e2bUrl: st.nodes[0].e2bUrl } : null);
  if (!front) return {};
  return {
    FORKD_URL: front.url,
    FORKD_TOKEN: st.token,
    E2B_API_URL: front.e2bUrl,
    E2B_SANDBOX_URL: front.e2bUrl,
    E2B_API_KEY: st.token,
  };
}

export function describe(st: ClusterState, upMs?: number): ClusterInfo {
  return {
    id: st.id,
    dir: st.dir,
    subnet: `10.240.${st.k}.0/24`,
    token: st.token,
    etcd: st.etcd.map((e) => ({ name: e.name, clientUrl: e.clientUrl })),
    nodes: st.nodes.map((n) => ({
      id: n.id,
      url: n.url,
      e2bUrl: n.e2bUrl,
      netns: memberNetns(st.id, n.id),
      dataDir: n.dataDir,
      cacheDir: n.cacheDir,
    })),
    gateways: st.gateways.map((g) => ({ ...g })),
    env: clientEnv(st),
    ...(upMs !== undefined ? { upMs } : {}),
  };
}

/** A value as one shell word. */
const quote = (v: string): string =>
  /^[A-Za-z0-9_./:@%+=,-]+$/.test(v) ? v : `'${v.replace(/'/g, `'\\''`)}'`;

/** `export K=V` lines for a shell's eval. */
export const exportLines = (env: Record<string, string>): string[] =>
  Object.entries(env).map(([k, v]) => `export ${k}=${quote(v)}`);
