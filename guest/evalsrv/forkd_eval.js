/*
 * forkd warm JavaScript kernel (runs inside the guest, driven by forkd-agent): the twin of
 * forkd_eval.py. See docs/kernels.md for the semantics and what differs from Python.
 *
 * Protocol on stdin/stdout (docs/agent-protocol.md, "Agent to interpreter"):
 *   request = u32 BE length, u32 BE id, UTF-8 code
 *   reply   = u32 BE length, u32 BE id, UTF-8 JSON (the keys forkd_eval.py answers with)
 * Id 0 with empty code reseeds the generators we own (Math.random is replaced by one of ours,
 * seeded from /dev/urandom: V8's own cannot be reseeded). A request whose code starts with a NUL
 * byte carries options first (one line of JSON, then a newline, then the code), and a streamed
 * cell's output frames have a body of 0x01, "o" or "e", then the bytes: as in forkd_eval.py.
 *
 * Contexts: the default one is Node's main realm (below); every other context is a realm of its
 * own (vm.createContext) given the main realm's console, process, Buffer, timers, require,
 * display and the like, so its globals are its own; each has its own execution count and cwd.
 *
 * Cells run notebook-style in Node's main realm (what `node`'s REPL uses: modules, Buffers and
 * errors share one set of built-ins with cell code). acorn parses each cell; top-level
 * declarations (let/const/var/function/class/import) become properties of the global object, so
 * they persist and can be declared again by a later cell; the cell runs as an async function, so
 * top-level await works; if the last statement is an expression, util.inspect() of its value is
 * the value and its rich forms (_repr_html_() ... methods, as in Python) are "value_data".
 * console.* and process.stdout/stderr writes are captured. SIGINT (the agent's timeout) breaks
 * a cell's synchronous part (vm breakOnSigint) and abandons a cell that is awaiting.
 *
 * The protocol uses private descriptors opened from /proc/self/fd/0 and /1; fds 0 and 1
 * themselves are then reopened on /dev/null, so cell code and its child processes cannot corrupt
 * the frame stream (Node has no dup2: close(n) then open() takes the lowest free number, checked).
 *
 * The file uses no import/require statements (only import()), so it runs whether Node treats it
 * as CommonJS (no package.json, as in /.forkd/) or as an ES module (a "type": "module" scope).
 */
"use strict";

const OUT_CAP = 256 * 1024; // bytes of stdout/stderr kept per cell
const TEXT_CAP = 256 * 1024; // characters of value/error kept
const REPLY_MAX = 1000 * 1000; // encoded JSON bound (the agent's frame limit is 1 MiB)
const MIME_CAP = 512 * 1024; // characters of one rich output kept (larger ones are dropped)
const DISPLAY_MAX = 32; // rich outputs kept per cell
const REQUEST_MAX = 64 * 1024 * 1024; // a longer request is a broken stream
const CONTEXTS_MAX = 32; // contexts besides the default one
const STREAM_CAP = 4 * 1024 * 1024; // bytes of stdout/stderr streamed per cell and stream
const STREAM_CHUNK = 32 * 1024; // a pending chunk this big is sent at once
const STREAM_DELAY_MS = 50; // output may wait this long to be sent with more
// what a context's realm is given of the main realm
const REALM_GLOBALS = [
  "console", "process", "Buffer", "setTimeout", "clearTimeout", "setInterval", "clearInterval",
  "setImmediate", "clearImmediate", "queueMicrotask", "structuredClone", "URL", "URLSearchParams",
  "TextEncoder", "TextDecoder", "AbortController", "AbortSignal", "atob", "btoa", "fetch",
  "performance", "crypto", "EventTarget", "Event", "Blob", "Headers", "Request", "Response",
  "FormData",
];
const REPRS = [
  ["text/html", "_repr_html_"],
  ["text/markdown", "_repr_markdown_"],
  ["image/svg+xml", "_repr_svg_"],
  ["image/png", "_repr_png_"],
  ["image/jpeg", "_repr_jpeg_"],
  ["text/latex", "_repr_latex_"],
  ["application/json", "_repr_json_"],
];
const WRAP_HEAD = "(async () => {\n"; // on its own line: lineOffset -1 keeps user line numbers
// cell code runs in this realm: our own references to the globals it might reuse as names
const BufferG = globalThis.Buffer;
const PromiseG = globalThis.Promise;
const setTimeoutG = globalThis.setTimeout;
const clearTimeoutG = globalThis.clearTimeout;
const nowG = Date.now;
const { stringify } = JSON;

async function main() {
  const [fs, vm, util, path, url, nodeModule, net] = await Promise.all(
    ["fs", "vm", "util", "path", "url", "module", "net"].map((m) => import("node:" + m)),
  );
  // cell code runs in this realm: keep our own references to what it might overwrite
  const proc = globalThis.process;
  const realExit = proc.exit.bind(proc);
  const BufferC = BufferG;
  const setImmediateF = globalThis.setImmediate;
  const inspect = (v) => util.inspect(v);

  const self = fs.realpathSync(proc.argv[1]);
  const selfUrl = url.pathToFileURL(self).href;
  const acorn = loadAcorn(fs, vm, path.dirname(self));
  const fds = privateFds(fs);
  const kernel = new Kernel({ fs, vm, util, path, url, nodeModule, acorn, self, selfUrl });
  kernel.install({ proc, realExit, BufferC, inspect, setImmediateF, stringify });
  uncachedCrypto((await import("node:crypto")).default, nodeModule);
  serve(kernel, fds, { fs, net, proc, realExit, BufferC, setImmediateF });
}

/** acorn's UMD build, from our folder (/.forkd/acorn.js) or the repository's vendor/ folder. */
function loadAcorn(fs, vm, dir) {
  for (const p of [dir + "/acorn.js", dir + "/vendor/acorn.js"]) {
    let src;
    try {
      src = fs.readFileSync(p, "utf8");
    } catch {
      continue;
    }
    // evaluated as a CommonJS body whatever Node thinks the file is
    const fn = vm.runInThisContext("(function (exports, module) {" + src + "\n})", { filename: p });
    const mod = { exports: {} };
    fn.call(mod.exports, mod.exports, mod);
    return mod.exports;
  }
  return null;
}

/** Private protocol fds; 0 and 1 reopened on /dev/null (stderr stays for crash reports). */
function privateFds(fs) {
  let inFd, outFd;
  try {
    inFd = fs.openSync("/proc/self/fd/0", fs.constants.O_RDONLY | fs.constants.O_CLOEXEC);
    outFd = fs.openSync("/proc/self/fd/1", fs.constants.O_WRONLY | fs.constants.O_CLOEXEC);
  } catch {
    // not pipes (e.g. sockets cannot be reopened), or no /proc: speak on 0 and 1 themselves
    if (inFd !== undefined) fs.closeSync(inFd);
    return { inFd: 0, outFd: 1, private: false };
  }
  for (const [fd, flags] of [
    [0, fs.constants.O_RDONLY],
    [1, fs.constants.O_WRONLY],
  ]) {
    fs.closeSync(fd);
    const got = fs.openSync("/dev/null", flags);
    if (got !== fd) {
      // another thread took the number first: leave fd closed rather than misplaced
      fs.closeSync(got);
      globalThis.process.stderr.write(`forkd_eval.js: fd ${fd} not reopened on /dev/null\n`);
    }
  }
  return { inFd, outFd, private: true };
}

/** A byte sink that silently stops growing at OUT_CAP bytes. */
class Capped {
  constructor() {
    this.chunks = [];
    this.size = 0;
    this.truncated = false;
  }
  write(buf) {
    const room = OUT_CAP - this.size;
    if (buf.length > room) {
      this.truncated = true;
      buf = buf.subarray(0, Math.max(room, 0));
    }
    if (buf.length) {
      this.chunks.push(BufferG.from(buf));
      this.size += buf.length;
    }
  }
  text() {
    const t = BufferG.concat(this.chunks).toString("utf8"); // invalid UTF-8 becomes U+FFFD
    return this.truncated ? t + "\n[output truncated]\n" : t;
  }
}

/** A streamed cell's stdout or stderr: sent as output frames while it runs (see the header). */
class Streamed {
  constructor(emit, tag) {
    this.emit = emit; // (body) => void, writes one frame with the cell's id
    this.tag = tag;
    this.pending = [];
    this.size = 0;
    this.sent = 0;
    this.since = 0;
    this.timer = null;
    this.truncated = false;
    this.ended = false;
  }
  write(buf) {
    if (this.ended) return; // a timer or promise writing after its cell ended: dropped
    const room = STREAM_CAP - this.sent - this.size;
    if (buf.length > room) {
      if (this.truncated) return;
      this.truncated = true;
      buf = BufferG.concat([
        BufferG.from(BufferG.from(buf.subarray(0, Math.max(room, 0))).toString("utf8").replace(/\ufffd$/, "")),
        BufferG.from("\n[output truncated]\n"),
      ]);
    }
    if (!buf.length) return;
    if (!this.size) this.since = nowG();
    this.pending.push(BufferG.from(buf));
    this.size += buf.length;
    if (this.size >= STREAM_CHUNK || nowG() - this.since >= STREAM_DELAY_MS) this.send();
    else if (!this.timer) this.timer = setTimeoutG(() => this.send(), STREAM_DELAY_MS);
  }
  send() {
    if (this.timer) clearTimeoutG(this.timer);
    this.timer = null;
    if (this.ended || !this.size) return;
    let data = BufferG.concat(this.pending);
    this.pending = [];
    this.sent += this.size;
    this.size = 0;
    while (data.length) {
      // frames of at most STREAM_CHUNK bytes, cut between UTF-8 sequences
      let cut = Math.min(data.length, STREAM_CHUNK);
      while (cut > STREAM_CHUNK - 4 && cut < data.length && (data[cut] & 0xc0) === 0x80) cut--;
      this.emit(BufferG.concat([BufferG.from([1, this.tag.charCodeAt(0)]), data.subarray(0, cut)]));
      data = data.subarray(cut);
    }
  }
  /** Sends what is pending; nothing is sent after (the reply follows). */
  text() {
    this.send();
    this.ended = true;
    return "";
  }
}

/** 16 hex digits from /dev/urandom. */
function randomId(fs) {
  const b = BufferG.alloc(8);
  const fd = fs.openSync("/dev/urandom", "r");
  try {
    fs.readSync(fd, b, 0, 8, null);
  } finally {
    fs.closeSync(fd);
  }
  return b.toString("hex");
}

function opError(kind, message) {
  return { ok: false, context_error: kind, error: { name: "ContextError", value: message, traceback: "" } };
}

function cap(text, limit = TEXT_CAP) {
  return text.length <= limit ? text : text.slice(0, limit) + "...[truncated]";
}

function emptyResult() {
  return {
    ok: true,
    value: null,
    value_data: null,
    display: [],
    stdout: "",
    stderr: "",
    error: null,
  };
}

/** xoshiro128** seeded from /dev/urandom: the Math.random that forks can reseed. */
function makeRandom(fs) {
  const s = new Uint32Array(4);
  const rotl = (x, k) => (x << k) | (x >>> (32 - k));
  const next = () => {
    const r = Math.imul(rotl(Math.imul(s[1], 5), 7), 9);
    const t = s[1] << 9;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 11);
    return r >>> 0;
  };
  const seed = () => {
    const fd = fs.openSync("/dev/urandom", "r");
    try {
      fs.readSync(fd, new Uint8Array(s.buffer), 0, 16, null);
    } finally {
      fs.closeSync(fd);
    }
    if ((s[0] | s[1] | s[2] | s[3]) === 0) s[0] = 1;
  };
  // 53 random bits, as V8's own Math.random gives
  const random = function random() {
    return ((next() >>> 5) * 67108864 + (next() >>> 6)) / 9007199254740992;
  };
  return { seed, random };
}

class Kernel {
  constructor(deps) {
    Object.assign(this, deps);
    this.serial = 0; // cells run, all contexts: their file names
    this.contexts = new Map(); // id -> { id, cwd, count, realm (null: the main realm) }
    this.cell = null; // the running cell: { out, err, interrupt }
    this.bg = { out: new Capped(), err: new Capped() }; // output between cells: the next cell's
    this.shown = [];
    this.wrapLines = new Map(); // cell number -> the line of its wrapper's call (recent cells)
    this.rng = makeRandom(deps.fs);
  }

  install({ proc, realExit, BufferC, inspect, setImmediateF, stringify }) {
    Object.assign(this, { proc, realExit, BufferC, inspect, setImmediateF, stringify });
    this.contexts.set("default", { id: "default", cwd: proc.cwd(), count: 0, realm: null });
    this.rng.seed();
    Object.defineProperty(Math, "random", {
      value: this.rng.random,
      writable: true,
      configurable: true,
      enumerable: false,
    });
    const sink = (which) =>
      function write(chunk, encoding, cb) {
        if (typeof encoding === "function") [cb, encoding] = [encoding, undefined];
        let buf;
        try {
          buf =
            typeof chunk === "string"
              ? BufferC.from(chunk, BufferC.isEncoding(encoding) ? encoding : "utf8")
              : BufferC.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
        } catch {
          buf = BufferC.from(String(chunk));
        }
        kernel.target()[which].write(buf);
        if (typeof cb === "function") proc.nextTick(cb);
        return true;
      };
    const kernel = this;
    // console.* writes through these too (the global console looks stream.write up per call)
    proc.stdout.write = sink("out");
    proc.stderr.write = sink("err");
    proc.on("SIGINT", () => this.cell?.interrupt());
    proc.on("uncaughtException", (e) => this.report("Uncaught ", e));
    proc.on("unhandledRejection", (e) => this.report("Uncaught (in promise) ", e));
    proc.exit = function exit(code) {
      // like Python's SystemExit in a notebook: the cell fails, the kernel stays
      const e = new Error(String(code ?? proc.exitCode ?? 0));
      e.name = "ProcessExit";
      throw e;
    };
    const hidden = (name, value) =>
      Object.defineProperty(globalThis, name, {
        value,
        writable: true,
        configurable: true,
        enumerable: false,
      });
    hidden("display", (...objs) => this.display(objs));
    hidden("require", this.nodeModule.createRequire(this.path.join(proc.cwd(), "[cell]")));
    hidden("__forkd", Object.freeze({ import: (spec, opts) => this.importModule(spec, opts) }));
    this.baseGlobals = new Set(Object.keys(globalThis));
  }

  /** A realm for a new context: its own globals, the main realm's I/O and helpers. */
  newRealm() {
    const g = {};
    for (const name of REALM_GLOBALS) if (name in globalThis) g[name] = globalThis[name];
    for (const name of ["display", "require", "__forkd"]) g[name] = globalThis[name];
    const realm = this.vm.createContext(g);
    Object.defineProperty(this.vm.runInContext("Math", realm), "random", {
      value: this.rng.random,
      writable: true,
      configurable: true,
      enumerable: false,
    });
    return realm;
  }

  /** A context operation: create, list, delete, restart. */
  op(opts) {
    const view = (c) => ({ id: c.id, cwd: c.cwd });
    if (opts.op === "list") return { ok: true, contexts: [...this.contexts.values()].map(view) };
    if (opts.op === "create") {
      if (this.contexts.size > CONTEXTS_MAX) return opError("limit", `at most ${CONTEXTS_MAX} contexts per kernel`);
      const cwd = opts.cwd || this.contexts.get("default").cwd;
      let isDir = false;
      try {
        isDir = typeof cwd === "string" && this.fs.statSync(cwd).isDirectory();
      } catch {
        /* not a directory */
      }
      if (!isDir) return opError("invalid", `cwd ${stringify(cwd)} is not a directory`);
      const id = randomId(this.fs);
      const c = { id, cwd: this.path.resolve(cwd), count: 0, realm: this.newRealm() };
      this.contexts.set(id, c);
      return { ok: true, context: view(c) };
    }
    const c = typeof opts.context === "string" ? this.contexts.get(opts.context) : undefined;
    if (!c) return opError("not_found", `no context ${stringify(opts.context)}`);
    if (opts.op === "delete") {
      if (c.id === "default") return opError("invalid", "the default context cannot be deleted");
      this.contexts.delete(c.id);
      return { ok: true, context: view(c) };
    }
    if (opts.op === "restart") {
      if (c.id === "default") {
        // the main realm cannot be replaced: what cells declared is removed from it
        for (const k of Object.keys(globalThis)) if (!this.baseGlobals.has(k)) delete globalThis[k];
      } else c.realm = this.newRealm();
      c.count = 0;
      return { ok: true, context: view(c) };
    }
    return opError("invalid", `unknown op ${stringify(opts.op)}`);
  }

  target() {
    return this.cell ?? this.bg;
  }

  report(prefix, e) {
    const text = prefix + this.describe(e).traceback + "\n";
    this.target().err.write(this.BufferC.from(text));
  }

  display(objs) {
    for (const obj of objs) {
      if (!this.cell || this.shown.length >= DISPLAY_MAX) return;
      const data = this.mimeBundle(obj);
      if (!("text/plain" in data)) data["text/plain"] = cap(this.safeInspect(obj));
      this.shown.push(data);
    }
  }

  safeInspect(v) {
    try {
      return this.inspect(v);
    } catch (e) {
      return `<unprintable ${typeof v}: ${String(e && e.message)}>`;
    }
  }

  /** The rich forms of obj (never throws: a broken _repr_ is skipped). */
  mimeBundle(obj) {
    const data = {};
    if (obj === null || (typeof obj !== "object" && typeof obj !== "function")) return data;
    for (const [mime, attr] of REPRS) {
      let out;
      try {
        const method = obj[attr];
        if (typeof method !== "function") continue;
        out = method.call(obj);
      } catch {
        continue;
      }
      if (out === null || out === undefined) continue;
      if (out instanceof Uint8Array) {
        out = this.BufferC.from(out.buffer, out.byteOffset, out.byteLength).toString("base64");
      } else if (mime === "application/json") {
        try {
          if (this.stringify(out) === undefined) continue;
        } catch {
          continue;
        }
      } else if (typeof out !== "string") {
        continue;
      }
      if (typeof out !== "string" || out.length <= MIME_CAP) data[mime] = out;
    }
    return data;
  }

  /** import() for cells: builtins, paths and packages resolved from the cwd. */
  async importModule(spec, opts) {
    spec = String(spec);
    const { path, url, nodeModule, proc } = this;
    let target = spec;
    if (spec.startsWith("./") || spec.startsWith("../") || spec.startsWith("/")) {
      target = url.pathToFileURL(path.resolve(proc.cwd(), spec)).href;
    } else if (!spec.startsWith("node:") && !nodeModule.builtinModules.includes(spec)) {
      try {
        const req = nodeModule.createRequire(path.join(proc.cwd(), "[cell]"));
        target = url.pathToFileURL(req.resolve(spec)).href;
      } catch {
        /* ESM-only packages and URLs: let import() itself try */
      }
    }
    return opts === undefined ? import(target) : import(target, opts);
  }

  /** Rewrites a cell (see the header); returns the script's source, or throws SyntaxError. */
  transform(code) {
    const { acorn } = this;
    if (/^\s*\{/.test(code) && /\}\s*$/.test(code)) {
      // `{a: 1}` is an object, not a block (as in node's REPL)
      try {
        const alt = "(" + code + "\n)";
        const p = this.parse(alt);
        if (p.body.length === 1 && p.body[0].type === "ExpressionStatement") code = alt;
      } catch {
        /* a block after all */
      }
    }
    if (code.startsWith("#!")) code = "//" + code.slice(2);
    const prog = this.parse(code);
    const edits = []; // [start, end, text]
    const ins = (at, text) => edits.push([at, at, text]);
    const endStmt = (node) => {
      if (code[node.end - 1] !== ";") ins(node.end, ";");
    };
    const lines = (a, b) => "\n".repeat((code.slice(a, b).match(/\n/g) || []).length);
    walk(prog, (node) => {
      if (node.type === "ImportExpression") edits.push([node.start, node.start + 6, "__forkd.import"]);
    });
    const body = prog.body;
    for (let i = 0; i < body.length; i++) {
      let node = body[i];
      if (node.type === "ExportNamedDeclaration" && node.declaration) {
        edits.push([node.start, node.declaration.start, ""]);
        node = node.declaration;
      } else if (node.type.startsWith("Export")) {
        throw cellSyntaxError("a cell cannot export (only `export` + a declaration is accepted)", code, node.start);
      }
      if (node.type === "VariableDeclaration" && ["var", "let", "const"].includes(node.kind)) {
        edits.push([node.start, node.declarations[0].start, ";"]);
        for (const d of node.declarations) {
          ins(d.start, "(");
          if (d.init) ins(d.end, ")");
          else if (node.kind === "var") {
            const n = d.id.name;
            ins(d.end, ` = typeof ${n} === "undefined" ? undefined : ${n})`);
          } else ins(d.end, " = undefined)");
        }
        endStmt(node);
      } else if (
        (node.type === "FunctionDeclaration" || node.type === "ClassDeclaration") &&
        node.id
      ) {
        ins(node.start, `;${node.id.name} = `);
        ins(node.end, ";");
      } else if (node.type === "ImportDeclaration") {
        const spec = stringify(node.source.value);
        const parts = node.specifiers.map((s) => {
          const local = s.local.name;
          if (s.type === "ImportDefaultSpecifier") return `${local} = __forkdModule.default;`;
          if (s.type === "ImportNamespaceSpecifier") return `${local} = __forkdModule;`;
          const imported = s.imported.type === "Identifier" ? s.imported.name : s.imported.value;
          return `${local} = __forkdModule[${stringify(imported)}];`;
        });
        const attrs = (node.attributes || []).map((x) => {
          const key = x.key.type === "Identifier" ? x.key.name : x.key.value;
          return `${stringify(key)}: ${stringify(x.value.value)}`;
        });
        const opts = attrs.length ? `, { with: { ${attrs.join(", ")} } }` : "";
        const text = `;{ const __forkdModule = await __forkd.import(${spec}${opts}); ${parts.join(" ")} }`;
        edits.push([node.start, node.end, text + lines(node.start, node.end)]);
      } else if (i === body.length - 1 && node.type === "ExpressionStatement") {
        ins(node.start, ";return { v: (");
        ins(code[node.end - 1] === ";" ? node.end - 1 : node.end, "\n) }");
      }
    }
    // apply from the end; at one position, inserts keep their order
    edits.sort((a, b) => b[0] - a[0] || b[1] - a[1]);
    let out = code;
    const byPos = new Map();
    for (const e of edits) {
      const k = e[0] + ":" + e[1];
      byPos.set(k, (byPos.get(k) || []).concat([e]));
    }
    for (const group of byPos.values()) {
      const [start, end] = group[0];
      out = out.slice(0, start) + group.map((e) => e[2]).join("") + out.slice(end);
    }
    return WRAP_HEAD + out + "\n})()";
  }

  parse(code) {
    const base = { ecmaVersion: "latest", allowAwaitOutsideFunction: true, allowHashBang: true };
    try {
      return this.acorn.parse(code, { ...base, sourceType: "script" });
    } catch (e) {
      try {
        // import declarations need module mode (which is strict; sloppy code parsed as a script)
        return this.acorn.parse(code, { ...base, sourceType: "module" });
      } catch {
        throw e;
      }
    }
  }

  async run(code, opts, emit) {
    opts = opts || {};
    const ctx = this.contexts.get(typeof opts.context === "string" && opts.context ? opts.context : "default");
    if (!ctx) return opError("not_found", `no context ${stringify(opts.context)}`);
    const n = ++this.serial;
    const name = `<cell ${n}>`;
    ctx.count++;
    const result = { ...emptyResult(), context: ctx.id, execution_count: ctx.count };
    const env = opts.env && typeof opts.env === "object" ? opts.env : {};
    const savedEnv = {};
    for (const [k, v] of Object.entries(env)) {
      if (k.includes("=") || k.includes("\0") || String(v).includes("\0")) continue;
      savedEnv[k] = Object.prototype.hasOwnProperty.call(this.proc.env, k) ? this.proc.env[k] : undefined;
      this.proc.env[k] = String(v);
    }
    let interrupt;
    let wasInterrupted = false;
    const interrupted = new PromiseG((_, reject) => {
      interrupt = () => {
        wasInterrupted = true;
        reject(interruptedError());
      };
    });
    interrupted.catch(() => {});
    if (opts.stream && emit) {
      const out = new Streamed(emit, "o");
      const err = new Streamed(emit, "e");
      for (const c of this.bg.out.chunks) out.write(c);
      for (const c of this.bg.err.chunks) err.write(c);
      this.cell = { out, err, interrupt };
    } else {
      this.cell = { out: this.bg.out, err: this.bg.err, interrupt };
    }
    this.bg = { out: new Capped(), err: new Capped() };
    try {
      this.proc.chdir(ctx.cwd);
    } catch (e) {
      this.cell.err.write(this.BufferC.from(`[forkd: cannot enter the context's cwd ${ctx.cwd}: ${e.message}]\n`));
    }
    this.shown = [];
    let wrapLine = -1;
    try {
      let src;
      if (this.acorn) {
        try {
          src = this.transform(code);
        } catch (e) {
          if (e instanceof SyntaxError && e.loc) throw cellSyntaxError(e.message, code, e.pos, e.loc);
          throw e;
        }
        wrapLine = src.split("\n").length - 1; // the `})()` line, numbered from lineOffset -1
      } else {
        this.cell.err.write(this.BufferC.from("[forkd: acorn.js missing: the cell ran as a plain script]\n"));
        src = code; // its completion value is the value
      }
      this.wrapLines.set(n, wrapLine);
      if (this.wrapLines.size > 64) this.wrapLines.delete(this.wrapLines.keys().next().value);
      const script = new this.vm.Script(src, { filename: name, lineOffset: this.acorn ? -1 : 0 });
      // a SIGINT that came while the cell was parsed (slow under TCG) waits in the event loop:
      // take it now, or the cell would start and that interrupt be lost
      await new PromiseG((r) => this.setImmediateF(r));
      if (wasInterrupted) throw interruptedError();
      const runOpts = { breakOnSigint: true, displayErrors: false };
      const ret = ctx.realm ? script.runInContext(ctx.realm, runOpts) : script.runInThisContext(runOpts);
      const out = await PromiseG.race([this.acorn ? ret : { v: ret }, interrupted]);
      if (out && out.v !== undefined) {
        result.value = cap(this.safeInspect(out.v));
        const data = this.mimeBundle(out.v);
        result.value_data = Object.keys(data).length ? data : null;
      }
    } catch (e) {
      result.ok = false;
      result.error = this.describe(e);
    }
    // one turn of the loop: rejections the cell left unhandled are reported in its output
    await new PromiseG((r) => this.setImmediateF(r));
    const cell = this.cell;
    this.cell = null;
    for (const [k, v] of Object.entries(savedEnv)) {
      if (v === undefined) delete this.proc.env[k];
      else this.proc.env[k] = v;
    }
    try {
      ctx.cwd = this.proc.cwd();
    } catch {
      /* its cwd was removed: kept as it was */
    }
    result.display = this.shown.slice(0, DISPLAY_MAX);
    this.shown = [];
    result.stdout = cell.out.text();
    result.stderr = cell.err.text();
    return result;
  }

  /** {name, value, traceback} of anything thrown (never throws). */
  describe(e) {
    try {
      if (e && e.code === "ERR_SCRIPT_EXECUTION_INTERRUPTED") e = interruptedError();
      const isErr = this.util.types.isNativeError(e) || e instanceof Error;
      if (!isErr) {
        const shown = this.safeInspect(e);
        return { name: "Uncaught", value: cap(shown), traceback: cap("Uncaught " + shown) };
      }
      const name = typeof e.name === "string" ? e.name : (e.constructor && e.constructor.name) || "Error";
      let text = e.forkdTraceback || this.safeInspect(e);
      text = this.trimStack(text);
      return { name, value: cap(String(e.message ?? "")), traceback: cap(text) };
    } catch (fmt) {
      const t = `<unprintable error: ${String(fmt && fmt.message)}>`;
      return { name: "Error", value: t, traceback: t };
    }
  }

  /**
   * Drops this kernel's own frames from a stack text: in each run of "at" lines that reaches
   * cell code, what lies below the outermost cell frame (the kernel, Node's timers) and the
   * cell wrapper's own call.
   */
  trimStack(text) {
    const out = [];
    let run = [];
    const flush = () => {
      let last = -1;
      run.forEach((l, i) => {
        if (l.includes("<cell ")) last = i;
      });
      const keep = last >= 0 ? run.slice(0, last + 1) : run;
      const w = keep.length ? /<cell (\d+)>:(\d+):/.exec(keep[keep.length - 1]) : null;
      if (w && this.wrapLines.get(Number(w[1])) === Number(w[2])) keep.pop();
      for (const l of keep) {
        if (!l.includes(this.self) && !l.includes(this.selfUrl) && !l.includes("node:vm:")) out.push(l);
      }
      run = [];
    };
    for (const line of text.split("\n")) {
      if (/^\s+at /.test(line)) run.push(line);
      else {
        flush();
        out.push(line);
      }
    }
    flush();
    return out.join("\n");
  }
}

function interruptedError() {
  const e = new Error("cell interrupted (SIGINT: the eval timed out)");
  e.name = "Interrupted";
  e.forkdTraceback = "Interrupted: cell interrupted (SIGINT: the eval timed out)";
  return e;
}

/** A SyntaxError whose traceback shows the line and a caret, as node prints them. */
function cellSyntaxError(message, code, pos, loc) {
  const before = code.slice(0, pos);
  const line = loc ? loc.line : (before.match(/\n/g) || []).length + 1;
  const col = loc ? loc.column : pos - (before.lastIndexOf("\n") + 1);
  const text = code.split("\n")[line - 1] ?? "";
  const e = new SyntaxError(message);
  e.forkdTraceback = `line ${line}\n${text}\n${" ".repeat(col)}^\n\nSyntaxError: ${message}`;
  return e;
}

/** Calls fn on every node of an acorn AST. */
function walk(node, fn) {
  const stack = [node];
  while (stack.length) {
    const n = stack.pop();
    if (!n || typeof n.type !== "string") continue;
    fn(n);
    for (const k of Object.keys(n)) {
      const v = n[k];
      if (Array.isArray(v)) for (const x of v) stack.push(x);
      else if (v && typeof v === "object" && typeof v.type === "string") stack.push(v);
    }
  }
}

/** JSON-encode, shrinking the bulkiest fields until it fits the reply limit. */
function encode(result) {
  for (;;) {
    const data = BufferG.from(stringify(result), "utf8");
    if (data.length <= REPLY_MAX) return data;
    // rich outputs go first (last shown first), then the value's rich forms
    if (result.display && result.display.length) {
      result.display.pop();
      result.stderr = (result.stderr || "") + "[a rich output was dropped: reply too large]\n";
      continue;
    }
    if (result.value_data) {
      result.value_data = null;
      continue;
    }
    const key = ["stdout", "stderr", "value"].reduce((a, b) =>
      (result[b] || "").length > (result[a] || "").length ? b : a,
    );
    const text = result[key] || "";
    if (!text) {
      const err = result.error; // only the error can still be too big
      err.traceback = err.traceback.slice(0, Math.floor(err.traceback.length / 2));
      err.value = err.value.slice(0, Math.floor(err.value.length / 2));
      continue;
    }
    result[key] = text.slice(0, Math.floor(text.length / 2)) + "\n[truncated]\n";
  }
}

/** [code, options]: a payload starting with NUL carries a line of JSON options first. */
function parseRequest(payload) {
  if (payload[0] !== 0) return [payload.toString("utf8"), null];
  const nl = payload.indexOf(10);
  const head = payload.subarray(1, nl < 0 ? payload.length : nl).toString("utf8");
  const code = nl < 0 ? "" : payload.subarray(nl + 1).toString("utf8");
  let opts;
  try {
    opts = JSON.parse(head);
  } catch {
    opts = null;
  }
  if (!opts || typeof opts !== "object" || Array.isArray(opts)) opts = { op: "invalid" };
  return [code, opts];
}

/** The frame loop: one request at a time, in order. */
function serve(kernel, fds, { fs, net, proc, realExit, BufferC, setImmediateF }) {
  let buf = BufferC.alloc(0);
  const queue = [];
  let busy = false;
  const writeAll = (data) => {
    let off = 0;
    while (off < data.length) {
      try {
        off += fs.writeSync(fds.outFd, data, off, data.length - off);
      } catch (e) {
        if (e.code === "EAGAIN") {
          Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 5);
          continue;
        }
        realExit(0); // EPIPE: the agent is gone
      }
    }
  };
  const pump = async () => {
    if (busy) return;
    busy = true;
    while (queue.length) {
      const [id, code, opts] = queue.shift();
      let data;
      const emit = (body) => {
        const head = BufferC.alloc(8);
        head.writeUInt32BE(body.length + 4, 0);
        head.writeUInt32BE(id, 4);
        writeAll(BufferC.concat([head, body]));
      };
      try {
        let result;
        if (id === 0 && code === "" && !opts) {
          kernel.rng.seed();
          result = emptyResult();
        } else if (opts && "op" in opts) {
          result = kernel.op(opts);
        } else {
          result = await kernel.run(code, opts, emit);
        }
        data = encode(result);
      } catch (e) {
        // e.g. out of memory while encoding: answer anyway, keep serving
        data = encode({
          ...emptyResult(),
          ok: false,
          error: { name: "KernelError", value: cap(String(e && e.stack)), traceback: "" },
        });
      }
      const head = BufferC.alloc(8);
      head.writeUInt32BE(data.length + 4, 0);
      head.writeUInt32BE(id, 4);
      writeAll(BufferC.concat([head, data]));
    }
    busy = false;
  };
  const input = new net.Socket({ fd: fds.inFd, readable: true, writable: false });
  input.on("data", (chunk) => {
    buf = buf.length ? BufferC.concat([buf, chunk]) : chunk;
    while (buf.length >= 8) {
      const len = buf.readUInt32BE(0);
      if (len < 4 || len > REQUEST_MAX) realExit(2); // not our protocol
      if (buf.length < 4 + len) break;
      const id = buf.readUInt32BE(4);
      const [code, opts] = parseRequest(buf.subarray(8, 4 + len));
      buf = buf.subarray(4 + len);
      queue.push([id, code, opts]);
    }
    setImmediateF(() => void pump());
  });
  input.on("end", () => realExit(0)); // the agent closed the pipe
  input.on("error", () => realExit(0));
  void proc;
}

/**
 * Node keeps random bytes of its own in the JavaScript heap: randomUUID() draws from a cache of
 * 128 UUIDs' worth, randomInt() from a 6 KiB one, each filled once from OpenSSL. A parent that
 * called either leaves every child the same next values, whatever OpenSSL then gives (its bytes
 * come from the guest kernel: forkd-rand.so). So both always draw fresh: randomUUID with
 * disableEntropyCache, randomInt by rejection sampling on 6 fresh bytes per try (its range is
 * below 2^48, as Node's); Node's own validation (and its errors) still runs first.
 */
function uncachedCrypto(c, nodeModule) {
  const uuid = c.randomUUID;
  const int = c.randomInt;
  c.randomUUID = function randomUUID(options) {
    if (options === undefined) return uuid({ disableEntropyCache: true });
    if (options === null || typeof options !== "object") return uuid(options); // Node's error
    return uuid({ ...options, disableEntropyCache: true });
  };
  c.randomInt = function randomInt(min, max, callback) {
    if (typeof max === "function" || max === undefined) {
      callback = max;
      max = min;
      min = 0;
    }
    if (callback !== undefined && typeof callback !== "function") return int(min, max, callback); // Node's error
    int(min, max); // Node's validation; its cached value is not used
    const range = max - min;
    const limit = 2 ** 48 - (2 ** 48 % range);
    let x;
    do x = c.randomBytes(6).readUIntBE(0, 6);
    while (x >= limit);
    const v = min + (x % range);
    if (callback === undefined) return v;
    globalThis.process.nextTick(callback, null, v);
    return undefined;
  };
  if (c.webcrypto && typeof c.webcrypto.randomUUID === "function") {
    Object.defineProperty(c.webcrypto, "randomUUID", {
      value: function randomUUID() {
        return uuid({ disableEntropyCache: true });
      },
      writable: true,
      configurable: true,
      enumerable: false,
    });
  }
  // `import { randomUUID } from "node:crypto"` sees these too
  if (typeof nodeModule.syncBuiltinESMExports === "function") nodeModule.syncBuiltinESMExports();
}

const startupExit = globalThis.process.exit.bind(globalThis.process);
main().catch((e) => {
  globalThis.process.stderr.write("forkd_eval.js: " + (e && e.stack) + "\n");
  startupExit(1);
});
