/** Server-sent events' wire format: one event (`id:`, `event:`, one `data:` line of JSON), a comment. */
const enc = new TextEncoder();

export function sseEvent(id: number, event: string, data: unknown): Uint8Array {
  // JSON.stringify never emits a raw newline, so the data is one line.
  return enc.encode(`id: ${id}\nevent: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
}

export function sseComment(text: string): Uint8Array {
  return enc.encode(`: ${text.replace(/[\r\n]/g, " ")}\n\n`);
}
