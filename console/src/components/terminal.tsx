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
    const ws = new WebSocket(terminalUrl(id, term.rows, term.cols));
    ws.binaryType = "arraybuffer";
    const enc = new TextEncoder();
    ws.onopen = () => {
      setStatus("connected");
      term.focus();
    };
    ws.onmessage = (m: MessageEvent<ArrayBuffer | string>) => {
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
    ws.onclose = (e) => setStatus((s) => (s.startsWith("exited") ? s : `closed (${e.code})`));
    const data = term.onData((d) => ws.readyState === WebSocket.OPEN && ws.send(enc.encode(d)));
    const resize = term.onResize(({ rows, cols }) => {
      if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "resize", rows, cols }));
    });
    const observer = new ResizeObserver(() => fit.fit());
    observer.observe(el);
    return () => {
      observer.disconnect();
      data.dispose();
      resize.dispose();
      ws.close();
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
