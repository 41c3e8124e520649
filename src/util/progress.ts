/**
 * Progress of a long operation (a snapshot's create, push, pull, unpack; an image's pull,
 * flatten or Dockerfile build): a line for people, and,
 * where the operation knows them, what a client can draw from it (the optional fields of the
 * API's progress events: snake_case, as on the wire).
 */
export interface ProgressDetail {
  /** What it is doing: create: image, boot, warm, freeze, ready; push: stage, upload, manifest; pull: manifest, download, receive, verify, register. */
  phase?: string;
  /** The file (layer) this line is about, 1-based among `count`. */
  layer?: { index: number; count: number; path: string };
  /** Bytes done so far of the phase's `total_bytes` (when it is known). */
  done_bytes?: number;
  total_bytes?: number;
}

export type Progress = (message: string, detail?: ProgressDetail) => void;
