/**
 * Where the cluster's etcd is: `FORKD_CLUSTER=etcd://H:P[,H:P...]` (plain gRPC) or
 * `etcds://H:P[,...]` (TLS, with FORKD_CLUSTER_CA), parsed strictly before anything connects.
 */
import { ForkdError } from "../util/index.js";

export interface EtcdEndpoints {
  tls: boolean;
  /** host:port of each member, as given (IPv6 hosts in brackets). */
  hosts: string[];
}

const HOST_PORT = /^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]{1,253}):([0-9]{1,5})$/;

export function parseEndpoints(text: string): EtcdEndpoints {
  const m = /^(etcd|etcds):\/\/(.+)$/.exec(text.trim());
  if (!m) {
    throw new ForkdError("invalid_argument", "FORKD_CLUSTER must be etcd://host:port[,host:port...]", {
      field: "FORKD_CLUSTER",
    });
  }
  const hosts = (m[2] ?? "").split(",").map((h) => h.trim().replace(/\/$/, ""));
  if (hosts.length === 0 || hosts.length > 16) {
    throw new ForkdError("invalid_argument", "FORKD_CLUSTER names 1 to 16 etcd members", {
      field: "FORKD_CLUSTER",
    });
  }
  for (const h of hosts) {
    const hp = HOST_PORT.exec(h);
    const port = Number(hp?.[2]);
    if (!hp || port < 1 || port > 65535) {
      throw new ForkdError("invalid_argument", `FORKD_CLUSTER: not a host:port: ${JSON.stringify(h)}`, {
        field: "FORKD_CLUSTER",
      });
    }
  }
  return { tls: m[1] === "etcds", hosts };
}
