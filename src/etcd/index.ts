/**
 * What etcd offers: the key-value store the cluster's state lives in (the Kv interface and its
 * implementation on etcd, through npm etcd3), its endpoints from FORKD_CLUSTER, and a prefix
 * mirrored in memory (list, then watch).
 */
export { parseEndpoints } from "./endpoints.js";
export type { EtcdEndpoints } from "./endpoints.js";
export { EtcdKv } from "./etcd-kv.js";
export type { EtcdKvOptions } from "./etcd-kv.js";
export type { Kv, KvCompare, KvEntry, KvLease, KvOp, KvTxnResult, KvWatch, KvWatchEvent } from "./kv.js";
export { PrefixMirror } from "./mirror.js";
export type { MirrorChange, MirrorOptions } from "./mirror.js";
