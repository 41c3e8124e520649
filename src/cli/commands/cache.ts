/**
 * The shared cache directory (FORKD_CACHE_DIR): `cache ls` (entries, sizes, last use, what
 * keeps each) and `cache gc` (delete what nothing keeps, or only until the cache fits a budget).
 * They run here, not through a daemon: the cache is shared by every daemon of the host (one per
 * data directory) and owned by none, and a full disk may keep a daemon from starting. What they
 * decide comes from disk (snapshots of every recorded data directory, pins, open files) under the
 * cache's locks (src/cache/collect.ts), the same as a daemon's own automatic collection.
 */
import type { Command } from "commander";
import { collect, survey } from "../../cache/index.js";
import type { CollectResult } from "../../cache/index.js";
import type { PlannedEntry } from "../../cache/index.js";
import { describe } from "../../cache/index.js";
import type { CliContext } from "../context.js";
import { printTable } from "../table.js";
import { usageError } from "../errors.js";

const GIB = 1024 ** 3;
const gib = (b: number): string => `${(b / GIB).toFixed(2)} GiB`;
const size = (b: number): string =>
  b >= GIB ? gib(b) : b >= 1 << 20 ? `${(b / (1 << 20)).toFixed(1)} MiB` : `${Math.ceil(b / 1024)} KiB`;
const age = (ms: number, now: number): string => {
  const s = Math.max(0, Math.round((now - ms) / 1000));
  return s < 120
    ? `${s}s ago`
    : s < 7200
      ? `${Math.round(s / 60)}m ago`
      : s < 172800
        ? `${Math.round(s / 3600)}h ago`
        : `${Math.round(s / 86400)}d ago`;
};
const entryJson = (e: PlannedEntry) => ({
  entry: e.id,
  kind: e.kind,
  bytes: e.bytes,
  last_use: new Date(e.lastUse).toISOString(),
  kept_by: e.reasons.map(describe),
});

/** What keeps an entry, in a table cell: the first few reasons and how many more. */
const keptBy = (e: PlannedEntry): string => {
  const all = e.reasons.map(describe);
  if (all.length === 0) return "-";
  return all.length <= 3 ? all.join("; ") : `${all.slice(0, 3).join("; ")}; +${all.length - 3} more`;
};

function parseGib(v: string | undefined): number | null {
  if (v === undefined) return null;
  const n = Number(v);
  if (!Number.isFinite(n) || n < 0) throw usageError(`--max-gib: not a number of GiB >= 0: ${v}`);
  return Math.floor(n * GIB);
}

export function cacheCommands(program: Command, ctx: CliContext): void {
  const cache = program
    .command("cache")
    .description(`the shared image cache (${ctx.paths.cacheDir}): list it, collect what nothing uses`);

  cache
    .command("ls")
    .description("every cache entry: kind, size, last use, and what keeps it (nothing: it may be collected)")
    .option("--json", "JSON output")
    .action(async (o: { json?: boolean }) => {
      const now = Date.now();
      const { plan, users } = await survey(ctx.paths.cacheDir, {
        budgetBytes: null,
        dataDirs: [ctx.paths.dataDir],
      });
      const all = [...plan.kept, ...plan.evict].sort((a, b) => (a.id < b.id ? -1 : 1));
      if (o.json) {
        return console.log(
          JSON.stringify(
            {
              cache_dir: ctx.paths.cacheDir,
              total_bytes: plan.totalBytes,
              collectable_bytes: plan.totalBytes - plan.afterBytes,
              users: users.live.map((u) => u.dataDir),
              entries: all.map(entryJson),
            },
            null,
            2,
          ),
        );
      }
      printTable(
        ["ENTRY", "SIZE", "LAST USE", "KEPT BY"],
        all.map((e) => [e.id, size(e.bytes), age(e.lastUse, now), keptBy(e)]),
      );
      ctx.say(
        `${all.length} entries, ${gib(plan.totalBytes)} (shared files counted once); ${gib(plan.totalBytes - plan.afterBytes)} collectable; users: ${users.live.map((u) => u.dataDir).join(", ") || "none"}`,
      );
    });

  cache
    .command("gc")
    .description("delete cache entries no snapshot, build or process uses (least recently used first)")
    .option("--dry-run", "say what would go, delete nothing")
    .option("--max-gib <n>", "only until the cache holds at most N GiB")
    .option("--wait <seconds>", "how long to wait for a running image build", "600")
    .option("--json", "JSON output")
    .action(async (o: { dryRun?: boolean; maxGib?: string; wait: string; json?: boolean }) => {
      const wait = Number(o.wait);
      if (!Number.isFinite(wait) || wait < 0) throw usageError(`--wait: not a number of seconds: ${o.wait}`);
      const r = await collect(ctx.paths.cacheDir, {
        dryRun: o.dryRun ?? false,
        budgetBytes: parseGib(o.maxGib),
        dataDirs: [ctx.paths.dataDir],
        waitMs: wait * 1000,
      });
      if (o.json) return console.log(JSON.stringify(resultJson(r), null, 2));
      if (r.busy) {
        ctx.say(`cache gc: not run: ${r.busy} (try again, or --wait longer)`);
        process.exitCode = 1;
        return;
      }
      const verb = r.dryRun ? "would delete" : "deleted";
      for (const e of r.evict)
        console.log(`${verb} ${e.id} (${size(e.bytes)}, last used ${age(e.lastUse, Date.now())})`);
      ctx.say(
        `cache gc${r.dryRun ? " (dry run)" : ""}: ${r.evict.length} entries ${verb}, ${gib(r.freedBytes)} freed of ${gib(r.totalBytes)}; ${r.kept.length} kept (${r.kept.filter((e) => e.reasons.length > 0).length} in use)${r.budgetBytes !== null ? `; budget ${gib(r.budgetBytes)}` : ""}`,
      );
    });
}

const resultJson = (r: CollectResult) => ({
  cache_dir: r.cacheDir,
  dry_run: r.dryRun,
  budget_bytes: r.budgetBytes,
  ...(r.busy ? { busy: r.busy } : {}),
  total_bytes: r.totalBytes,
  after_bytes: r.afterBytes,
  freed_bytes: r.freedBytes,
  users: r.users,
  stale_users: r.staleUsers,
  stale_pins: r.stalePins,
  evicted: r.evict.map(entryJson),
  kept: r.kept.map(entryJson),
});
