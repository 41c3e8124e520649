/** The daemon's logger, and its JSON-lines implementation on stderr (stdout is left to the CLI and to protocols). */

export interface Logger {
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
}

export function jsonLogger(component: string, out: NodeJS.WritableStream = process.stderr): Logger {
  const write = (level: string, msg: string, fields?: Record<string, unknown>) =>
    out.write(JSON.stringify({ time: new Date().toISOString(), level, component, msg, ...fields }) + "\n");
  return {
    info: (msg, fields) => write("info", msg, fields),
    warn: (msg, fields) => write("warn", msg, fields),
  };
}
