/**
 * A local cluster's two secrets: the admin token every node and gateway accepts (FORKD_TOKEN;
 * `e2b_` + 64 hex digits, the form E2B's SDKs accept as an API key, so one value serves forkd's
 * clients and E2B's), and the cluster secret peers authenticate with (a 0600 file of 64 random
 * base64url characters: FORKD_CLUSTER_SECRET_FILE wants >= 32 bytes).
 */
import { randomBytes } from "node:crypto";
import { writeFileAtomic } from "../util/index.js";

/** Strings forkd refuses as a token (src/access/tokens.ts weakTokenReason): never generated. */
const PLACEHOLDER = /change.?me|placeholder|your.?token|example|password|secret|xxxx|1234567|abcdefg/i;

export function newAdminToken(): string {
  for (;;) {
    const t = "e2b_" + randomBytes(32).toString("hex");
    if (!PLACEHOLDER.test(t) && new Set(t).size >= 10) return t;
  }
}

export async function writeClusterSecret(path: string): Promise<void> {
  await writeFileAtomic(path, randomBytes(48).toString("base64url"), 0o600);
}
