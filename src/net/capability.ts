/**
 * What networking this host can give sandboxes, found once at daemon start (and by `forkd
 * doctor`): user-mode needs a QEMU built with slirp; netns needs root, iproute2, nftables,
 * /dev/net/tun and the jailer (it moves the VMM into the slot's namespace).
 */
import { access, constants } from "node:fs/promises";
import { errorMessage } from "../util/errors.js";
import { run } from "../util/proc.js";
import { hostResolver } from "./sys.js";

export interface Capability {
  ok: boolean;
  /** Why not (or a caveat when ok). */
  reason: string;
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

  const missing: string[] = [];
  if (process.getuid?.() !== 0) missing.push("the daemon is not root");
  if (!o.jailer) missing.push("no jailer (native/jailer/forkd-jailer)");
  for (const [cmd, args] of [
    ["ip", ["-V"]],
    ["nft", ["--version"]],
    ["sysctl", ["-V"]],
  ] as const) {
    const why = await tool(cmd, [...args]);
    if (why)
      missing.push(
        `${cmd} missing (apt-get install ${cmd === "ip" ? "iproute2" : cmd === "nft" ? "nftables" : "procps"})`,
      );
  }
  try {
    await access("/dev/net/tun", constants.R_OK | constants.W_OK);
  } catch {
    missing.push("/dev/net/tun is not usable");
  }
  const netns = {
    ok: missing.length === 0,
    reason: missing.length ? missing.join("; ") : "root, ip, nft, /dev/net/tun",
  };

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
