/** The URL of a sandbox's terminal WebSocket, same origin as the page. */
import { withQuery } from "./http";

export function terminalUrl(id: string, rows: number, cols: number): string {
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  return `${proto}//${location.host}${withQuery(`/v1/sandboxes/${encodeURIComponent(id)}/terminal`, { rows, cols })}`;
}
