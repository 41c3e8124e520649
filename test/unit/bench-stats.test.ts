/**
 * The benchmarks' statistics and issue 15's table (bench/stats.ts, bench/perf-table.ts,
 * bench/native-python.ts): percentiles by rank, medians, ratios and goals, the rendered table,
 * `--only` parsing and the native baseline's program.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { median, pct, summarize } from "../../bench/stats.js";
import { formatTable, formatValue, parseOnly, verdict } from "../../bench/perf-table.js";
import type { PerfRow } from "../../bench/perf-table.js";
import { nativeProgram } from "../../bench/native-python.js";

test("pct is by rank over the sorted samples, whatever their order; NaN for none", () => {
  const xs = [50, 10, 40, 20, 30];
  assert.equal(pct(xs, 0), 10);
  assert.equal(pct(xs, 50), 30);
  assert.equal(pct(xs, 90), 50);
  assert.equal(pct(xs, 100), 50);
  assert.equal(pct([10, 20, 30, 40], 50), 30, "an even count: the upper middle, as the older scripts report");
  assert.ok(Number.isNaN(pct([], 50)));
  assert.deepEqual(xs, [50, 10, 40, 20, 30], "the input is not sorted in place");
});

test("median is the middle sample, or the mean of the middle two", () => {
  assert.equal(median([3, 1, 2]), 2);
  assert.equal(median([4, 1, 3, 2]), 2.5);
  assert.equal(median([7]), 7);
  assert.ok(Number.isNaN(median([])));
});

test("summarize rounds to 0.1 and keeps the samples in the order measured", () => {
  const s = summarize([1.04, 3.26, 2.15]);
  assert.equal(s.n, 3);
  assert.equal(s.p50, 2.2);
  assert.equal(s.p90, 3.3);
  assert.equal(s.min, 1);
  assert.equal(s.max, 3.3);
  assert.deepEqual(s.samples, [1, 3.3, 2.2]);
});

const row = (over: Partial<PerfRow>): PerfRow => ({
  id: "1",
  figure: "a figure",
  unit: "ms",
  value: 100,
  baseline: 200,
  baselineWhat: "the baseline",
  goal: { kind: "none" },
  today: "434 ms",
  ...over,
});

test("verdict: the ratio to the baseline and each kind of goal", () => {
  assert.deepEqual(verdict(row({ goal: { kind: "ratio", max: 0.5 } })), { ratio: 0.5, met: true });
  assert.deepEqual(verdict(row({ value: 101, goal: { kind: "ratio", max: 0.5 } })), {
    ratio: 0.505,
    met: false,
  });
  assert.equal(verdict(row({ goal: { kind: "max", value: 60 } })).met, false);
  assert.equal(verdict(row({ value: 60, goal: { kind: "max", value: 60 } })).met, true);
  assert.deepEqual(verdict(row({ goal: { kind: "none" } })), { ratio: 0.5, met: null });
  // `same`: at most the larger of the absolute and the relative tolerance above the baseline.
  const same = { kind: "same", tolerance: 5, tolerancePct: 10 } as const;
  assert.equal(verdict(row({ value: 220, baseline: 200, goal: same })).met, true);
  assert.equal(verdict(row({ value: 221, baseline: 200, goal: same })).met, false);
  assert.equal(verdict(row({ value: 24, baseline: 20, goal: same })).met, true, "5 ms beats 10% of 20");
  assert.equal(verdict(row({ value: 26, baseline: 20, goal: same })).met, false);
  assert.equal(
    verdict(row({ value: 10, baseline: 200, goal: same })).met,
    true,
    "faster than the baseline is fine",
  );
  // A figure or baseline missing: no ratio, no verdict on a relative goal; an absolute one needs only the figure.
  assert.deepEqual(verdict(row({ baseline: null, goal: same })), { ratio: null, met: null });
  assert.deepEqual(verdict(row({ value: null, goal: { kind: "max", value: 1 } })), {
    ratio: null,
    met: null,
  });
  assert.deepEqual(verdict(row({ baseline: null, goal: { kind: "max", value: 150 } })), {
    ratio: null,
    met: true,
  });
  assert.equal(verdict(row({ baseline: 0 })).ratio, null, "no ratio to a zero baseline");
});

test("values print in their unit; a missing one as n/a", () => {
  assert.equal(formatValue(12.345, "ms"), "12.3 ms");
  assert.equal(formatValue(12.345, "s"), "12.35 s");
  assert.equal(formatValue(20, "MiB"), "20.0 MiB");
  assert.equal(formatValue(7.6, "count"), "8");
  assert.equal(formatValue(null, "ms"), "n/a");
  assert.equal(formatValue(NaN, "ms"), "n/a");
});

test("the table has one line per row, the verdict filled in, notes under it", () => {
  const text = formatTable([
    row({ goal: { kind: "ratio", max: 0.5 }, note: "fork 50 | cell 50" }),
    row({
      id: "8",
      figure: "idle VMMs",
      unit: "count",
      value: 3,
      baseline: 2,
      goal: { kind: "max", value: 8 },
    }),
    row({
      id: "9",
      value: 80,
      baseline: null,
      baselineWhat: "a NIC-less snapshot",
      goal: { kind: "same", tolerance: 5, tolerancePct: 5 },
    }),
  ]);
  const lines = text.split("\n");
  assert.match(lines[0] ?? "", /^\| # \| figure \| this run \| baseline/);
  assert.equal(
    lines[2],
    "| 1 | a figure | 100.0 ms | 200.0 ms (the baseline) | 0.5× | ≤ 0.5× baseline | yes | 434 ms |",
  );
  assert.equal(lines[3], "| 8 | idle VMMs | 3 | 2 (the baseline) | 1.5× | ≤ 8 | yes | 434 ms |");
  assert.equal(
    lines[4],
    "| 9 | a figure | 80.0 ms | n/a (a NIC-less snapshot) | — | ≈ baseline (+5.0 ms or 5%) | — | 434 ms |",
  );
  assert.equal(lines[5], "");
  assert.equal(lines[6], "- 1: fork 50 | cell 50", "notes are not table cells: no escaping");
  assert.equal(lines.length, 7);
});

test("--only takes row numbers and ranges; anything else is refused", () => {
  assert.deepEqual([...parseOnly(undefined)], [1, 2, 3, 4, 5, 6, 7, 8, 9]);
  assert.deepEqual([...parseOnly(" ")], [1, 2, 3, 4, 5, 6, 7, 8, 9]);
  assert.deepEqual([...parseOnly("1,2,5")].sort(), [1, 2, 5]);
  assert.deepEqual([...parseOnly("3-5,9")].sort(), [3, 4, 5, 9]);
  assert.throws(() => parseOnly("10"), /no row 10/);
  assert.throws(() => parseOnly("1,x"), /not a row number/);
});

test("the native program imports numpy, runs the cell and prints its last expression", () => {
  assert.equal(
    nativeProgram("x = np.arange(3)\nint(x.sum())\n", "import numpy as np"),
    "import numpy as np\nx = np.arange(3)\nprint(int(x.sum()))",
  );
});
