/** A button that opens a one-field form in place (branch tag, timeout, fork count); Escape closes it. */
import { useState } from "preact/hooks";

export interface InlineFormProps {
  label: string;
  field: string;
  type?: "text" | "number";
  placeholder?: string;
  initial?: string;
  submit: string;
  disabled?: boolean;
  onSubmit: (value: string) => void;
}

export function InlineForm(p: InlineFormProps) {
  const [open, setOpen] = useState(false);
  const [value, setValue] = useState(p.initial ?? "");
  if (!open)
    return (
      <button type="button" disabled={p.disabled} onClick={() => setOpen(true)}>
        {p.label}
      </button>
    );
  return (
    <form
      class="inline-form"
      onSubmit={(e) => {
        e.preventDefault();
        setOpen(false);
        p.onSubmit(value.trim());
      }}
      onKeyDown={(e) => {
        if (e.key === "Escape") setOpen(false);
      }}
    >
      <label>
        {p.field}
        {p.type === "number" ? (
          <input type="number" value={value} autoFocus onInput={(e) => setValue(e.currentTarget.value)} />
        ) : (
          <input
            type="text"
            value={value}
            placeholder={p.placeholder}
            autoFocus
            onInput={(e) => setValue(e.currentTarget.value)}
          />
        )}
      </label>
      <button type="submit">{p.submit}</button>
      <button type="button" onClick={() => setOpen(false)}>
        Cancel
      </button>
    </form>
  );
}
