"""sandbox.files: read and write (text, bytes, streams, batches), list, stat, exists, remove, make_dir,
rename, watch_dir, upload and download URLs. Relative paths resolve against the user's home (E2B)."""

import gzip as _gzip
import shlex
import zlib
import stat as _stat
from datetime import datetime, timezone

from ._layout import exec_output
from .errors import ForkdError, NotFoundError


class FileType:
    """E2B's FileType: the values compare equal to forkd's strings ("file", "dir")."""

    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"
    OTHER = "other"


def permissions_of(type_, mode):
    """`ls -l`'s permission string, e.g. "-rw-r--r--" or "drwxr-xr-x"."""
    kind = {"dir": _stat.S_IFDIR, "symlink": _stat.S_IFLNK, "file": _stat.S_IFREG}.get(type_, _stat.S_IFREG)
    return _stat.filemode(kind | (mode & 0o7777))


class EntryInfo:
    """E2B's EntryInfo: name, type, path, size, mode, permissions, owner, group, modified_time,
    symlink_target (owner and group only where forkd could read them: get_info)."""

    def __init__(self, name, path, type, size, mode, modified_time, owner=None, group=None, symlink_target=None):
        self.name = name
        self.path = path
        self.type = type  # "file" | "dir" | "symlink" | "other" (FileType's values)
        self.size = size
        self.mode = mode
        self.permissions = permissions_of(type, mode)
        self.owner = owner
        self.group = group
        self.modified_time = modified_time
        self.symlink_target = symlink_target

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


class WriteEntry:
    """One file of files.write_files()."""

    def __init__(self, path, data):
        self.path = path
        self.data = data


def _base(path):
    return path.rstrip("/").rsplit("/", 1)[-1] or path


def _join(d, name):
    return d + name if d.endswith("/") else d + "/" + name


def _entry(path, s, name=None):
    size = 0 if s["type"] == "dir" else s["size"]  # E2B reports 0 for a directory
    return EntryInfo(name or _base(path), path, s["type"], size, s["mode"],
                     datetime.fromtimestamp(s["mtime_ms"] / 1000, tz=timezone.utc))


def _entry_of(e):
    if isinstance(e, dict):
        return e["path"], e["data"]
    return e.path, e.data


class Files:
    def __init__(self, transport, sandbox_id, layout=None, sandbox=None):
        self._t = transport
        self._id = sandbox_id
        self._layout = layout
        self._sandbox = sandbox

    def _path(self, rest=""):
        return "/v1/sandboxes/%s/files%s" % (self._id, rest)

    def _abs(self, path, user=None):
        return self._layout.resolve(path, user) if self._layout is not None else path

    def _owner(self, user):
        """Who a new file should belong to (None: root, as forkd's agent writes)."""
        if self._layout is None:
            return None
        u = user or self._layout.user
        return None if u in (None, "root", "0") else u

    def _chown(self, paths, user):
        """Hands files forkd's agent wrote (as root) to the user they were written for."""
        owner = self._owner(user)
        if owner is None or not paths:
            return
        exec_output(self._t, self._id, "chown %s: -- %s" % (shlex.quote(owner), " ".join(shlex.quote(p) for p in paths)))

    def read(self, path, format="text", user=None, request_timeout=None):
        """The file as str (format="text"), bytes ("bytes"), or an iterator of byte chunks ("stream")."""
        path = self._abs(path, user)
        if format == "stream":
            return self._stream(path, request_timeout)
        data = self._t.bytes("GET", self._path(), query={"path": path}, timeout=request_timeout or 0)
        if format in ("bytes", "bytearray"):
            return data if format == "bytes" else bytearray(data)
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

    def _put(self, path, data, mode, request_timeout, use_gzip=False):
        if data is None:
            raise ForkdError("files.write: no data", code="invalid_argument")
        body = data.encode("utf-8") if isinstance(data, str) else data
        headers = None
        if use_gzip:  # sent compressed (Content-Encoding: gzip), the daemon decompresses it
            body = _gzip.compress(bytes(body)) if isinstance(body, (bytes, bytearray, memoryview)) else _gzipped(body)
            headers = {"Content-Encoding": "gzip"}
        query = {"path": path, "parents": 1}
        if mode is not None:
            query["mode"] = mode
        r = self._t.json("PUT", self._path(), query=query, body=body, timeout=request_timeout or 0, headers=headers)
        return WriteInfo(_base(r["path"]), r["path"], r["size"])

    def write(self, path, data=None, user=None, mode=None, request_timeout=None, use_octet_stream=None,
              use_gzip=False):
        """Writes a file (parents created, replaced atomically): data is str, bytes, a binary file
        object or an iterable of bytes (streamed), owned by `user` (default: the sandbox's user).
        Or write([{"path": ..., "data": ...}, ...]) (see write_files). Always sent as an
        octet-stream body (E2B's use_octet_stream is accepted for its callers); use_gzip sends it
        gzip-compressed (Content-Encoding: gzip), as E2B's option."""
        if isinstance(path, list):
            return self.write_files(path, user=user, request_timeout=request_timeout, use_gzip=use_gzip)
        info = self._put(self._abs(path, user), data, mode, request_timeout, use_gzip)
        self._chown([info.path], user)
        return info

    def write_files(self, files, user=None, request_timeout=None, use_gzip=False):
        """Writes several files ([WriteEntry(path, data)] or [{"path", "data"}]); returns their WriteInfo."""
        out = [self._put(self._abs(p, user), d, None, request_timeout, use_gzip) for p, d in map(_entry_of, files)]
        self._chown([i.path for i in out], user)
        return out

    def list(self, path, depth=1, user=None, request_timeout=None):
        """The entries of a directory; depth > 1 descends into subdirectories (E2B's depth)."""
        path = self._abs(path, user)
        r = self._t.json("GET", self._path("/list"), query={"path": path})
        out = []
        for e in r["entries"]:
            entry = _entry(_join(path, e["name"]), e, e["name"])
            out.append(entry)
            if depth and depth > 1 and entry.type == "dir":
                out.extend(self.list(entry.path, depth=depth - 1))
        return out

    def get_info(self, path, user=None, request_timeout=None):
        """E2B's EntryInfo of a path, owner and group included (NotFoundException if it is not there)."""
        path = self._abs(path, user)
        info = _entry(path, self._t.json("GET", self._path("/stat"), query={"path": path}))
        # owner, group, symlink target: what the REST stat does not carry, asked of the guest
        cmd = "stat -c '%%U:%%G' -- %s; readlink -- %s || true" % (shlex.quote(path), shlex.quote(path))
        lines = exec_output(self._t, self._id, cmd).splitlines()
        if lines and ":" in lines[0]:
            info.owner, info.group = lines[0].split(":", 1)
        if info.type == "symlink" and len(lines) > 1:
            info.symlink_target = lines[1]
        return info

    def exists(self, path, user=None, request_timeout=None):
        try:
            path = self._abs(path, user)
            self._t.json("GET", self._path("/stat"), query={"path": path})
            return True
        except NotFoundError:
            return False

    def remove(self, path, user=None, request_timeout=None):
        """Removes a file, or a directory with everything in it."""
        self._t.json("DELETE", self._path(), query={"path": self._abs(path, user), "recursive": 1})

    def make_dir(self, path, user=None, request_timeout=None):
        """Creates a directory and its parents. False if it already existed."""
        path = self._abs(path, user)
        if self.exists(path):
            return False
        self._t.json("POST", self._path("/mkdir"), json_body={"path": path, "parents": True})
        self._chown([path], user)
        return True

    def rename(self, old_path, new_path, user=None, request_timeout=None):
        old_path, new_path = self._abs(old_path, user), self._abs(new_path, user)
        self._t.json("POST", self._path("/rename"), json_body={"from": old_path, "to": new_path})
        return _entry(new_path, self._t.json("GET", self._path("/stat"), query={"path": new_path}))

    def watch_dir(self, path, on_event=None, recursive=False, user=None, request_timeout=None, timeout=None):
        """Watches a directory (E2B's watch_dir): a WatchHandle whose get_new_events() returns the
        FilesystemEvents (name, type) since the last call; stop() ends it. Needs the daemon's
        GET /v1/sandboxes/{id}/files/watch (NotFoundException from a daemon without it)."""
        from .watch import WatchHandle
        return WatchHandle(self._t, self._path("/watch"), self._abs(path, user), recursive, on_event)

    def download_url(self, path, user=None, use_signature_expiration=None):
        """A URL the file can be downloaded from: the daemon's own file route (needs its token
        when it has one; forkd has no signed URLs)."""
        return self._url(path, user)

    def upload_url(self, path=None, user=None, use_signature_expiration=None):
        """A URL a PUT of the file's bytes writes it at (the daemon's own file route)."""
        return self._url(path or "", user)

    def _url(self, path, user):
        from urllib.parse import urlencode
        base = self._t.base_url
        return "%s%s?%s" % (base, self._path(), urlencode({"path": self._abs(path, user)}))


def _gzipped(stream):
    """A binary file object or an iterable of bytes, gzip-compressed as it is read."""
    z = zlib.compressobj(wbits=31)
    read = getattr(stream, "read", None)
    for c in iter(lambda: read(1 << 20), b"") if read else iter(stream):
        c = c.encode("utf-8") if isinstance(c, str) else c
        out = z.compress(c)
        if out:
            yield out
    yield z.flush()
