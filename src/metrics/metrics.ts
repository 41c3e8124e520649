/**
 * The daemon's Prometheus metrics (served at GET /metrics), on prom-client with a registry of
 * our own (no global state). Gauges of current state are read from the services at scrape time;
 * latencies and failures are recorded by the front doors' edges and the use cases of src/app as
 * they happen (see AppMetrics).
 */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client";
import type { SharingProbe } from "./memory.js";

/** The warm pool's figures beyond its size. */
export interface PoolFigures {
  hot: number;
  max: number;
  memMiB: number;
}

export interface MetricsSources {
  version: string;
  /** Sandboxes by state (running, paused, exited). */
  sandboxStates(): Record<string, number>;
  /** Snapshots by status (ready, writing, failed). */
  snapshotStatuses(): Promise<Record<string, number>>;
  /** Pre-started VMMs waiting in the pool. */
  poolSize(): number;
  /** The pool's hot members, its host-wide bound and its members' memory (absent: not reported). */
  pool?(): PoolFigures;
  sharing: SharingProbe;
  audit(): { written: number; dropped: number; failed: number };
  /** Lifecycle webhooks' deliveries since start, and events queued now (absent: not reported). */
  webhooks?: () => {
    delivered: number;
    failedAttempts: number;
    droppedOverflow: number;
    droppedAttempts: number;
    queued: number;
    webhooks: number;
  };
  /** Host tool runs on guests' and tenants' files (src/vmm/jailed-tools.ts), by tool and jail. */
  toolRuns?: () => Array<{ tool: string; jailed: boolean; runs: number }>;
}

const SANDBOX_STATES = ["running", "paused", "exited"];
const SNAPSHOT_STATUSES = ["ready", "writing", "failed"];
/** Seconds: forks and execs take milliseconds to minutes. */
const LATENCY = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300];

/** Structurally the application layer's AppMetrics (src/app/services.ts): it imports nothing from here. */
export class Metrics {
  readonly registry = new Registry();
  private readonly httpSeconds: Histogram<"route" | "method" | "code">;
  private readonly forkSeconds: Histogram;
  private readonly branchPauseSeconds: Histogram;
  private readonly execSeconds: Histogram;
  private readonly failures: Counter<"op" | "reason">;
  private readonly processFailures: Counter<"kind">;
  private readonly peerPulledBytes: Counter;
  private readonly peerPulls: Counter;
  private readonly registryFallbackPulls: Counter;

  constructor(src: MetricsSources) {
    const registers = [this.registry];
    collectDefaultMetrics({ register: this.registry });
    new Gauge({
      name: "forkd_build_info",
      help: "The daemon's version (always 1)",
      labelNames: ["version"],
      registers,
    }).set({ version: src.version }, 1);
    new Gauge({
      name: "forkd_sandboxes",
      help: "Sandboxes the daemon holds, by state",
      labelNames: ["state"],
      registers,
      collect() {
        const by = src.sandboxStates();
        for (const state of new Set([...SANDBOX_STATES, ...Object.keys(by)]))
          this.set({ state }, by[state] ?? 0);
      },
    });
    new Gauge({
      name: "forkd_snapshots",
      help: "Snapshots, by status",
      labelNames: ["status"],
      registers,
      async collect() {
        const by = await src.snapshotStatuses();
        for (const status of new Set([...SNAPSHOT_STATUSES, ...Object.keys(by)]))
          this.set({ status }, by[status] ?? 0);
      },
    });
    new Gauge({
      name: "forkd_pool_vmms",
      help: "Pre-started VMMs waiting in the warm pool",
      registers,
      collect() {
        this.set(src.poolSize());
      },
    });
    const pool = src.pool?.bind(src);
    if (pool) {
      const poolGauge = (name: string, help: string, pick: (p: PoolFigures) => number) =>
        new Gauge({
          name,
          help,
          registers,
          collect() {
            this.set(pick(pool()));
          },
        });
      poolGauge(
        "forkd_pool_hot_vmms",
        "Pool members restored, warmed and stopped ahead of forks",
        (p) => p.hot,
      );
      poolGauge("forkd_pool_max_vmms", "The host-wide bound on pool members (FORKD_POOL_MAX)", (p) => p.max);
      poolGauge("forkd_pool_memory_bytes", "Memory (PSS) of the pool members when they joined", (p) =>
        Math.round(p.memMiB * 2 ** 20),
      );
    }
    const sharing = (
      name: string,
      help: string,
      pick: (s: Awaited<ReturnType<SharingProbe["sample"]>>) => number,
    ) =>
      new Gauge({
        name,
        help,
        registers,
        async collect() {
          this.set(pick(await src.sharing.sample()));
        },
      });
    sharing(
      "forkd_memory_saved_bytes",
      "Host memory saved by sharing snapshot pages: sum(Rss) - sum(Pss) over running VMMs (sampled at most every 10 s)",
      (s) => s.savedBytes,
    );
    sharing(
      "forkd_vmm_rss_bytes",
      "Sum of Rss over running VMMs (shared pages counted in each)",
      (s) => s.rssBytes,
    );
    sharing(
      "forkd_vmm_pss_bytes",
      "Sum of Pss over running VMMs (shared pages divided among them)",
      (s) => s.pssBytes,
    );
    sharing(
      "forkd_vmm_private_bytes",
      "Sum of Private_Clean + Private_Dirty over running VMMs: what the children cost on their own",
      (s) => s.privateBytes,
    );
    new Gauge({
      name: "forkd_audit_lines",
      help: "Audit log lines since start, by outcome (written, dropped: queue full or log closed, failed: write error)",
      labelNames: ["outcome"],
      registers,
      collect() {
        const a = src.audit();
        this.set({ outcome: "written" }, a.written);
        this.set({ outcome: "dropped" }, a.dropped);
        this.set({ outcome: "failed" }, a.failed);
      },
    });
    const webhooks = src.webhooks;
    if (webhooks) {
      new Gauge({
        name: "forkd_webhook_events",
        help:
          "Lifecycle webhook events since start, by outcome (delivered, failed_attempt: an attempt that failed and " +
          "is retried, dropped_overflow: pushed out of a full queue, dropped_attempts: its last attempt failed)",
        labelNames: ["outcome"],
        registers,
        collect() {
          const w = webhooks();
          this.set({ outcome: "delivered" }, w.delivered);
          this.set({ outcome: "failed_attempt" }, w.failedAttempts);
          this.set({ outcome: "dropped_overflow" }, w.droppedOverflow);
          this.set({ outcome: "dropped_attempts" }, w.droppedAttempts);
        },
      });
      new Gauge({
        name: "forkd_webhook_queued",
        help: "Lifecycle webhook events not delivered yet, over all webhooks",
        registers,
        collect() {
          this.set(webhooks().queued);
        },
      });
      new Gauge({
        name: "forkd_webhooks",
        help: "Lifecycle webhooks defined",
        registers,
        collect() {
          this.set(webhooks().webhooks);
        },
      });
    }
    const toolRuns = src.toolRuns;
    if (toolRuns) {
      new Gauge({
        name: "forkd_host_tool_runs",
        help: "Runs of host tools (qemu-img, e2fsck) on files guests or tenants wrote since start, by tool and whether jailed",
        labelNames: ["tool", "jailed"],
        registers,
        collect() {
          for (const r of toolRuns()) this.set({ tool: r.tool, jailed: String(r.jailed) }, r.runs);
        },
      });
    }
    this.httpSeconds = new Histogram({
      name: "forkd_http_request_duration_seconds",
      help: "API requests until their reply's headers, by route template, method and status code",
      labelNames: ["route", "method", "code"],
      buckets: LATENCY,
      registers,
    });
    this.forkSeconds = new Histogram({
      name: "forkd_fork_seconds",
      help: "Time to fork one child until its agent answered (per child)",
      buckets: LATENCY,
      registers,
    });
    this.branchPauseSeconds = new Histogram({
      name: "forkd_branch_pause_seconds",
      help: "How long a BRANCH paused its source sandbox",
      buckets: LATENCY,
      registers,
    });
    this.execSeconds = new Histogram({
      name: "forkd_exec_seconds",
      help: "Buffered and streamed exec, from start to exit",
      buckets: LATENCY,
      registers,
    });
    this.failures = new Counter({
      name: "forkd_failures_total",
      help: "Failed operations, by operation and reason (the error code)",
      labelNames: ["op", "reason"],
      registers,
    });
    this.processFailures = new Counter({
      name: "forkd_process_failures_total",
      help: "Failures no code handled, by kind: unhandled_rejection (logged, served on), uncaught_exception",
      labelNames: ["kind"],
      registers,
    });
    this.peerPulledBytes = new Counter({
      name: "forkd_peer_pulled_bytes_total",
      help: "Bytes of snapshot and image files received from peers of the cluster (pulls from peers, src/snapshot/peer-pull.ts)",
      registers,
    });
    this.peerPulls = new Counter({
      name: "forkd_peer_pulls_total",
      help: "Snapshots pulled from peers of the cluster, by result (ok, failed): one per pull however many forks waited for it",
      labelNames: ["result"],
      registers,
    });
    this.registryFallbackPulls = new Counter({
      name: "forkd_registry_fallback_pulls_total",
      help: "Snapshots a node of a cluster fetched from the registry a node pushed them to, no live peer having given them, by result (ok, failed)",
      labelNames: ["result"],
      registers,
    });
    for (const result of ["ok", "failed"]) {
      this.peerPulls.inc({ result }, 0);
      this.registryFallbackPulls.inc({ result }, 0);
    }
    // Both series exist from the start (at 0), so an alert can watch them.
    for (const kind of ["unhandled_rejection", "uncaught_exception"]) this.processFailures.inc({ kind }, 0);
  }

  http(route: string, method: string, code: number, seconds: number): void {
    this.httpSeconds.observe({ route, method, code: String(code) }, seconds);
  }
  fork(seconds: number): void {
    this.forkSeconds.observe(seconds);
  }
  branchPause(seconds: number): void {
    this.branchPauseSeconds.observe(seconds);
  }
  exec(seconds: number): void {
    this.execSeconds.observe(seconds);
  }
  failure(op: string, reason: string): void {
    this.failures.inc({ op, reason });
  }
  processFailure(kind: "unhandled_rejection" | "uncaught_exception"): void {
    this.processFailures.inc({ kind });
  }
  peerPulled(bytes: number): void {
    this.peerPulledBytes.inc(bytes);
  }
  peerPull(result: "ok" | "failed"): void {
    this.peerPulls.inc({ result });
  }

  registryFallbackPull(result: "ok" | "failed"): void {
    this.registryFallbackPulls.inc({ result });
  }

  async render(): Promise<{ contentType: string; text: string }> {
    return { contentType: this.registry.contentType, text: await this.registry.metrics() };
  }
}
