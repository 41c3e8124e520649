"""sandbox.files: read and write (text, bytes, streams), list, stat, exists, remove, make_dir, rename."""

from datetime import datetime, timezone

from .errors import ForkdError, NotFoundError


class EntryInfo:
    def __init__(self, name, path, type, size, mode, modified_time):
        self.name = name
        self.path = path
        self.type = type  # "file" | "dir" | "symlink" | "other"
        self.size = size
        self.mode = mode
        self.modified_time = modified_time

    def __repr__(self):
        return "EntryInfo(name=%r, type=%r, path=%r, size=%r)" % (self.name, self.type, self.path, self.size)


class WriteInfo:
    def __init__(self, name, path, size):
        self.name = name
        self.path = path
        self.type = "file"
        self.size = size

    def __repr__(self):
        return "WriteInfo(name=%r, path=%r, size=%r)" % (self.name, self.path, self.size)


def _base(path):
    return path.rstrip("/").rsplit("/", 1)[-1] or path


def _join(d, name):
    return d + name if d.endswith("/") else d + "/" + name


def _entry(path, s, name=None):
    return EntryInfo(name or _base(path), path, s["type"], s["size"], s["mode"],
                     datetime.fromtimestamp(s["mtime_ms"] / 1000, tz=timezone.utc))


class Files:
    def __init__(self, transport, sandbox_id):
        self._t = transport
        self._id = sandbox_id

    def _path(self, rest=""):
        return "/v1/sandboxes/%s/files%s" % (self._id, rest)

    def read(self, path, format="text", request_timeout=None):
        """The file as str (format="text"), bytes ("bytes"), or an iterator of byte chunks ("stream")."""
        if format == "stream":
            return self._stream(path, request_timeout)
        data = self._t.bytes("GET", self._path(), query={"path": path}, timeout=request_timeout or 0)
        if format == "bytes":
            return data
        if format != "text":
            raise ValueError("format must be 'text', 'bytes' or 'stream'")
        return data.decode("utf-8")

    def _stream(self, path, request_timeout):
        conn, res = self._t.send("GET", self._path(), query={"path": path}, timeout=request_timeout or 0)
        try:
            while True:
                chunk = res.read(1 << 20)
                if not chunk:
                    return
                yield chunk
        finally:
            conn.close()

    def write(self, path_or_files, data=None, mode=None, request_timeout=None):
        """Writes a file (parents created, replaced atomically): data is str, bytes, a binary file
        object or an iterable of bytes (streamed). Or write([{"path": ..., "data": ...}, ...])."""
        if isinstance(path_or_files, list):
            return [self.write(f["path"], f["data"]) for f in path_or_files]
        if data is None:
            raise ForkdError("files.write: no data", code="invalid_argument")
        body = data.encode("utf-8") if isinstance(data, str) else data
        query = {"path": path_or_files, "parents": 1}
        if mode is not None:
            query["mode"] = mode
        r = self._t.json("PUT", self._path(), query=query, body=body, timeout=request_timeout or 0)
        return WriteInfo(_base(r["path"]), r["path"], r["size"])

    def list(self, path):
        r = self._t.json("GET", self._path("/list"), query={"path": path})
        return [_entry(_join(path, e["name"]), e, e["name"]) for e in r["entries"]]

    def get_info(self, path):
        return _entry(path, self._t.json("GET", self._path("/stat"), query={"path": path}))

    def exists(self, path):
        try:
            self.get_info(path)
            return True
        except NotFoundError:
            return False

    def remove(self, path):
        """Removes a file, or a directory with everything in it."""
        self._t.json("DELETE", self._path(), query={"path": path, "recursive": 1})

    def make_dir(self, path):
        """Creates a directory and its parents. False if it already existed."""
        if self.exists(path):
            return False
        self._t.json("POST", self._path("/mkdir"), json_body={"path": path, "parents": True})
        return True

    def rename(self, old_path, new_path):
        self._t.json("POST", self._path("/rename"), json_body={"from": old_path, "to": new_path})
        return self.get_info(new_path)
