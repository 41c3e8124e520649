/** Aligned text tables for listings (every listing also has --json). */
export function printTable(
  head: string[],
  rows: string[][],
  out: NodeJS.WritableStream = process.stdout,
): void {
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  const line = (r: string[]) =>
    r
      .map((c, i) => c.padEnd(widths[i] ?? 0))
      .join("  ")
      .trimEnd();
  out.write([line(head), ...rows.map(line)].join("\n") + "\n");
}
