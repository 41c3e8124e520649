/**
 * The rows of issue 15's table as bench/perf.ts measures them (a figure, its baseline from the
 * same run, the ratio, the goal and whether it is met) and their rendering as a Markdown table.
 * Pure functions.
 */
import { r2 } from "./stats.js";

export type Unit = "ms" | "s" | "MiB" | "count";

/**
 * A row's goal: `max` an absolute bound on the figure; `ratio` a bound on figure / baseline;
 * `same` the figure no more than `tolerance` (in its unit) or `tolerancePct` percent above the
 * baseline, whichever is larger; `none` no goal (a figure shown for context).
 */
export type Goal =
  | { kind: "max"; value: number }
  | { kind: "ratio"; max: number }
  | { kind: "same"; tolerance: number; tolerancePct: number }
  | { kind: "none" };

export interface PerfRow {
  /** The row ("1".."9"), with a letter for a second figure of a row ("2b"). */
  id: string;
  figure: string;
  unit: Unit;
  /** null: not measured (see note). */
  value: number | null;
  baseline: number | null;
  baselineWhat: string;
  goal: Goal;
  /** The figure for main when it was filed. */
  today: string;
  note?: string;
}

export interface RowVerdict {
  ratio: number | null;
  /** null: no goal, or a figure missing. */
  met: boolean | null;
}

const finite = (x: number | null): x is number => x !== null && Number.isFinite(x);

/** The ratio figure / baseline and whether the goal is met. */
export function verdict(row: PerfRow): RowVerdict {
  const { value, baseline, goal } = row;
  const ratio = finite(value) && finite(baseline) && baseline !== 0 ? value / baseline : null;
  switch (goal.kind) {
    case "max":
      return { ratio, met: finite(value) ? value <= goal.value : null };
    case "ratio":
      return { ratio, met: ratio === null ? null : ratio <= goal.max };
    case "same": {
      if (!finite(value) || !finite(baseline)) return { ratio, met: null };
      const tol = Math.max(goal.tolerance, (Math.abs(baseline) * goal.tolerancePct) / 100);
      return { ratio, met: value <= baseline + tol };
    }
    case "none":
      return { ratio, met: null };
  }
}

/** A figure in its unit: ms with one decimal, s and MiB with two/one, counts whole. */
export function formatValue(x: number | null, unit: Unit): string {
  if (!finite(x)) return "n/a";
  switch (unit) {
    case "ms":
      return `${x.toFixed(1)} ms`;
    case "s":
      return `${x.toFixed(2)} s`;
    case "MiB":
      return `${x.toFixed(1)} MiB`;
    case "count":
      return String(Math.round(x));
  }
}

export function formatGoal(goal: Goal, unit: Unit): string {
  switch (goal.kind) {
    case "max":
      return `≤ ${formatValue(goal.value, unit)}`;
    case "ratio":
      return `≤ ${goal.max}× baseline`;
    case "same":
      return `≈ baseline (+${formatValue(goal.tolerance, unit)} or ${goal.tolerancePct}%)`;
    case "none":
      return "—";
  }
}

const cell = (s: string): string => s.replace(/\|/g, "\\|").replace(/\n/g, " ");

/** The rows as a Markdown table, one line per row, notes as a list under it. */
export function formatTable(rows: readonly PerfRow[]): string {
  const head = "| # | figure | this run | baseline (same run) | ratio | goal | met | issue's main |";
  const lines = [head, "|---|---|---|---|---|---|---|---|"];
  const notes: string[] = [];
  for (const row of rows) {
    const v = verdict(row);
    const met = v.met === null ? "—" : v.met ? "yes" : "no";
    const ratio = v.ratio === null ? "—" : `${r2(v.ratio)}×`;
    const baseline =
      row.baseline === null && !row.baselineWhat
        ? "—"
        : `${formatValue(row.baseline, row.unit)} (${row.baselineWhat})`;
    lines.push(
      `| ${[row.id, row.figure, formatValue(row.value, row.unit), baseline, ratio, formatGoal(row.goal, row.unit), met, row.today].map(cell).join(" | ")} |`,
    );
    if (row.note) notes.push(`- ${row.id}: ${row.note}`);
  }
  return [...lines, ...(notes.length ? ["", ...notes] : [])].join("\n");
}

/** `--only 1,2,5`: the set of the row numbers to run (all nine when absent or empty). */
export function parseOnly(text: string | undefined): Set<number> {
  const all = new Set([1, 2, 3, 4, 5, 6, 7, 8, 9]);
  if (!text?.trim()) return all;
  const out = new Set<number>();
  for (const part of text.split(",")) {
    const m = /^\s*(\d+)(?:\s*-\s*(\d+))?\s*$/.exec(part);
    if (!m) throw new Error(`--only: "${part}" is not a row number or a range (1-9)`);
    const lo = Number(m[1]);
    const hi = m[2] === undefined ? lo : Number(m[2]);
    for (let n = lo; n <= hi; n++) {
      if (!all.has(n)) throw new Error(`--only: there is no row ${n} (rows 1-9)`);
      out.add(n);
    }
  }
  return out;
}
