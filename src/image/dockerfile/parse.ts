/**
 * The Dockerfile parser: logical lines (lines.ts) into instructions, each checked for its form
 * and flags, with its line number. One stage: `ARG`s, then one `FROM`, then RUN, COPY, ADD, ENV,
 * ARG, WORKDIR, USER, LABEL, CMD, ENTRYPOINT. Everything else (other instructions, a second
 * FROM, heredocs, flags forkd does not implement) is refused naming its line. Variables are
 * expanded later, by plan.ts, once the base image's environment is known.
 */
import { ForkdError } from "../../util/index.js";
import { logicalLines, syntaxError } from "./lines.js";
import type { LogicalLine } from "./lines.js";

/** A command as written: exec (JSON) form or shell form. */
export type CommandForm = { exec: string[] } | { shell: string };

export type Instruction =
  | { op: "run"; line: number; command: CommandForm }
  | { op: "copy" | "add"; line: number; chown: string | null; chmod: string | null; args: ArgsForm }
  | { op: "env" | "label" | "arg" | "workdir" | "user"; line: number; raw: string }
  | { op: "cmd" | "entrypoint"; line: number; command: CommandForm };

/** COPY/ADD arguments: JSON form (each element expanded alone) or words of a line. */
export type ArgsForm = { json: string[] } | { text: string };

export interface Dockerfile {
  escape: "\\" | "`";
  /** ARG instructions before FROM (their raw text: `NAME[=default]`). */
  preArgs: Array<{ line: number; raw: string }>;
  from: { line: number; raw: string };
  instructions: Instruction[];
}

const KNOWN_UNSUPPORTED = new Set([
  "expose",
  "volume",
  "stopsignal",
  "healthcheck",
  "shell",
  "onbuild",
  "maintainer",
]);

/** `--name=value` flags at the start of `rest`; returns them and what follows. */
function takeFlags(line: number, rest: string): { flags: Map<string, string>; rest: string } {
  const flags = new Map<string, string>();
  let r = rest;
  for (;;) {
    const m = /^--([a-zA-Z][a-zA-Z0-9-]*)(?:=(\S*))?(?:\s+|$)/.exec(r);
    if (!m) break;
    const name = m[1] ?? "";
    if (flags.has(name)) throw syntaxError(line, `the flag --${name} is given twice`);
    flags.set(name, m[2] ?? "");
    r = r.slice(m[0].length);
  }
  return { flags, rest: r };
}

function refuseFlags(line: number, op: string, flags: Map<string, string>, allowed: string[]): void {
  for (const name of flags.keys()) {
    if (allowed.includes(name)) continue;
    const why =
      name === "from"
        ? " (multi-stage builds are not supported)"
        : name === "mount" || name === "network" || name === "security"
          ? " (BuildKit RUN options are not supported)"
          : "";
    throw syntaxError(line, `${op.toUpperCase()} --${name} is not supported${why}`);
  }
}

/** A JSON array of strings (exec form), or null when `rest` is not one (shell form). */
function jsonForm(line: number, rest: string): string[] | null {
  if (!rest.startsWith("[")) return null;
  let v: unknown;
  try {
    v = JSON.parse(rest);
  } catch {
    return null; // Docker too takes a malformed array as shell form
  }
  if (!Array.isArray(v) || !v.every((x): x is string => typeof x === "string")) {
    throw syntaxError(line, "the exec (JSON) form must be an array of strings");
  }
  return v;
}

const HEREDOC_RE = /(^|[^<])<<-?\s*(["']?)[A-Za-z_][A-Za-z0-9_]*\2/;

function command(line: number, op: string, rest: string): CommandForm {
  const exec = jsonForm(line, rest);
  if (exec) {
    if (exec.length === 0) throw syntaxError(line, `${op.toUpperCase()} has an empty command`);
    return { exec };
  }
  if (rest === "") throw syntaxError(line, `${op.toUpperCase()} needs a command`);
  return { shell: rest };
}

function instruction(l: LogicalLine): { keyword: string; rest: string } {
  const m = /^(\S+)\s*([\s\S]*)$/.exec(l.text);
  return { keyword: (m?.[1] ?? "").toLowerCase(), rest: (m?.[2] ?? "").trim() };
}

export function parseDockerfile(text: string): Dockerfile {
  const { escape, lines } = logicalLines(text);
  const preArgs: Dockerfile["preArgs"] = [];
  let from: Dockerfile["from"] | null = null;
  const instructions: Instruction[] = [];
  for (const l of lines) {
    const { keyword, rest } = instruction(l);
    const line = l.line;
    if (!/^[a-z]+$/.test(keyword)) throw syntaxError(line, `not an instruction: ${JSON.stringify(keyword)}`);
    if (keyword === "from") {
      if (from) throw syntaxError(line, "a second FROM: multi-stage builds are not supported");
      const { flags, rest: r } = takeFlags(line, rest);
      const platform = flags.get("platform");
      flags.delete("platform");
      refuseFlags(line, keyword, flags, []);
      if (platform !== undefined && platform !== "linux/amd64") {
        throw syntaxError(line, `FROM --platform=${platform}: only linux/amd64 is supported`);
      }
      if (r === "") throw syntaxError(line, "FROM needs an image");
      from = { line, raw: r };
      continue;
    }
    if (!from) {
      if (keyword === "arg") {
        if (rest === "") throw syntaxError(line, "ARG needs a name");
        preArgs.push({ line, raw: rest });
        continue;
      }
      throw syntaxError(line, `${keyword.toUpperCase()} before FROM (only ARG may come before FROM)`);
    }
    switch (keyword) {
      case "run": {
        const { flags, rest: r } = takeFlags(line, rest);
        refuseFlags(line, keyword, flags, []);
        if (!r.startsWith("[") && HEREDOC_RE.test(r)) {
          throw syntaxError(line, "heredocs (<<EOF) are not supported: put the script in a file and COPY it");
        }
        instructions.push({ op: "run", line, command: command(line, keyword, r) });
        break;
      }
      case "cmd":
      case "entrypoint":
        instructions.push({ op: keyword, line, command: command(line, keyword, rest) });
        break;
      case "copy":
      case "add": {
        const { flags, rest: r } = takeFlags(line, rest);
        refuseFlags(line, keyword, flags, ["chown", "chmod"]);
        if (HEREDOC_RE.test(r))
          throw syntaxError(line, `heredocs (<<EOF) in ${keyword.toUpperCase()} are not supported`);
        const json = jsonForm(line, r);
        instructions.push({
          op: keyword,
          line,
          chown: flags.get("chown") ?? null,
          chmod: flags.get("chmod") ?? null,
          args: json ? { json } : { text: r },
        });
        break;
      }
      case "env":
      case "label":
      case "arg":
      case "workdir":
      case "user":
        if (rest === "") throw syntaxError(line, `${keyword.toUpperCase()} needs an argument`);
        instructions.push({ op: keyword, line, raw: rest });
        break;
      default:
        if (KNOWN_UNSUPPORTED.has(keyword)) {
          throw syntaxError(line, `${keyword.toUpperCase()} is not supported by forkd's Dockerfile builder`);
        }
        throw syntaxError(line, `unknown instruction ${keyword.toUpperCase()}`);
    }
  }
  if (!from) throw new ForkdError("invalid_argument", "the Dockerfile has no FROM instruction");
  return { escape, preArgs, from, instructions };
}
