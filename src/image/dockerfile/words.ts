/**
 * Docker's word processing for the instructions it expands variables in (FROM, COPY, ADD, ENV,
 * ARG, LABEL, WORKDIR, USER): `$VAR`, `${VAR}`, `${VAR:-word}`, `${VAR-word}`, `${VAR:+word}`,
 * `${VAR+word}`, `${VAR:?msg}`, single quotes literal, double quotes expanding, the escape
 * character quoting the next one; quotes removed. `words` also splits on blanks outside quotes.
 * Mirrors BuildKit's shell lexer (frontend/dockerfile/shell/lex.go) for these forms.
 * A word is bounded (WORD_LIMIT characters): `ENV a=$a$a` repeated would otherwise double a value
 * each line and exhaust the daemon's memory in a few dozen lines.
 */
export type Vars = ReadonlyMap<string, string>;

export class WordError extends Error {}

const NAME_CHAR = /[A-Za-z0-9_]/;

/** The longest word, in characters (64 KiB), expansion included. */
export const WORD_LIMIT = 64 * 1024;

/** `s`, refused once it grows past WORD_LIMIT (checked after every append). */
function bounded(s: string): string {
  if (s.length > WORD_LIMIT) {
    throw new WordError(`a word grows past ${WORD_LIMIT} characters after variable expansion`);
  }
  return s;
}

class Lexer {
  pos = 0;
  constructor(
    private readonly s: string,
    private readonly vars: Vars,
    private readonly escape: string,
  ) {}

  get done(): boolean {
    return this.pos >= this.s.length;
  }

  private peek(): string {
    return this.s[this.pos] ?? "";
  }

  /**
   * One word (split: stops at an unquoted blank; stopAt: stops at that unquoted character, not
   * consumed). Returns the word and whether any part of it was quoted (an empty "" is a word).
   */
  word(split: boolean, stopAt = ""): { text: string; quoted: boolean } {
    let out = "";
    let quoted = false;
    while (!this.done) {
      const ch = this.peek();
      if (stopAt && ch === stopAt) break;
      if (split && (ch === " " || ch === "\t")) break;
      if (ch === "'") {
        quoted = true;
        this.pos++;
        const end = this.s.indexOf("'", this.pos);
        if (end < 0) throw new WordError("unterminated single quote");
        out = bounded(out + this.s.slice(this.pos, end));
        this.pos = end + 1;
      } else if (ch === '"') {
        quoted = true;
        this.pos++;
        out = bounded(out + this.doubleQuoted());
      } else if (ch === "$") {
        out = bounded(out + this.dollar());
      } else if (ch === this.escape) {
        this.pos++;
        if (this.done) out += ch;
        else out += this.s[this.pos++] ?? "";
      } else {
        out += ch;
        this.pos++;
      }
    }
    return { text: out, quoted };
  }

  private doubleQuoted(): string {
    let out = "";
    for (;;) {
      if (this.done) throw new WordError("unterminated double quote");
      const ch = this.peek();
      if (ch === '"') {
        this.pos++;
        return out;
      }
      if (ch === "$") out = bounded(out + this.dollar());
      else if (ch === this.escape) {
        const next = this.s[this.pos + 1] ?? "";
        if (next === '"' || next === "$" || next === this.escape) {
          out += next;
          this.pos += 2;
        } else {
          out += ch;
          this.pos++;
        }
      } else {
        out += ch;
        this.pos++;
      }
    }
  }

  private name(): string {
    const from = this.pos;
    while (!this.done && NAME_CHAR.test(this.peek())) this.pos++;
    return this.s.slice(from, this.pos);
  }

  private dollar(): string {
    this.pos++; // the $
    if (this.peek() !== "{") {
      const name = this.name();
      if (name === "") return "$";
      return this.vars.get(name) ?? "";
    }
    this.pos++; // {
    const name = this.name();
    if (name === "") throw new WordError("bad substitution: ${ without a variable name");
    const ch = this.peek();
    if (ch === "}") {
      this.pos++;
      return this.vars.get(name) ?? "";
    }
    let colon = false;
    let op = ch;
    if (ch === ":") {
      colon = true;
      this.pos++;
      op = this.peek();
    }
    if (op !== "-" && op !== "+" && op !== "?") {
      throw new WordError(
        `unsupported substitution \${${name}${colon ? ":" : ""}${op}...} (supported: -, +, ?)`,
      );
    }
    this.pos++;
    const word = this.word(false, "}").text;
    if (this.peek() !== "}") throw new WordError(`missing } in \${${name}...}`);
    this.pos++;
    const value = this.vars.get(name);
    const set = value !== undefined && (!colon || value !== "");
    if (op === "-") return set ? value : word;
    if (op === "+") return set ? word : "";
    if (!set) throw new WordError(`${name}: ${word || "is not set"}`);
    return value;
  }

  skipBlanks(): void {
    while (this.peek() === " " || this.peek() === "\t") this.pos++;
  }
}

/** The whole text as one word (variables expanded, quotes removed, blanks kept). */
export function word(text: string, vars: Vars, escape: string): string {
  return new Lexer(text, vars, escape).word(false).text;
}

/** The text split into words as a shell would (variables expanded inside each, quotes removed). */
export function words(text: string, vars: Vars, escape: string): string[] {
  const lx = new Lexer(text, vars, escape);
  const out: string[] = [];
  lx.skipBlanks();
  while (!lx.done) {
    const w = lx.word(true);
    if (w.text !== "" || w.quoted) out.push(w.text);
    lx.skipBlanks();
  }
  return out;
}
