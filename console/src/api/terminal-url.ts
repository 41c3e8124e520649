/** The URL of a sandbox's terminal WebSocket, same origin as the page, with a fresh ticket. */
import { withTicket } from "./http";

export async function terminalUrl(id: string, rows: number, cols: number): Promise<string> {
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  const path = await withTicket(`/v1/sandboxes/${encodeURIComponent(id)}/terminal`, { rows, cols });
  return `${proto}//${location.host}${path}`;
}
