/**
 * A sandbox's terminal: xterm.js over the terminal WebSocket. Binary frames both ways are the
 * terminal's bytes; resizes go as JSON text frames; the server's `exit` frame ends the session.
 */
import { FitAddon } from "@xterm/addon-fit";
import { Terminal as XTerm } from "@xterm/xterm";
import "@xterm/xterm/css/xterm.css";
import { useEffect, useRef, useState } from "preact/hooks";
import { terminalUrl } from "../api/terminal-url";

export function Terminal({ id }: { id: string }) {
  const host = useRef<HTMLDivElement>(null);
  const [session, setSession] = useState(0);
  const [status, setStatus] = useState("connecting…");
  useEffect(() => {
    const el = host.current;
    if (!el) return undefined;
    const term = new XTerm({ convertEol: false, cursorBlink: true, fontSize: 13, scrollback: 5000 });
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open(el);
    fit.fit();
    const enc = new TextEncoder();
    let ws: WebSocket | null = null;
    let disposed = false;
    // The WebSocket cannot send the session's key: its URL carries a fresh ticket instead.
    terminalUrl(id, term.rows, term.cols).then(
      (url) => {
        if (disposed) return;
        const sock = new WebSocket(url);
        ws = sock;
        sock.binaryType = "arraybuffer";
        sock.onopen = () => {
          setStatus("connected");
          term.focus();
        };
        sock.onmessage = (m: MessageEvent<ArrayBuffer | string>) => {
          if (typeof m.data !== "string") return term.write(new Uint8Array(m.data));
          try {
            const c = JSON.parse(m.data) as {
              type?: string;
              exit_code?: number | null;
              error?: { message?: string };
            };
            if (c.type === "exit") setStatus(`exited with code ${c.exit_code ?? "?"}`);
            if (c.type === "error") setStatus(`exited: ${c.error?.message ?? "error"}`);
          } catch {
            /* not a control frame */
          }
        };
        sock.onclose = (e) => setStatus((s) => (s.startsWith("exited") ? s : `closed (${e.code})`));
      },
      (e: unknown) => {
        if (!disposed) setStatus(`closed (${e instanceof Error ? e.message : String(e)})`);
      },
    );
    const open = (): WebSocket | null => (ws !== null && ws.readyState === WebSocket.OPEN ? ws : null);
    const data = term.onData((d) => open()?.send(enc.encode(d)));
    const resize = term.onResize(({ rows, cols }) => {
      open()?.send(JSON.stringify({ type: "resize", rows, cols }));
    });
    const observer = new ResizeObserver(() => fit.fit());
    observer.observe(el);
    return () => {
      disposed = true;
      observer.disconnect();
      data.dispose();
      resize.dispose();
      ws?.close();
      term.dispose();
    };
  }, [id, session]);
  return (
    <section class="terminal" aria-label="Terminal">
      <h2>Terminal</h2>
      <p role="status" aria-label="Terminal status">
        {status}{" "}
        <button type="button" onClick={() => setSession((n) => n + 1)}>
          New session
        </button>
      </p>
      <div class="xterm-host" ref={host} />
    </section>
  );
}
