/**
 * Long operations with ?stream=1: NDJSON lines {"type":"progress","message"}, then
 * {"type":"done", <key>: result} or {"type":"error", "error": …} (the one error envelope).
 * Errors found before the work starts should be thrown before calling this, so they get a status.
 */
import { toEnvelope } from "./errors.js";

export function progressStream<T>(
  status: number,
  key: string,
  work: (progress: (line: string) => void) => Promise<T>,
): Response {
  const enc = new TextEncoder();
  const stream = new ReadableStream<Uint8Array>({
    start(controller) {
      const send = (o: unknown) => controller.enqueue(enc.encode(JSON.stringify(o) + "\n"));
      work((message) => send({ type: "progress", message })).then(
        (result) => {
          send({ type: "done", [key]: result });
          controller.close();
        },
        (e: unknown) => {
          send({ type: "error", ...toEnvelope(e).body });
          controller.close();
        },
      );
    },
  });
  return new Response(stream, { status, headers: { "content-type": "application/x-ndjson" } });
}
