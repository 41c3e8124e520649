/**
 * Validates live API responses against the committed OpenAPI document (docs/openapi.json) with a
 * standard JSON Schema validator, so the document is checked as clients will read it.
 */
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { Ajv2020 } from "ajv/dist/2020.js";
import type { ValidateFunction } from "ajv/dist/2020.js";
import { REPO_DIR } from "../../src/host/paths.js";
import { ApiError, rawRequest, readAll } from "./http.js";
import type { Endpoint } from "./http.js";

type Json = Record<string, unknown>;

interface Op {
  method: string;
  re: RegExp;
  template: string;
  responses: Record<string, Json>;
}

export interface ContractValidator {
  /**
   * Throws unless `body` (for NDJSON: the array of events) matches the documented response:
   * the one of the reply's `contentType` where the status documents several.
   */
  check(method: string, path: string, status: number, body: unknown, contentType?: string): void;
  /** Operations checked so far, as "method template". */
  covered: Set<string>;
}

let cached: Promise<ContractValidator> | null = null;

export function contractValidator(): Promise<ContractValidator> {
  return (cached ??= load());
}

async function load(): Promise<ContractValidator> {
  const doc = JSON.parse(await readFile(join(REPO_DIR, "docs", "openapi.json"), "utf8")) as Json;
  const ajv = new Ajv2020({ strict: false, allErrors: true });
  ajv.addSchema({ $id: "forkd-openapi", components: doc.components }, "forkd-openapi");
  const compiled = new Map<Json, ValidateFunction>();
  const compile = (schema: Json): ValidateFunction => {
    let v = compiled.get(schema);
    if (!v) {
      const ref = typeof schema.$ref === "string" ? schema.$ref : null;
      v = ajv.compile(ref ? { $ref: `forkd-openapi${ref}` } : schema);
      compiled.set(schema, v);
    }
    return v;
  };

  const ops: Op[] = [];
  for (const [template, methods] of Object.entries(doc.paths as Record<string, Record<string, Json>>)) {
    const re = new RegExp("^" + template.replace(/\{\w+\}/g, "[^/]+") + "$");
    for (const [method, op] of Object.entries(methods)) {
      ops.push({ method, re, template, responses: op.responses as Record<string, Json> });
    }
  }
  const errorSchema = { $ref: "#/components/schemas/Error" };
  const covered = new Set<string>();

  return {
    covered,
    check(method, path, status, body, contentType) {
      const bare = path.split("?")[0] ?? path;
      const op = ops.find((o) => o.method === method.toLowerCase() && o.re.test(bare));
      if (!op) throw new Error(`no route ${method} ${bare} in the contract`);
      covered.add(`${op.method} ${op.template}`);
      const resp = op.responses[String(status)];
      let schema: Json;
      let ndjson = false;
      if (status >= 400) {
        schema = errorSchema;
      } else {
        if (!resp) throw new Error(`${method} ${op.template}: status ${status} is not in the contract`);
        const content = resp.content as Record<string, { schema: Json }>;
        const types = Object.keys(content);
        const type =
          types.find((t) => contentType !== undefined && contentType.startsWith(t.split(";")[0] ?? t)) ??
          types[0] ??
          "";
        if (type === "application/octet-stream") return;
        ndjson = type === "application/x-ndjson";
        schema = (content[type] as { schema: Json }).schema;
      }
      const validate = compile(schema);
      const items = ndjson ? (body as unknown[]) : [body];
      for (const item of items) {
        if (!validate(item)) {
          throw new Error(
            `${method} ${bare} ${status}: response does not match the contract: ` +
              `${ajv.errorsText(validate.errors)}\n${JSON.stringify(item).slice(0, 2000)}`,
          );
        }
      }
    },
  };
}

/**
 * apiRequest that also validates the reply (success or error envelope) against the contract.
 * NDJSON replies are returned as the array of their events.
 */
export async function checkedRequest<T = unknown>(
  ep: Endpoint,
  method: string,
  path: string,
  body?: unknown,
  timeoutMs = 300_000,
): Promise<T> {
  const v = await contractValidator();
  const res = await rawRequest(
    ep,
    method,
    path,
    body === undefined ? undefined : JSON.stringify(body),
    timeoutMs,
    body === undefined ? {} : { "content-type": "application/json" },
  );
  const status = res.statusCode ?? 0;
  const text = (await readAll(res)).toString("utf8");
  const ndjson = (res.headers["content-type"] ?? "").startsWith("application/x-ndjson");
  const parsed: unknown = ndjson
    ? text
        .split("\n")
        .filter((l) => l.trim())
        .map((l) => JSON.parse(l) as unknown)
    : JSON.parse(text);
  v.check(method, path, status, parsed, res.headers["content-type"]);
  if (status >= 300) {
    const e = (parsed as { error: { code: string; message: string; details: Record<string, unknown> } })
      .error;
    throw new ApiError(status, e.code, e.message, e.details);
  }
  return parsed as T;
}
