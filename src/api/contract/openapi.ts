/**
 * Generates the OpenAPI 3.1 document from the route table and the registered schemas. Served at
 * /v1/openapi.json and committed as docs/openapi.json (`npm run openapi` rewrites it; a unit
 * test fails when the committed copy drifts).
 */
import { z } from "zod";
import { contract } from "./schemas.js";
import { PATH_PARAMS, ROUTES } from "./routes.js";
import type { Body } from "./routes.js";

type Json = Record<string, unknown>;

const REF = (id: string) => `#/components/schemas/${id}`;

/** A schema as JSON Schema: a $ref when it is registered under a name, else inline. */
function schemaOf(s: z.ZodType): Json {
  const meta = contract.get(s);
  if (meta) return { $ref: REF(meta.id) };
  const out = z.toJSONSchema(s, {
    target: "draft-2020-12",
    io: "input",
    unrepresentable: "any",
  }) as Json;
  return tidy(out) as Json;
}

function content(b: Body): Json {
  switch (b.kind) {
    case "json":
      return { "application/json": { schema: schemaOf(b.schema) } };
    case "ndjson":
      return {
        "application/x-ndjson": {
          schema: schemaOf(b.event),
          description: "One JSON object (this schema) per line",
        },
      };
    case "bytes":
      return { "application/octet-stream": { schema: { type: "string", format: "binary" } } };
    case "text":
      return { [b.contentType]: { schema: { type: "string" } } };
  }
}

const SAFE = Number.MAX_SAFE_INTEGER;

/** Drops what zod adds that says nothing: $schema, $id, and the safe-integer bounds of z.int(). */
function tidy(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(tidy);
  if (typeof v !== "object" || v === null) return v;
  const o: Json = {};
  for (const [k, x] of Object.entries(v as Json)) {
    if (k === "$schema" || k === "$id") continue;
    if ((k === "minimum" && x === -SAFE) || (k === "maximum" && x === SAFE)) continue;
    o[k] = tidy(x);
  }
  return o;
}

/**
 * Request bodies are described as clients may send them (defaults optional), responses as the
 * daemon sends them (every field present, no others).
 */
function componentSchemas(): Record<string, unknown> {
  const opts = { target: "draft-2020-12", uri: REF, unrepresentable: "any" } as const;
  const input = z.toJSONSchema(contract, { ...opts, io: "input" }).schemas;
  const output = z.toJSONSchema(contract, { ...opts, io: "output" }).schemas;
  const requestIds = new Set<string>();
  for (const r of ROUTES) {
    if (r.body?.kind === "json") {
      const id = contract.get(r.body.schema)?.id;
      if (id) requestIds.add(id);
    }
  }
  const out: Record<string, unknown> = {};
  for (const id of Object.keys(output)) out[id] = tidy(requestIds.has(id) ? input[id] : output[id]);
  return out;
}

export function buildOpenApi(version: string): Json {
  const schemas = componentSchemas();

  const paths: Record<string, Record<string, Json>> = {};
  for (const r of ROUTES) {
    const parameters: Json[] = [];
    for (const m of r.path.matchAll(/\{(\w+)\}/g)) {
      const name = m[1] ?? "";
      const p = PATH_PARAMS[name];
      if (!p) throw new Error(`route ${r.operationId}: undescribed path parameter ${name}`);
      parameters.push({
        name,
        in: "path",
        required: true,
        description: p.description,
        schema: schemaOf(p.schema),
      });
    }
    if (r.query) {
      for (const [name, s] of Object.entries(r.query.shape)) {
        const schema = s as z.ZodType;
        parameters.push({
          name,
          in: "query",
          required: !schema.safeParse(undefined).success,
          schema: schemaOf(schema),
        });
      }
    }
    const responses: Record<string, Json> = {};
    for (const [status, b] of Object.entries(r.responses)) {
      const headers = b.kind === "bytes" && b.headers ? b.headers : undefined;
      responses[status] = {
        description: r.summary,
        content: {
          ...content(b),
          ...(r.streamed
            ? {
                "application/x-ndjson": {
                  schema: schemaOf(r.streamed),
                  description: "With ?stream=1: one JSON object (this schema) per line",
                },
              }
            : {}),
        },
        ...(headers
          ? {
              headers: Object.fromEntries(
                Object.entries(headers).map(([h, d]) => [h, { description: d, schema: { type: "string" } }]),
              ),
            }
          : {}),
      };
    }
    const error = (description: string, extra: Json = {}): Json => ({
      description,
      content: { "application/json": { schema: { $ref: REF("Error") } } },
      ...extra,
    });
    if (!r.public) responses["401"] = error("unauthenticated: no bearer token, or not a valid one (TCP)");
    if (r.admin) responses["403"] = error("forbidden: a tenant token on an admin-only route");
    if (r.body)
      responses["413"] = error(`payload_too_large: the body is over its bound (${r.limit ?? "json"})`);
    responses["429"] = error(
      "rate_limited: too many requests, or too many in flight, for this caller; or (TCP) too many failed authentications from this address",
      {
        headers: {
          "retry-after": { description: "Seconds to wait before trying again", schema: { type: "integer" } },
        },
      },
    );
    responses.default = error("Error (see the code in the body)");
    const op: Json = {
      operationId: r.operationId,
      summary: r.summary,
      tags: [r.tag],
      ...(parameters.length ? { parameters } : {}),
      ...(r.body ? { requestBody: { required: true, content: content(r.body) } } : {}),
      responses,
      ...(r.public ? { security: [] } : {}),
      ...(r.heavy ? { "x-forkd-heavy": true } : {}),
      ...(r.admin ? { "x-forkd-admin-only": true } : {}),
    };
    (paths[r.path] ??= {})[r.method] = op;
  }

  return {
    openapi: "3.1.0",
    info: {
      title: "forkd",
      version,
      description:
        "forkd's REST API: snapshots of warm microVMs and the sandboxes forked from them. Served on " +
        "the daemon's unix socket (no token: the local admin) or on TCP (optionally TLS) with a bearer " +
        "token. A tenant's token sees only its own sandboxes and snapshots, plus shared snapshots. " +
        "Every error has the body `Error` with a stable `code`. Operations marked x-forkd-heavy count " +
        "against the per-caller limit of heavy operations in flight.",
    },
    servers: [
      { url: "http://localhost", description: "unix socket /var/lib/forkd/forkd.sock, or FORKD_LISTEN" },
    ],
    security: [{ bearer: [] }],
    tags: ["daemon", "access", "webhooks", "snapshots", "sandboxes", "commands", "code", "files"].map(
      (name) => ({
        name,
      }),
    ),
    paths,
    components: {
      securitySchemes: { bearer: { type: "http", scheme: "bearer" } },
      schemas,
    },
  };
}
