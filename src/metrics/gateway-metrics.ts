/**
 * A cluster gateway's own Prometheus metrics (its GET /metrics; each node serves its own): the
 * placement rate and spread (children placed, per node; forks fanned out), the latency a
 * relayed call adds (until the node's reply headers, by kind of route), per-node call failures,
 * sandboxes the janitor marked lost, and gauges of the cluster as the gateway sees it (nodes,
 * sandboxes by state, whether its view of etcd is live).
 */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client";

export interface GatewayMetricsSources {
  version: string;
  /** Nodes in the cluster now (draining ones included). */
  nodes(): number;
  /** Sandbox records by state. */
  sandboxStates(): Record<string, number>;
  /** Whether every mirror follows etcd. */
  live(): boolean;
}

/** Seconds: a relayed call's headers come in milliseconds; a fan-out's in seconds to minutes. */
const LATENCY = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300];

export class GatewayMetrics {
  readonly registry = new Registry();
  private readonly placedTotal: Counter<"node">;
  private readonly forksTotal: Counter<"outcome">;
  private readonly placeSeconds: Histogram;
  private readonly proxySeconds: Histogram<"kind" | "code">;
  private readonly nodeFailures: Counter<"node" | "reason">;
  private readonly lostTotal: Counter;
  private readonly processFailures: Counter<"kind">;

  constructor(src: GatewayMetricsSources) {
    const registers = [this.registry];
    collectDefaultMetrics({ register: this.registry });
    new Gauge({
      name: "forkd_gateway_build_info",
      help: "The gateway's version (always 1)",
      labelNames: ["version"],
      registers,
    }).set({ version: src.version }, 1);
    new Gauge({
      name: "forkd_gateway_nodes",
      help: "Nodes in the cluster as the gateway sees them",
      registers,
      collect() {
        this.set(src.nodes());
      },
    });
    new Gauge({
      name: "forkd_gateway_sandboxes",
      help: "Sandbox records in etcd, by state",
      labelNames: ["state"],
      registers,
      collect() {
        const by = src.sandboxStates();
        for (const state of new Set(["running", "paused", "exited", "lost", ...Object.keys(by)]))
          this.set({ state }, by[state] ?? 0);
      },
    });
    new Gauge({
      name: "forkd_gateway_etcd_live",
      help: "1 while every mirror of etcd the gateway keeps follows it",
      registers,
      collect() {
        this.set(src.live() ? 1 : 0);
      },
    });
    this.placedTotal = new Counter({
      name: "forkd_gateway_placed_total",
      help: "Children placed on nodes (rate: the placement rate), by node",
      labelNames: ["node"],
      registers,
    });
    this.forksTotal = new Counter({
      name: "forkd_gateway_forks_total",
      help: "Forks through the gateway, by outcome (ok: every child, partial, failed)",
      labelNames: ["outcome"],
      registers,
    });
    this.placeSeconds = new Histogram({
      name: "forkd_gateway_fork_seconds",
      help: "A fork through the gateway, from its request to its merged answer",
      buckets: LATENCY,
      registers,
    });
    this.proxySeconds = new Histogram({
      name: "forkd_gateway_proxy_seconds",
      help: "A relayed call, from its request to the node's reply headers, by kind of route and status",
      labelNames: ["kind", "code"],
      buckets: LATENCY,
      registers,
    });
    this.nodeFailures = new Counter({
      name: "forkd_gateway_node_failures_total",
      help: "Calls to a node that got no answer, by node and reason",
      labelNames: ["node", "reason"],
      registers,
    });
    this.lostTotal = new Counter({
      name: "forkd_gateway_sandboxes_marked_lost_total",
      help: "Sandbox records this gateway marked lost (its node left the cluster)",
      registers,
    });
    this.processFailures = new Counter({
      name: "forkd_gateway_process_failures_total",
      help: "Failures no code handled, by kind",
      labelNames: ["kind"],
      registers,
    });
  }

  placed(node: string, n: number): void {
    this.placedTotal.inc({ node }, n);
  }

  fork(outcome: "ok" | "partial" | "failed", seconds: number): void {
    this.forksTotal.inc({ outcome });
    this.placeSeconds.observe(seconds);
  }

  proxied(kind: string, code: number, seconds: number): void {
    this.proxySeconds.observe({ kind, code: String(code) }, seconds);
  }

  nodeFailure(node: string, reason: string): void {
    this.nodeFailures.inc({ node, reason });
  }

  markedLost(): void {
    this.lostTotal.inc();
  }

  processFailure(kind: string): void {
    this.processFailures.inc({ kind });
  }

  async render(): Promise<{ text: string; contentType: string }> {
    return { text: await this.registry.metrics(), contentType: this.registry.contentType };
  }
}
