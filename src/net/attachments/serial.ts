/** Runs `fn`s one after another (a failed one does not stop the next): one attachment's changes. */
export function serial(): <T>(fn: () => Promise<T>) => Promise<T> {
  let tail: Promise<unknown> = Promise.resolve();
  return (fn) => {
    const next = tail.then(fn);
    tail = next.catch(() => undefined);
    return next;
  };
}
