/**
 * etcd's own counters (its /metrics, Prometheus text; etcd 3.4) for the scale benchmark: what
 * the cluster wrote (puts, deletes, write transactions, raft proposals committed, bytes of
 * values put, bytes appended to the WAL) and what crossed its client port (bytes received from
 * clients: the writes and reads; bytes sent: replies and every watch event fanned out to each
 * watcher). Writes are counted on one member (every member applies each); client bytes summed
 * over the members (each counts its own clients).
 */
import { request } from "./cluster-http.js";

export const ETCD_COUNTERS = {
  puts: "etcd_debugging_mvcc_put_total",
  deletes: "etcd_debugging_mvcc_delete_total",
  txns: "etcd_debugging_mvcc_txn_total",
  putBytes: "etcd_debugging_mvcc_total_put_size_in_bytes",
  proposals: "etcd_server_proposals_committed_total",
  walBytes: "etcd_disk_wal_write_bytes_total",
  fsyncs: "etcd_disk_wal_fsync_duration_seconds_count",
  clientRecvBytes: "etcd_network_client_grpc_received_bytes_total",
  clientSentBytes: "etcd_network_client_grpc_sent_bytes_total",
  watchers: "etcd_debugging_mvcc_watcher_total",
  keys: "etcd_debugging_mvcc_keys_total",
  dbBytes: "etcd_mvcc_db_total_size_in_bytes",
} as const;
export type EtcdCounters = Record<keyof typeof ETCD_COUNTERS, number>;
/** Gauges: their value now, not a difference. */
const GAUGES = new Set<keyof EtcdCounters>(["watchers", "keys", "dbBytes"]);
export const isGauge = (k: string): boolean => GAUGES.has(k as keyof EtcdCounters);
const SUMMED = new Set<keyof EtcdCounters>(["clientRecvBytes", "clientSentBytes", "watchers"]);

function parse(text: string): Map<string, number> {
  const m = new Map<string, number>();
  for (const line of text.split("\n")) {
    const x = /^([a-z_]+) ([0-9.e+-]+)$/.exec(line);
    if (x?.[1] && x[2]) m.set(x[1], Number(x[2]));
  }
  return m;
}

/** The counters now, over every member (see above). */
export async function etcdCounters(urls: readonly string[]): Promise<EtcdCounters> {
  const all = await Promise.all(
    urls.map(async (u) => {
      const r = await request<string>(u, "GET", "/metrics", { timeoutMs: 10_000 });
      return parse(typeof r.body === "string" ? r.body : "");
    }),
  );
  const out = {} as EtcdCounters;
  for (const [k, name] of Object.entries(ETCD_COUNTERS) as [keyof EtcdCounters, string][]) {
    const vals = all.map((m) => m.get(name) ?? 0);
    out[k] = SUMMED.has(k) ? vals.reduce((a, b) => a + b, 0) : (vals[0] ?? 0);
  }
  return out;
}

/** b − a for the counters, b's value for the gauges. */
export function countersSince(a: EtcdCounters, b: EtcdCounters): EtcdCounters {
  const out = {} as EtcdCounters;
  for (const k of Object.keys(ETCD_COUNTERS) as (keyof EtcdCounters)[])
    out[k] = GAUGES.has(k) ? b[k] : b[k] - a[k];
  return out;
}
