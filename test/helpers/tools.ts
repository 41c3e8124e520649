/**
 * A runner of host tools for tests, as the daemon builds it (src/daemon/main.ts): jailed when the
 * tests run as root (a uid range of its own, claimed like a daemon's, the host's cgroups and
 * native/jailer/forkd-jailer), else plain.
 */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Cgroups } from "../../src/host/cgroups.js";
import { findJailer } from "../../src/host/native.js";
import { Jail, jailEnabled, jailOptions } from "../../src/vmm/jail.js";
import { claimUidRange, DEFAULT_JAIL_GID } from "../../src/vmm/jail-uids.js";
import { JailedTools } from "../../src/vmm/jailed-tools.js";

export interface TestTools {
  tools: JailedTools;
  jail: Jail | null;
  /** Gives the uid range back. */
  release: () => Promise<void>;
}

export async function testTools(): Promise<TestTools> {
  if (!jailEnabled({}))
    return { tools: new JailedTools(null, null), jail: null, release: () => Promise.resolve() };
  // A data directory of its own names the range (claimed while the test runs: no daemon shares it).
  const dir = await mkdtemp(join(tmpdir(), "forkd-tools-"));
  const claim = await claimUidRange(dir, {});
  await rm(dir, { recursive: true, force: true });
  const jail = new Jail(jailOptions(claim, DEFAULT_JAIL_GID, [], []), await Cgroups.detect());
  return { tools: new JailedTools(jail, await findJailer({})), jail, release: () => claim.release() };
}
