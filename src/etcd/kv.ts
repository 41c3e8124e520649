/**
 * The key-value store the cluster's state lives in, as forkd uses it: etcd's data model (keys
 * with revisions, leases, transactions, watches from a revision), nothing more. `EtcdKv`
 * (./etcd-kv.ts) implements it on a real etcd cluster; unit tests use an in-memory fake that
 * passes the same contract suite (test/contract/kv.ts). Values are UTF-8 text (JSON): what a
 * caller reads back is untrusted and checked by its schema (src/cluster/records.ts).
 */

/** One key as etcd holds it. Revisions are etcd's (cluster-wide, increasing). */
export interface KvEntry {
  key: string;
  value: string;
  createRevision: number;
  modRevision: number;
  version: number;
  /** The lease the key is attached to ("0": none). */
  lease: string;
}

/** A condition of a transaction, on one key (a key that does not exist has version 0). */
export interface KvCompare {
  key: string;
  target: "version" | "create" | "mod" | "value" | "lease";
  op: "==" | "!=" | ">" | "<";
  value: number | string;
}

/** What a transaction does: put a key (optionally under a lease), or delete a key or a prefix. */
export type KvOp =
  | { type: "put"; key: string; value: string; lease?: string }
  | { type: "delete"; key: string; prefix?: boolean };

export interface KvTxnResult {
  /** Whether every compare held (and `then` ran; else `otherwise`). */
  succeeded: boolean;
  revision: number;
}

export interface KvWatchEvent {
  type: "put" | "delete";
  key: string;
  /** The new value of a put; "" for a delete. */
  value: string;
  modRevision: number;
}

export interface KvWatch {
  close(): Promise<void>;
}

/**
 * A lease: keys put under it vanish when it expires. Kept alive in the background; `onLost` runs
 * once when etcd says it is gone, or when no keepalive succeeded for its whole TTL (the holder
 * must then assume etcd has expired it: fencing).
 */
export interface KvLease {
  readonly id: string;
  readonly ttlSeconds: number;
  /** Milliseconds since the last keepalive etcd answered (since the grant at first). */
  sinceKeepalive(): number;
  onLost(fn: (why: string) => void): void;
  /** Ends the lease now (its keys are deleted); bounded, never throws. */
  revoke(): Promise<void>;
}

export interface Kv {
  get(key: string): Promise<KvEntry | null>;
  /** Every key under `prefix` (in key order, at most `limit`), and the revision read at. */
  list(prefix: string, limit?: number): Promise<{ entries: KvEntry[]; revision: number }>;
  count(prefix: string): Promise<number>;
  /** Puts `key`; returns the revision it was written at. */
  put(key: string, value: string, lease?: string): Promise<number>;
  delete(key: string): Promise<void>;
  txn(compares: KvCompare[], then: KvOp[], otherwise?: KvOp[]): Promise<KvTxnResult>;
  /**
   * Watches `prefix` from `fromRevision` (inclusive). Events arrive in revision order; a watch
   * the store cannot continue (its history compacted, the connection lost past retry) calls
   * `onError` once and stops: the caller lists again and watches from there.
   */
  watch(
    prefix: string,
    fromRevision: number,
    onEvent: (e: KvWatchEvent) => void,
    onError: (e: Error) => void,
  ): Promise<KvWatch>;
  grantLease(ttlSeconds: number): Promise<KvLease>;
  close(): Promise<void>;
}
