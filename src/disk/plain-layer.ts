/**
 * Whether a qcow2 layer written by someone else (a pack, a jailed VMM) is a plain layer: qcow2,
 * with no external data file, which would make QEMU or qemu-img read and write a host file the
 * layer names. Its backing file is the caller's to replace (rebaseUnsafe).
 */
import { errorMessage } from "../util/errors.js";
import { run } from "../util/proc.js";

/** Why `path` is not a plain qcow2 layer, or null when it is. */
export async function plainLayerProblem(path: string): Promise<string | null> {
  let stdout: string;
  try {
    ({ stdout } = await run("qemu-img", ["info", "-U", "--output=json", "-f", "qcow2", path], {
      timeoutMs: 30_000,
    }));
  } catch (e) {
    return errorMessage(e);
  }
  let info: { format?: unknown; "format-specific"?: { data?: Record<string, unknown> } };
  try {
    info = JSON.parse(stdout) as typeof info;
  } catch {
    return "qemu-img info is not JSON";
  }
  if (info.format !== "qcow2") return `format ${JSON.stringify(info.format)}`;
  const data = info["format-specific"]?.data ?? {};
  if ("data-file" in data || data["data-file-raw"] === true) return "it names an external data file";
  return null;
}
