"""files.watch_dir: E2B's WatchHandle over the daemon's GET /v1/sandboxes/{id}/files/watch stream.

The stream is NDJSON: one line per event {"type": create|write|remove|rename|chmod|overflow,
"path": absolute, "is_dir"?}, an optional {"type": "ready"} first, {"type": "error", "error"} last.
"""

import socket
import threading

from .errors import ForkdError, error_from_envelope

EVENT_TYPES = ("create", "write", "remove", "rename", "chmod", "overflow")


class FilesystemEvent:
    """E2B's FilesystemEvent: `name` relative to the watched directory, `type` (EventType's values)."""

    def __init__(self, name, type, path=None, is_dir=None):
        self.name = name
        self.type = type
        self.path = path
        self.is_dir = is_dir

    def __repr__(self):
        return "FilesystemEvent(name=%r, type=%r)" % (self.name, self.type)


class FilesystemEventType:
    CREATE = "create"
    WRITE = "write"
    REMOVE = "remove"
    RENAME = "rename"
    CHMOD = "chmod"


EventType = FilesystemEventType  # the name older E2B SDKs used


def event_of(line, root):
    """The FilesystemEvent of a stream line (None for a line that is not an event)."""
    t = line.get("type")
    if t not in EVENT_TYPES:
        return None
    path = line.get("path") or ""
    prefix = root.rstrip("/") + "/"
    name = path[len(prefix):] if path.startswith(prefix) else path
    return FilesystemEvent(name, t, path, line.get("is_dir"))


class WatchHandle:
    """Events collect as they come (a thread reads the stream); get_new_events() takes them."""

    def __init__(self, transport, route, path, recursive=False, on_event=None):
        self._lock = threading.Lock()
        self._events = []
        self._error = None
        self._stopped = False
        self._on_event = on_event
        self._root = path
        self._ready = threading.Event()
        query = {"path": path}
        if recursive:
            query["recursive"] = 1
        self._conn, self._res = transport.send("GET", route, query=query, timeout=0)
        self._thread = threading.Thread(target=self._read, name="forkd-watch", daemon=True)
        self._thread.start()

    def _read(self):
        import json
        try:
            buf = b""
            while not self._stopped:
                chunk = self._res.read1(65536) if hasattr(self._res, "read1") else self._res.read(65536)
                if not chunk:
                    break
                buf += chunk
                while b"\n" in buf:
                    raw, buf = buf.split(b"\n", 1)
                    if not raw.strip():
                        continue
                    line = json.loads(raw)
                    if line.get("type") == "ready":
                        self._ready.set()
                    elif line.get("type") == "error":
                        e = line.get("error") or {}
                        self._error = error_from_envelope(200, e.get("code", "internal"),
                                                          e.get("message", "watch failed"), e.get("details"))
                    else:
                        ev = event_of(line, self._root)
                        if ev is not None:
                            with self._lock:
                                self._events.append(ev)
                            if self._on_event:
                                self._on_event(ev)
        except Exception as e:  # a stop() closes the connection under the read
            if not self._stopped:
                self._error = e if isinstance(e, ForkdError) else ForkdError(str(e), code="connection")
        finally:
            self._ready.set()

    def get_new_events(self):
        """The events since the last call (raises the watch's error once it failed)."""
        with self._lock:
            out, self._events = self._events, []
        if not out and self._error is not None:
            raise self._error
        return out

    def stop(self):
        """Ends the watch (the daemon then cancels it in the guest). The socket is shut down, not
        closed: closing the reply's buffered reader would wait for the reading thread's lock."""
        self._stopped = True
        # the connection hands its socket to the reply when the reply reads until close
        sock = getattr(self._conn, "sock", None) or getattr(
            getattr(getattr(self._res, "fp", None), "raw", None), "_sock", None)
        try:
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._thread.join(10)
        try:
            self._conn.close()
        except OSError:
            pass
