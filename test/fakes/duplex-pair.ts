/** Two connected in-memory streams (what a socketpair is to two processes), for one process. */
import { Duplex } from "node:stream";

export function duplexPair(): [Duplex, Duplex] {
  const ends: Duplex[] = [];
  const peer = (i: number): Duplex | undefined => ends[1 - i];
  const end = (i: number) =>
    new Duplex({
      read() {},
      write(chunk: Buffer, _enc, cb) {
        peer(i)?.push(chunk);
        cb();
      },
      final(cb) {
        peer(i)?.push(null);
        cb();
      },
      destroy(err, cb) {
        const p = peer(i);
        if (p && !p.destroyed) p.destroy();
        cb(err);
      },
    });
  ends.push(end(0), end(1));
  return [ends[0]!, ends[1]!];
}
