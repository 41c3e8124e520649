/**
 * Checking a freshly built root filesystem (`e2fsck -f -y`). A build's final layer is frozen
 * from a mounted ext4 after a sync, so e2fsck may replay its journal, release orphaned inodes and
 * correct the superblock's free block and inode totals (which ext4 does not keep current while
 * mounted): those are expected. Anything else it fixes means the layers were not one
 * consistent disk (a bug, e.g. a layer rebased onto the wrong parent), so the build fails with
 * e2fsck's output instead of installing an image e2fsck patched up.
 *
 * The file system is what a tenant's build wrote: e2fsck runs jailed (src/vmm/jailed-tools.ts),
 * seeing that image alone, and may not grow it.
 */
import { stat } from "node:fs/promises";
import { ForkdError } from "../../util/index.js";
import type { ToolRunner } from "../../vmm/index.js";

/** The superblock totals a mounted ext4 leaves stale (not the per-group counts). */
const EXPECTED_FIX = /^Free (blocks|inodes) count wrong \(\d+, counted=\d+\)\.$/;

/** The problems e2fsck -y answered "yes" to, other than the expected ones. */
export function unexpectedFixes(output: string): string[] {
  const lines = output.split("\n").map((l) => l.trim());
  const out: string[] = [];
  for (const [i, l] of lines.entries()) {
    const m = /^(.*?)\s*\b[A-Za-z][A-Za-z ]*\? yes$/.exec(l);
    if (!m) continue;
    let problem = m[1] ?? "";
    for (let j = i - 1; problem === "" && j >= 0; j--) problem = lines[j] ?? "";
    if (!EXPECTED_FIX.test(problem)) out.push(problem);
  }
  return out;
}

/** e2fsck -fy `image`: exit 0, or 1 with only the expected fixes; else an image_error. */
export async function checkBuiltFilesystem(tools: ToolRunner, image: string, mode = 0o644): Promise<void> {
  const { code, stdout, stderr } = await tools.exec("e2fsck", ["-f", "-y", image], {
    writes: [image],
    mode,
    timeoutMs: 600_000,
    maxFileBytes: (await stat(image)).size,
    maxOutputBytes: 16 << 20,
  });
  const unexpected = code === 1 ? unexpectedFixes(stdout) : [];
  if (code === 0 || (code === 1 && unexpected.length === 0)) return;
  const why =
    code === 1
      ? `e2fsck had to fix the built root filesystem (${unexpected.slice(0, 5).join("; ")})`
      : `e2fsck of the built root filesystem failed (exit ${code})`;
  throw new ForkdError("image_error", `${why}: ${(stdout + stderr).slice(-800)}`, {
    fsck_exit: code,
    ...(unexpected.length ? { fsck_fixes: unexpected.slice(0, 20) } : {}),
  });
}
