/**
 * A parsed Dockerfile made concrete: variables expanded where Docker expands them (FROM with the
 * ARGs before it; COPY, ADD, ENV, ARG, LABEL, WORKDIR, USER with the base image's Env, the ENVs
 * and the ARGs so far; never inside RUN, CMD or ENTRYPOINT, whose shell does that), WORKDIR made
 * absolute, and the steps that change files (RUN, COPY, ADD) each with the environment, working
 * directory and user they run with. What is left at the end is the image's config.
 * Bounded: a word is at most words.ts's WORD_LIMIT, and the ENV, ARG and LABEL keys and values
 * held at once at most VARS_LIMIT bytes (the bound forkd-files.ts puts on an image's Env).
 */
import { posix } from "node:path";
import type { ImageConfig } from "../../oci/index.js";
import { ForkdError } from "../../util/index.js";
import { syntaxError } from "./lines.js";
import type { ArgsForm, CommandForm, Dockerfile } from "./parse.js";
import { WordError, word, words } from "./words.js";

/** The image config a step runs under and the build leaves: a pulled image's (src/oci). */
export type { ImageConfig };

export const EMPTY_CONFIG: ImageConfig = {
  env: [],
  workingDir: null,
  user: null,
  entrypoint: null,
  cmd: null,
  labels: {},
};

export type PlanStep =
  | {
      kind: "run";
      line: number;
      command: CommandForm;
      env: Record<string, string>;
      cwd: string;
      user: string | null;
    }
  | {
      kind: "copy";
      line: number;
      add: boolean;
      /** Context-relative source patterns, as written (after expansion). */
      sources: string[];
      /** Absolute destination; a trailing "/" means "into this directory". */
      dest: string;
      chown: string | null;
      /** Octal mode for every copied file and directory, or null: the context's modes. */
      chmod: number | null;
    };

export interface Plan {
  from: { ref: string; line: number };
  steps: PlanStep[];
  /** The config of the image the build makes (base config + ENV, WORKDIR, USER, ...). */
  config: ImageConfig;
}

/** Build arguments given by the caller (`--build-arg`). */
export type BuildArgs = Record<string, string>;

const NAME_RE = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** Bytes of ENV, ARG and LABEL keys and values a build holds at once (base image's included). */
export const VARS_LIMIT = 1 << 20;

/** The running size of the variables and labels, refused (naming the line) past VARS_LIMIT. */
class VarsBudget {
  private readonly sizes = new Map<string, number>();
  private total = 0;

  /** Records `kind` `key` now holding `value` (undefined: removed); throws past the limit. */
  set(line: number, kind: "ENV" | "ARG" | "LABEL", key: string, value: string | undefined): void {
    const id = `${kind}\0${key}`;
    const size = value === undefined ? 0 : Buffer.byteLength(key) + Buffer.byteLength(value) + 1;
    this.total += size - (this.sizes.get(id) ?? 0);
    this.sizes.set(id, size);
    if (line > 0 && this.total > VARS_LIMIT) {
      throw syntaxError(
        line,
        `${kind} ${key}: the ENV, ARG and LABEL values together exceed ${VARS_LIMIT} bytes`,
      );
    }
  }
}

function expand<T>(line: number, f: () => T): T {
  try {
    return f();
  } catch (e) {
    if (e instanceof WordError) throw syntaxError(line, e.message);
    throw e;
  }
}

/** `NAME[=default]` words of an ARG instruction. */
function argDecls(line: number, raw: string, vars: Map<string, string>, escape: string) {
  return expand(line, () => words(raw, vars, escape)).map((w) => {
    const eq = w.indexOf("=");
    const name = eq < 0 ? w : w.slice(0, eq);
    if (!NAME_RE.test(name)) throw syntaxError(line, `ARG: bad name ${JSON.stringify(name)}`);
    return { name, value: eq < 0 ? undefined : w.slice(eq + 1) };
  });
}

/** `k=v` pairs of ENV or LABEL (also the legacy `ENV key value with blanks`). */
function pairs(line: number, op: string, raw: string, vars: Map<string, string>, escape: string) {
  const first = /^(\S+)(\s+([\s\S]*))?$/.exec(raw);
  const head = first?.[1] ?? "";
  if (!head.includes("=")) {
    // Legacy form: one key, the rest of the line its value.
    const key = expand(line, () => word(head, vars, escape));
    const rest = first?.[3];
    if (rest === undefined) throw syntaxError(line, `${op} ${key} needs a value (${op} key=value)`);
    return [[key, expand(line, () => word(rest, vars, escape))] as const];
  }
  return expand(line, () => words(raw, vars, escape)).map((w) => {
    const eq = w.indexOf("=");
    if (eq <= 0) throw syntaxError(line, `${op}: ${JSON.stringify(w)} is not key=value`);
    return [w.slice(0, eq), w.slice(eq + 1)] as const;
  });
}

function argsOf(line: number, a: ArgsForm, vars: Map<string, string>, escape: string): string[] {
  if ("json" in a) return a.json.map((x) => expand(line, () => word(x, vars, escape)));
  return expand(line, () => words(a.text, vars, escape));
}

const asShell = (c: CommandForm): string[] => ("exec" in c ? c.exec : ["/bin/sh", "-c", c.shell]);

/** The FROM reference, expanded with the ARGs before it. */
export function fromRef(df: Dockerfile, buildArgs: BuildArgs = {}): { ref: string; line: number } {
  const vars = new Map<string, string>();
  const budget = new VarsBudget();
  for (const a of df.preArgs) {
    for (const d of argDecls(a.line, a.raw, vars, df.escape)) {
      const v = buildArgs[d.name] ?? d.value;
      if (v !== undefined) vars.set(d.name, v);
      budget.set(a.line, "ARG", d.name, vars.get(d.name));
    }
  }
  const w = expand(df.from.line, () => words(df.from.raw, vars, df.escape));
  const [ref, as, name, ...more] = w;
  if (ref === undefined || ref === "") throw syntaxError(df.from.line, "FROM needs an image");
  if (as !== undefined && (as.toLowerCase() !== "as" || name === undefined || more.length > 0)) {
    throw syntaxError(df.from.line, "FROM takes an image and an optional `AS name`");
  }
  return { ref, line: df.from.line };
}

function envMap(env: string[]): Map<string, string> {
  const m = new Map<string, string>();
  for (const e of env) {
    const eq = e.indexOf("=");
    if (eq > 0) m.set(e.slice(0, eq), e.slice(eq + 1));
  }
  return m;
}

export function plan(df: Dockerfile, base: ImageConfig, buildArgs: BuildArgs = {}): Plan {
  const from = fromRef(df, buildArgs);
  const preArgs = new Map<string, string>();
  for (const a of df.preArgs) {
    for (const d of argDecls(a.line, a.raw, preArgs, df.escape)) {
      const v = buildArgs[d.name] ?? d.value;
      if (v !== undefined) preArgs.set(d.name, v);
    }
  }
  const env = envMap(base.env);
  const args = new Map<string, string>();
  const labels: Record<string, string> = { ...base.labels };
  let workdir = base.workingDir;
  let user = base.user;
  let cmd = base.cmd;
  let entrypoint = base.entrypoint;
  const steps: PlanStep[] = [];
  const budget = new VarsBudget();
  for (const [k, v] of env) budget.set(0, "ENV", k, v);
  for (const [k, v] of Object.entries(labels)) budget.set(0, "LABEL", k, v);
  // ENV wins over ARG of the same name, for expansion and for RUN's environment.
  const vars = () => new Map([...args, ...env]);
  for (const ins of df.instructions) {
    const line = ins.line;
    switch (ins.op) {
      case "arg":
        for (const d of argDecls(line, ins.raw, vars(), df.escape)) {
          const v = buildArgs[d.name] ?? d.value ?? preArgs.get(d.name);
          if (v !== undefined) args.set(d.name, v);
          else args.delete(d.name);
          budget.set(line, "ARG", d.name, v);
        }
        break;
      case "env":
        for (const [k, v] of pairs(line, "ENV", ins.raw, vars(), df.escape)) {
          env.set(k, v);
          budget.set(line, "ENV", k, v);
        }
        break;
      case "label":
        for (const [k, v] of pairs(line, "LABEL", ins.raw, vars(), df.escape)) {
          labels[k] = v;
          budget.set(line, "LABEL", k, v);
        }
        break;
      case "workdir": {
        const w = expand(line, () => word(ins.raw, vars(), df.escape));
        if (w === "") throw syntaxError(line, "WORKDIR is empty");
        workdir = posix.normalize(posix.isAbsolute(w) ? w : posix.join(workdir ?? "/", w));
        break;
      }
      case "user": {
        const u = expand(line, () => word(ins.raw, vars(), df.escape));
        if (!/^[A-Za-z0-9_.][A-Za-z0-9_.-]*(:[A-Za-z0-9_.][A-Za-z0-9_.-]*)?$/.test(u)) {
          throw syntaxError(line, `USER ${JSON.stringify(u)}: not a user[:group]`);
        }
        user = u;
        break;
      }
      case "cmd":
        cmd = asShell(ins.command);
        break;
      case "entrypoint":
        entrypoint = asShell(ins.command);
        // Docker: a new ENTRYPOINT clears an inherited CMD.
        if (cmd === base.cmd) cmd = null;
        break;
      case "run":
        steps.push({
          kind: "run",
          line,
          command: ins.command,
          env: Object.fromEntries(vars()),
          cwd: workdir ?? "/",
          user,
        });
        break;
      case "copy":
      case "add": {
        const a = argsOf(line, ins.args, vars(), df.escape);
        if (a.length < 2) throw syntaxError(line, `${ins.op.toUpperCase()} needs a source and a destination`);
        const sources = a.slice(0, -1);
        const destRaw = a[a.length - 1] ?? "";
        for (const s of sources) {
          if (/^[a-zA-Z][a-zA-Z0-9+.-]*:\/\//.test(s) || s.startsWith("git@")) {
            throw syntaxError(
              line,
              `${ins.op.toUpperCase()} ${s}: URLs are not supported (forkd never fetches them)`,
            );
          }
        }
        const slash = destRaw.endsWith("/") || destRaw === "." || destRaw.endsWith("/.");
        let dest = posix.normalize(posix.isAbsolute(destRaw) ? destRaw : posix.join(workdir ?? "/", destRaw));
        if (slash && !dest.endsWith("/")) dest += "/";
        let chmod: number | null = null;
        if (ins.chmod !== null) {
          if (!/^[0-7]{3,4}$/.test(ins.chmod))
            throw syntaxError(line, `--chmod=${ins.chmod}: an octal mode, e.g. 0755`);
          chmod = parseInt(ins.chmod, 8);
        }
        const chown =
          ins.chown === null ? null : expand(line, () => word(ins.chown ?? "", vars(), df.escape));
        if (chown !== null && !/^[A-Za-z0-9_.][A-Za-z0-9_.-]*(:[A-Za-z0-9_.][A-Za-z0-9_.-]*)?$/.test(chown)) {
          throw syntaxError(line, `--chown=${chown}: not a user[:group]`);
        }
        steps.push({ kind: "copy", line, add: ins.op === "add", sources, dest, chown, chmod });
        break;
      }
    }
  }
  if (steps.length > 200) throw new ForkdError("invalid_argument", "more than 200 RUN/COPY/ADD steps");
  return {
    from,
    steps,
    config: {
      env: [...env].map(([k, v]) => `${k}=${v}`),
      workingDir: workdir,
      user,
      entrypoint,
      cmd,
      labels,
    },
  };
}
