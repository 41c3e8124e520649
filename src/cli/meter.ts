/** A pass-through stream that counts the bytes going by (a pack's download or upload). */
import { Transform } from "node:stream";

export function byteMeter(onBytes: (total: number) => void): Transform {
  let total = 0;
  return new Transform({
    transform(chunk: Buffer, _enc, cb) {
      total += chunk.length;
      onBytes(total);
      cb(null, chunk);
    },
  });
}
