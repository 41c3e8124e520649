/**
 * The NDJSON lines of a streamed reply (exec/stream, a command's stream, a watch) as they come,
 * for integration tests: `until` waits for a line (or for the text) while the reply flows.
 */
import type { IncomingMessage } from "node:http";

export interface Line {
  type: string;
  [k: string]: unknown;
}

/** The NDJSON lines of a streamed reply as they come; `until` waits for one (or for the text). */
export class Lines {
  readonly lines: Line[] = [];
  ended = false;
  private buf = "";
  private waiters: (() => void)[] = [];

  constructor(readonly res: IncomingMessage) {
    res.setEncoding("utf8");
    res.on("data", (s: string) => {
      this.buf += s;
      let i;
      while ((i = this.buf.indexOf("\n")) >= 0) {
        this.lines.push(JSON.parse(this.buf.slice(0, i)) as Line);
        this.buf = this.buf.slice(i + 1);
      }
      this.wake();
    });
    const end = () => {
      this.ended = true;
      this.wake();
    };
    res.on("end", end);
    res.on("error", end);
    res.on("close", end);
  }

  private wake() {
    for (const w of this.waiters.splice(0)) w();
  }

  /** Everything the command wrote (stdout lines, base64). */
  text(): string {
    return this.lines
      .filter((l) => l.type === "stdout")
      .map((l) => Buffer.from(l.data as string, "base64").toString("utf8"))
      .join("");
  }

  async until(pred: (l: Lines) => boolean, what: string, ms = 60_000): Promise<void> {
    const deadline = Date.now() + ms;
    while (!pred(this)) {
      if (this.ended) throw new Error(`stream ended before ${what}: ${JSON.stringify(this.lines)}`);
      if (Date.now() > deadline) throw new Error(`no ${what} within ${ms} ms: ${JSON.stringify(this.lines)}`);
      await new Promise<void>((r) => {
        this.waiters.push(r);
        setTimeout(r, 200);
      });
    }
  }

  line(type: string): Line | undefined {
    return this.lines.find((l) => l.type === type);
  }
}
