/**
 * An exec that starts only once a check has passed (that the guest agent understands the
 * request, e.g. its `user`): stdin, close and signals given before it started are passed on in
 * order once it has; if the check fails, the exec fails with its error and nothing is sent.
 */
import type { ExecHandle } from "./exec.js";

export function gatedExec(gate: Promise<void>, start: () => ExecHandle): ExecHandle {
  let inner: ExecHandle | undefined;
  const pending: ((h: ExecHandle) => void)[] = [];
  const ready = gate.then(() => {
    const h = start();
    inner = h;
    for (const op of pending.splice(0)) op(h);
    return h;
  });
  ready.catch(() => pending.splice(0)); // observed through `result`; queued input is dropped
  const started = ready.then((h) => h.started);
  started.catch(() => undefined); // observed through `result` too
  const later = (op: (h: ExecHandle) => void): void => {
    if (inner) op(inner);
    else pending.push(op);
  };
  return {
    started,
    result: ready.then((h) => h.result),
    writeStdin: (data) => later((h) => h.writeStdin(data)),
    closeStdin: () => later((h) => h.closeStdin()),
    signal: (sig) => later((h) => h.signal(sig)),
    resize: (rows, cols) => later((h) => h.resize(rows, cols)),
  };
}
