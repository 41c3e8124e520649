/** `forkd doctor`: the host's prerequisites as a table (or JSON), with the fix for each that fails. */
import { runChecks } from "../vmm/index.js";
import type { Paths } from "../host/index.js";
import { printTable } from "./table.js";

/** Prints the checks; returns the exit code (1 if any failed). */
export async function runDoctor(paths: Paths, json: boolean): Promise<number> {
  const checks = await runChecks(paths);
  if (json) console.log(JSON.stringify(checks, null, 2));
  else {
    printTable(
      ["CHECK", "STATUS", "DETAIL"],
      checks.map((c) => [c.name, c.status.toUpperCase(), c.detail]),
    );
    for (const c of checks) if (c.fix && c.status !== "ok") console.log(`  ${c.name}: ${c.fix}`);
  }
  return checks.some((c) => c.status === "fail") ? 1 : 0;
}
