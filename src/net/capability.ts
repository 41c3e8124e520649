/**
 * What networking this host can give sandboxes, found once at daemon start (and by `forkd
 * doctor`): user-mode needs a QEMU built with slirp; netns needs root, iproute2, nftables,
 * /dev/net/tun and the jailer (it moves the VMM into the slot's namespace): each cause it lacks
 * is named with its own fix (netnsVerdict).
 */
import { access, constants } from "node:fs/promises";
import { asRoot } from "../util/index.js";
import { errorMessage } from "../util/index.js";
import { run } from "../util/index.js";
import { hostResolver } from "./sys.js";

export interface Capability {
  ok: boolean;
  /** Why not (or a caveat when ok). */
  reason: string;
  /** What to do about each cause `reason` names, when not ok (`forkd doctor` prints it). */
  fix?: string;
}

export interface NetCapabilities {
  user: Capability & { binary: string | null };
  netns: Capability;
  /** The resolver netns slots forward DNS to (a non-loopback nameserver of the host), or null. */
  resolver: string | null;
  dns: Capability;
}

const FULL_QEMU = "/usr/bin/qemu-system-x86_64";

/** Whether `binary` has QEMU's user-mode network backend. */
export async function hasSlirp(binary: string): Promise<boolean> {
  try {
    const { stdout } = await run(binary, ["-netdev", "help"], { timeoutMs: 10_000 });
    return stdout.split("\n").some((l) => l.trim() === "user");
  } catch {
    return false;
  }
}

async function tool(cmd: string, args: string[]): Promise<string | null> {
  try {
    await run(cmd, args, { timeoutMs: 10_000 });
    return null;
  } catch (e) {
    return `${cmd}: ${errorMessage(e)}`;
  }
}

export async function detectNetwork(o: {
  qemuBinary: string;
  jailer: string | null;
}): Promise<NetCapabilities> {
  // The microvm-only build (used under KVM) has no slirp; the full build of the same version does.
  let binary: string | null = null;
  for (const b of [o.qemuBinary, FULL_QEMU]) {
    if (await hasSlirp(b)) {
      binary = b;
      break;
    }
  }
  const user = {
    ok: binary !== null,
    binary,
    reason: binary ? `slirp in ${binary}` : `${o.qemuBinary} has no user-mode networking (slirp)`,
  };

  const tools: string[] = [];
  for (const [cmd, args, pkg] of [
    ["ip", ["-V"], "iproute2"],
    ["nft", ["--version"], "nftables"],
    ["sysctl", ["-V"], "procps"],
  ] as const) {
    if (await tool(cmd, [...args])) tools.push(`${cmd} (${pkg})`);
  }
  const tun = await access("/dev/net/tun", constants.R_OK | constants.W_OK).then(
    () => true,
    () => false,
  );
  const netns = netnsVerdict({ root: process.getuid?.() === 0, jailer: o.jailer, missingTools: tools, tun });

  const r = await hostResolver();
  const dns =
    r && !r.loopback
      ? { ok: true, reason: `netns slots forward DNS to ${r.addr}` }
      : {
          ok: false,
          reason: r
            ? `the host's resolver ${r.addr} is a loopback address, which a slot cannot reach: netns children get no DNS`
            : "the host has no nameserver in /etc/resolv.conf: netns children get no DNS",
        };
  return { user, netns, resolver: r && !r.loopback ? r.addr : null, dns };
}

/** What the host lacks for netns networking, each cause with its own fix (none: ok). */
export function netnsVerdict(h: {
  root: boolean;
  jailer: string | null;
  /** "ip (iproute2)": the tools not found, with their Debian package. */
  missingTools: string[];
  tun: boolean;
}): Capability {
  const gaps: { why: string; fix: string }[] = [];
  if (!h.root) gaps.push({ why: "the daemon is not root", fix: "run the daemon as root" });
  if (!h.jailer)
    gaps.push({
      why: "no jailer (native/jailer/forkd-jailer is not built)",
      fix: "build it: make -C native (or bash scripts/install.sh)",
    });
  if (h.missingTools.length > 0)
    gaps.push({
      why: `missing ${h.missingTools.join(", ")}`,
      fix: `install them: ${asRoot("bash scripts/setup-host.sh", h.root)}`,
    });
  if (!h.tun) gaps.push({ why: "/dev/net/tun is not usable", fix: "load the tun module: modprobe tun" });
  if (gaps.length === 0) return { ok: true, reason: "root, jailer, ip, nft, /dev/net/tun" };
  return { ok: false, reason: gaps.map((g) => g.why).join("; "), fix: gaps.map((g) => g.fix).join("; ") };
}
