/** A text tail that refreshes every few seconds and keeps its end in view (the console log, the audit lines). */
import { useEffect, useRef } from "preact/hooks";
import { usePoll } from "../lib/use-poll";

export function TextTail(p: { title: string; load: () => Promise<string>; keyOf: string; everyMs?: number }) {
  const text = usePoll(p.load, p.everyMs ?? 5000, p.keyOf);
  const pre = useRef<HTMLPreElement>(null);
  useEffect(() => {
    if (pre.current) pre.current.scrollTop = pre.current.scrollHeight;
  }, [text.value]);
  return (
    <section aria-label={p.title}>
      <h2>{p.title}</h2>
      {text.error && <p class="status error">{text.error}</p>}
      <pre ref={pre} class="tail" tabIndex={0} aria-label={`${p.title} text`}>
        {text.value ?? ""}
      </pre>
    </section>
  );
}
