/**
 * Whether a qcow2 layer written by someone else (a pack, a jailed VMM) is a plain layer: qcow2,
 * with no external data file, which would make QEMU or qemu-img read and write a host file the
 * layer names. Its backing file is the caller's to replace (rebaseUnsafe). `qemu-img info` parses
 * the header, so it runs jailed (src/vmm/jailed-tools.ts), seeing that file alone.
 */
import { errorMessage } from "../util/index.js";
import { runTool } from "../vmm/index.js";
import type { ToolRunner } from "../vmm/index.js";

/** What `qemu-img info` says of a layer: why it is not plain (null: it is), and its virtual size. */
export interface LayerInfo {
  problem: string | null;
  virtualSize: number | null;
}

export async function layerInfo(tools: ToolRunner, path: string): Promise<LayerInfo> {
  let stdout: string;
  try {
    ({ stdout } = await runTool(tools, "qemu-img", ["info", "-U", "--output=json", "-f", "qcow2", path], {
      reads: [path],
      timeoutMs: 30_000,
      maxFileBytes: 0,
      maxOutputBytes: 256 << 10,
    }));
  } catch (e) {
    return { problem: errorMessage(e), virtualSize: null };
  }
  let info: {
    format?: unknown;
    "virtual-size"?: unknown;
    "format-specific"?: { data?: Record<string, unknown> };
  };
  try {
    info = JSON.parse(stdout) as typeof info;
  } catch {
    return { problem: "qemu-img info is not JSON", virtualSize: null };
  }
  const size = info["virtual-size"];
  const virtualSize = typeof size === "number" && Number.isSafeInteger(size) && size > 0 ? size : null;
  if (info.format !== "qcow2") return { problem: `format ${JSON.stringify(info.format)}`, virtualSize };
  const data = info["format-specific"]?.data ?? {};
  if ("data-file" in data || data["data-file-raw"] === true)
    return { problem: "it names an external data file", virtualSize };
  if (virtualSize === null) return { problem: "it states no virtual size", virtualSize };
  return { problem: null, virtualSize };
}

/** Why `path` is not a plain qcow2 layer, or null when it is. */
export async function plainLayerProblem(tools: ToolRunner, path: string): Promise<string | null> {
  return (await layerInfo(tools, path)).problem;
}
