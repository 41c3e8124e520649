/**
 * Kubernetes manifests checked against Kubernetes' own schemas, offline, as `kubectl apply`
 * (strict field validation) would: each YAML document must read the same under YAML 1.1 (the
 * Kubernetes parser's dialect) and 1.2, pass the validator kubernetes-models compiled for its
 * kind from Kubernetes' OpenAPI document (types, required fields, enums, formats), and have no
 * field its kind lacks. The OpenAPI schemas allow any extra field, so that last pass walks the
 * same package's generated type declarations (one interface per OpenAPI definition) with the
 * TypeScript checker: a misspelt `nodeSelecter` is an error, not a silently ignored key.
 */
import { join } from "node:path";
import ts from "typescript";
import { parseAllDocuments } from "yaml";
import { REPO_DIR } from "../../src/host/paths.js";

/** One YAML document of a manifest file. */
export interface Manifest {
  file: string;
  apiVersion: string;
  kind: string;
  name: string;
  body: Record<string, unknown>;
}

const isRecord = (v: unknown): v is Record<string, unknown> =>
  typeof v === "object" && v !== null && !Array.isArray(v);

function documents(text: string, file: string, version: "1.1" | "1.2"): unknown[] {
  return parseAllDocuments(text, { version, prettyErrors: false }).map((d, i) => {
    const problems = [...d.errors, ...d.warnings];
    if (problems.length > 0)
      throw new Error(`${file} document ${i + 1}: ${problems.map((p) => p.message).join("; ")}`);
    return d.toJS({ maxAliasCount: 0 }) as unknown;
  });
}

/** The documents of one manifest file; throws on a YAML error or a 1.1/1.2 ambiguity. */
export function parseManifests(text: string, file: string): Manifest[] {
  const docs = documents(text, file, "1.2");
  const old = documents(text, file, "1.1");
  return docs.map((body, i) => {
    const where = `${file} document ${i + 1}`;
    if (JSON.stringify(body) !== JSON.stringify(old[i])) {
      throw new Error(
        `${where} reads differently under YAML 1.1, as Kubernetes parses it (an octal or a yes/no?)`,
      );
    }
    if (!isRecord(body)) throw new Error(`${where} is not a mapping`);
    const { apiVersion, kind, metadata } = body;
    if (typeof apiVersion !== "string" || typeof kind !== "string")
      throw new Error(`${where} has no apiVersion/kind`);
    const name = isRecord(metadata) && typeof metadata.name === "string" ? metadata.name : "";
    return { file, apiVersion, kind, name, body };
  });
}

const label = (m: Manifest): string => `${m.file} ${m.kind} ${m.name}`;

/** The module of a kind in kubernetes-models: `kubernetes-models/<apiVersion>/<Kind>`. */
function modulePath(m: Manifest): string {
  if (
    !/^([a-z0-9.-]+\/)?v[0-9]+((alpha|beta)[0-9]+)?$/.test(m.apiVersion) ||
    !/^[A-Z][A-Za-z0-9]+$/.test(m.kind)
  ) {
    throw new Error(`${label(m)}: not a Kubernetes apiVersion/kind: ${m.apiVersion} ${m.kind}`);
  }
  return `kubernetes-models/${m.apiVersion}/${m.kind}`;
}

/** The error of kubernetes-models' compiled OpenAPI validator for the document's kind, if any;
 * `known` is false for a kind Kubernetes does not have. */
async function schemaError(m: Manifest): Promise<{ known: boolean; error: string | null }> {
  let mod: unknown;
  try {
    mod = await import(modulePath(m));
  } catch {
    return { known: false, error: `${label(m)}: Kubernetes has no kind ${m.kind} in ${m.apiVersion}` };
  }
  const ctor = isRecord(mod) ? mod[m.kind] : undefined;
  if (typeof ctor !== "function")
    return { known: false, error: `${label(m)}: kubernetes-models has no ${m.kind}` };
  const Model = ctor as new (data: unknown) => { validate(): void };
  try {
    new Model(m.body).validate();
    return { known: true, error: null };
  } catch (e) {
    return { known: true, error: `${label(m)}: ${(e as Error).message}` };
  }
}

/** Fields the document has and its kind's type declaration does not, by path. */
function unknownFields(
  checker: ts.TypeChecker,
  type: ts.Type,
  value: unknown,
  path: string,
  out: string[],
): void {
  if (typeof value !== "object" || value === null) return;
  const t = checker.getNonNullableType(type);
  if (t.flags & (ts.TypeFlags.Any | ts.TypeFlags.Unknown | ts.TypeFlags.NonPrimitive)) return;
  if (Array.isArray(value)) {
    if (!checker.isArrayType(t)) return; // a type error: the schema pass reports it
    const element = checker.getTypeArguments(t as ts.TypeReference)[0];
    if (element) value.forEach((v, i) => unknownFields(checker, element, v, `${path}[${i}]`, out));
    return;
  }
  if (t.isUnion()) {
    const objects = t.types.filter((u) => u.flags & ts.TypeFlags.Object && !checker.isArrayType(u));
    if (objects.length === 1 && objects[0]) unknownFields(checker, objects[0], value, path, out);
    return;
  }
  if (!(t.flags & ts.TypeFlags.Object) || checker.isArrayType(t)) return;
  const index = checker.getIndexInfoOfType(t, ts.IndexKind.String);
  const props = checker.getPropertiesOfType(t);
  if (props.length === 0 && !index) return; // a free-form object
  for (const [key, v] of Object.entries(value)) {
    const prop = checker.getPropertyOfType(t, key);
    if (prop) unknownFields(checker, checker.getTypeOfSymbol(prop), v, `${path}.${key}`, out);
    else if (index) unknownFields(checker, index.type, v, `${path}.${key}`, out);
    else out.push(`${path}.${key}: no such field`);
  }
}

/** Strict field validation of every document, with one TypeScript program for all kinds. */
function strictFieldErrors(manifests: Manifest[]): string[] {
  const file = join(REPO_DIR, "test", "helpers", "__kubernetes_kinds__.ts");
  const source = manifests
    .map(
      (m, i) => `import type { I${m.kind} as K${i} } from "${modulePath(m)}";\nexport type T${i} = K${i};\n`,
    )
    .join("");
  const options: ts.CompilerOptions = {
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
    target: ts.ScriptTarget.ES2022,
    lib: ["lib.es2022.d.ts"],
    types: [],
    strict: true,
    noEmit: true,
    skipLibCheck: true,
  };
  const host = ts.createCompilerHost(options);
  const disk = ts.createCompilerHost(options);
  host.getSourceFile = (name, lang, ...rest) =>
    name === file ? ts.createSourceFile(name, source, lang) : disk.getSourceFile(name, lang, ...rest);
  host.fileExists = (name) => name === file || disk.fileExists(name);
  host.readFile = (name) => (name === file ? source : disk.readFile(name));
  const program = ts.createProgram([file], options, host);
  const sf = program.getSourceFile(file);
  if (!sf) throw new Error("the kinds' program has no source");
  const diagnostics = ts.getPreEmitDiagnostics(program, sf);
  if (diagnostics.length > 0) {
    return diagnostics.map(
      (d) => `type declarations: ${ts.flattenDiagnosticMessageText(d.messageText, "\n")}`,
    );
  }
  const checker = program.getTypeChecker();
  const aliases = sf.statements.filter(ts.isTypeAliasDeclaration);
  const out: string[] = [];
  manifests.forEach((m, i) => {
    const alias = aliases[i];
    if (!alias) throw new Error(`no type for ${label(m)}`);
    const found: string[] = [];
    unknownFields(checker, checker.getTypeAtLocation(alias.name), m.body, "", found);
    out.push(...found.map((f) => `${label(m)}: ${f} (strict field validation)`));
  });
  return out;
}

/** Every error of every document against Kubernetes' schemas (empty: all valid). */
export async function validateManifests(manifests: Manifest[]): Promise<string[]> {
  const errors: string[] = [];
  const known: Manifest[] = [];
  for (const m of manifests) {
    const r = await schemaError(m);
    if (r.error) errors.push(r.error);
    if (r.known) known.push(m);
  }
  return [...errors, ...strictFieldErrors(known)];
}
