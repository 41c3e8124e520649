/** A sandbox's file browser: list a directory, open subdirectories, download files, upload one into the directory. */
import { useState } from "preact/hooks";
import { downloadNow, downloadUrl, joinPath, list, parentOf, upload } from "../api/files";
import { bytes } from "../lib/format";
import { useAction } from "../lib/use-action";
import { usePoll } from "../lib/use-poll";
import { StatusLine } from "./status-line";

export function FileBrowser({ id }: { id: string }) {
  const [dir, setDir] = useState("/root");
  const [typed, setTyped] = useState("/root");
  const listing = usePoll(() => list(id, dir), 0, `${id}:${dir}`);
  const action = useAction();
  const go = (d: string) => {
    setDir(d);
    setTyped(d);
  };
  const entries = [...(listing.value?.entries ?? [])].sort(
    (a, b) => Number(b.type === "dir") - Number(a.type === "dir") || a.name.localeCompare(b.name),
  );
  return (
    <section class="files" aria-label="Files">
      <h2>Files</h2>
      <form
        class="inline-form"
        onSubmit={(e) => {
          e.preventDefault();
          go(typed.trim() || "/");
        }}
      >
        <label>
          Directory
          <input value={typed} onInput={(e) => setTyped(e.currentTarget.value)} />
        </label>
        <button type="submit">Open</button>
        <button type="button" onClick={() => go(parentOf(dir))}>
          Up
        </button>
        <button type="button" onClick={listing.reload}>
          Refresh
        </button>
      </form>
      <label class="upload">
        Upload a file
        <input
          type="file"
          onChange={(e) => {
            const input = e.currentTarget;
            const file = input.files?.[0];
            if (!file) return;
            void action.run(`upload ${file.name}`, async () => {
              const r = await upload(id, joinPath(dir, file.name), file);
              input.value = "";
              listing.reload();
              return `uploaded ${r.path} (${bytes(r.size)})`;
            });
          }}
        />
      </label>
      <StatusLine action={action} />
      {listing.error && <p class="status error">{listing.error}</p>}
      <table aria-label={`Files in ${dir}`}>
        <thead>
          <tr>
            <th scope="col">Name</th>
            <th scope="col">Type</th>
            <th scope="col">Size</th>
            <th scope="col">Modified</th>
          </tr>
        </thead>
        <tbody>
          {entries.map((f) => {
            const path = joinPath(dir, f.name);
            return (
              <tr key={f.name}>
                <th scope="row">
                  {f.type === "dir" ? (
                    <button type="button" class="link" onClick={() => go(path)} aria-label={`Open ${f.name}`}>
                      {f.name}/
                    </button>
                  ) : f.type === "file" ? (
                    <a
                      href={downloadUrl(id, path)}
                      download={f.name}
                      aria-label={`Download ${f.name}`}
                      onClick={(e) => {
                        // The link has no credential in it: the download goes with a ticket.
                        e.preventDefault();
                        void action.run(`download ${f.name}`, () => downloadNow(id, path, f.name));
                      }}
                    >
                      {f.name}
                    </a>
                  ) : (
                    f.name
                  )}
                </th>
                <td>{f.type}</td>
                <td>{f.type === "file" ? bytes(f.size) : ""}</td>
                <td>{new Date(f.mtime_ms).toLocaleString()}</td>
              </tr>
            );
          })}
        </tbody>
      </table>
    </section>
  );
}
