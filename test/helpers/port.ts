/** A loopback TCP port free right now (for a listener a test starts next). */
import { createServer } from "node:net";
import type { AddressInfo } from "node:net";

export async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", () => r()));
  const port = (s.address() as AddressInfo).port;
  await new Promise((r) => s.close(r));
  return port;
}
