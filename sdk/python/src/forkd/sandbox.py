"""Sandbox: one forked microVM, shaped like E2B's Sandbox (timeouts in seconds, as in E2B's Python SDK)."""

import os
import secrets
import time
from datetime import datetime, timezone

from ._layout import Layout
from ._transport import Transport
from .code import Context, execution_of
from .commands import Commands
from .errors import ConflictError, ForkdError, InvalidArgumentError, NotFoundError
from .files import Files
from .paginator import SandboxPaginator, SandboxQuery
from .pty import Pty

DEFAULT_SNAPSHOT = "default"
# the kernels a sandbox can have (which ones an image has depends on its interpreters)
LANGUAGES = ("python", "javascript")


def _when(s):
    return datetime.fromisoformat(s.replace("Z", "+00:00")) if s else None


class SandboxInfo:
    def __init__(self, w):
        self.sandbox_id = w["id"]
        self.snapshot = w["tag"]
        self.template_id = w["tag"]  # E2B's name
        self.pid = w["pid"]
        self.state = w["state"]
        self.started_at = _when(w["created"])
        self.exit_reason = w["exit_reason"]
        # The cluster node it runs on; None: its daemon runs alone (not in a cluster).
        self.node = w.get("node")
        # forkd's idle timeout (s; None: none)
        self.idle_timeout = w["timeout_ms"] / 1000 if w["timeout_ms"] is not None else None
        # E2B's absolute timeout: when it is killed (or paused: lifecycle on_timeout); None: none
        self.deadline = _when(w.get("deadline"))
        # When it will end: its deadline, its idle timeout unless it is used first, or its lifetime's end.
        ends = [t for t in (self.deadline, _when(w["expires_at"]), _when(w.get("ends_at"))) if t is not None]
        self.end_at = min(ends) if ends else None
        # {"memory_mib", "cpus", "pids", "disk_mib", "lifetime_ms"}: the host-side limits in force.
        self.limits = w.get("limits") or {}
        self.metadata = w["metadata"]
        # {"launch_ms", "restore_ms", "ready_ms", "total_ms"}: the fork as the daemon measured it.
        self.timings = w["timings"]
        net = w.get("network") or {"mode": "none", "guest_ip": None, "egress": None, "ports": []}
        # {"mode", "guest_ip", "egress", "ports": [{"port", "host"}]}: exposed ports while it runs.
        self.network = net
        # E2B's lifecycle: on_timeout is what the deadline (E2B's timeout) does
        self.lifecycle = {"on_timeout": w.get("on_deadline") or "kill", "auto_resume": False}
        self.name = w["tag"]

    def __repr__(self):
        return "SandboxInfo(sandbox_id=%r, snapshot=%r, state=%r)" % (self.sandbox_id, self.snapshot, self.state)


def _transport(url=None, token=None, socket_path=None, api_key=None, request_timeout=None):
    return Transport(url=url, token=token, socket_path=socket_path, api_key=api_key,
                     request_timeout=60.0 if request_timeout is None else request_timeout)


class _class_or_instance:
    """A method callable on the class (with a sandbox id) or on an instance, like E2B's kill()."""

    def __init__(self, cls_fn, inst_fn):
        self.cls_fn = cls_fn
        self.inst_fn = inst_fn

    def __get__(self, obj, cls):
        if obj is None:
            return lambda *a, **kw: self.cls_fn(cls, *a, **kw)
        return lambda *a, **kw: self.inst_fn(obj, *a, **kw)


class Sandbox:
    """Sandbox(snapshot=None, ...) forks a new child (E2B: Sandbox(template=None, ...)).

    `with Sandbox() as sb:` kills it on exit. Without a snapshot, $FORKD_SNAPSHOT or "default"
    (created from the python template on first use) is forked.
    """

    def __init__(self, template=None, timeout=None, metadata=None, envs=None, api_key=None,
                 request_timeout=None, snapshot=None, url=None, token=None, socket_path=None,
                 sandbox_id=None, on_idle=None, limits=None, network=None, lifecycle=None, secure=None,
                 allow_internet_access=None, idle_timeout=None, _transport_obj=None):
        """timeout: E2B's, absolute (s): that long after its creation the daemon kills the sandbox
        (or pauses it: lifecycle), busy or idle; set_timeout moves it (default: none).
        idle_timeout: forkd's (s): the daemon kills (on_idle) it when no API call used it that long.
        envs: the sandbox's environment, seen by every command and cell (under their own envs).
        lifecycle: E2B's {"on_timeout": "kill"|"pause", "auto_resume": bool}: on_timeout is what the
        timeout does; a paused sandbox comes back by connect() (auto_resume is not done by the daemon)."""
        self._t = _transport_obj or _transport(url, token, socket_path, api_key, request_timeout)
        self._envs = dict(envs or {})
        on_deadline = _on_timeout(lifecycle) if lifecycle else None
        if sandbox_id is None:
            explicit = snapshot or template or os.environ.get("FORKD_SNAPSHOT")
            tag = explicit or DEFAULT_SNAPSHOT
            kw = dict(limits=limits, network=network, envs=self._envs, idle_timeout=idle_timeout,
                      on_deadline=on_deadline)
            try:
                sandbox_id = _fork(self._t, tag, 1, timeout, metadata, on_idle, **kw)[0]
            except NotFoundError:
                if explicit:
                    raise
                _ensure_default(self._t)
                sandbox_id = _fork(self._t, tag, 1, timeout, metadata, on_idle, **kw)[0]
        self.sandbox_id = sandbox_id
        self._layout = Layout(self._t, sandbox_id)
        self.commands = Commands(self._t, sandbox_id, layout=self._layout, envs=self._envs)
        self.files = Files(self._t, sandbox_id, layout=self._layout)
        self.pty = Pty(self.commands, self._t, sandbox_id)

    @classmethod
    def create(cls, template=None, **kw):
        """Same as Sandbox(...): forks a new child."""
        return cls(template, **kw)

    def _connect_class(cls, sandbox_id, timeout=None, url=None, token=None, socket_path=None, api_key=None,
                       request_timeout=None):
        t = _transport(url, token, socket_path, api_key, request_timeout)
        return cls(sandbox_id=_connect(t, sandbox_id, timeout), _transport_obj=t)

    def _connect_instance(self, timeout=None, request_timeout=None):
        _connect(self._t, self.sandbox_id, timeout)
        return self

    connect = _class_or_instance(_connect_class, _connect_instance)
    connect.__doc__ = ("A sandbox by id (Sandbox.connect(id) or sb.connect()): a paused one is resumed first "
                       "(E2B's connect); timeout (s) sets its timeout. An exited one is a ConflictError.")

    @classmethod
    def resume(cls, sandbox_id, url=None, token=None, socket_path=None, api_key=None):
        """Brings a paused sandbox back: same id, files and processes."""
        t = _transport(url, token, socket_path, api_key)
        w = t.json("POST", "/v1/sandboxes/%s/resume" % _quote(sandbox_id), timeout=0)
        return cls(sandbox_id=w["id"], _transport_obj=t)

    def _pause_instance(self, keep_memory=True, request_timeout=None):
        return _pause(self._t, self.sandbox_id)

    def _pause_class(cls, sandbox_id, keep_memory=True, url=None, token=None, socket_path=None, api_key=None,
                     request_timeout=None):
        return _pause(_transport(url, token, socket_path, api_key), sandbox_id)

    pause = _class_or_instance(_pause_class, _pause_instance)
    pause.__doc__ = ("Saves the sandbox's whole state and stops its VM (Sandbox.pause(id) or sb.pause()); "
                     "connect() or Sandbox.resume(id) brings it back, also after a daemon restart. True once "
                     "paused, False if it already was. forkd always keeps the memory (keep_memory=False too).")

    @classmethod
    def list(cls, query=None, limit=None, next_token=None, metadata=None, state=None, url=None, token=None,
             socket_path=None, api_key=None, request_timeout=None):
        """E2B's paginator over the sandboxes: query=SandboxQuery(metadata={...}, state=["running",
        "paused"]) (or a dict), limit per page, next_token to start from. has_next, next_token and
        next_items() as in E2B; iterating it (or len()) reads every page."""
        t = _transport(url, token, socket_path, api_key)
        q = SandboxQuery.of(query)
        if metadata:
            q.metadata = dict(metadata)
        if state:
            q.state = [state] if isinstance(state, str) else list(state)
        return SandboxPaginator(t, q, limit, next_token, SandboxInfo)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()

    def _kill_instance(self):
        return _kill(self._t, self.sandbox_id)

    def _kill_class(cls, sandbox_id, url=None, token=None, socket_path=None, api_key=None):
        return _kill(_transport(url, token, socket_path, api_key), sandbox_id)

    kill = _class_or_instance(_kill_class, _kill_instance)
    kill.__doc__ = "Kills the sandbox (Sandbox.kill(id) or sb.kill()). False if it was already gone."

    def _set_timeout_instance(self, timeout, request_timeout=None):
        self._t.json("POST", "/v1/sandboxes/%s/deadline" % self.sandbox_id,
                     json_body={"deadline_ms": None if timeout is None else int(timeout * 1000)})

    def _set_timeout_class(cls, sandbox_id, timeout, **kw):
        cls(sandbox_id=sandbox_id, _transport_obj=_transport(**kw))._set_timeout_instance(timeout)

    set_timeout = _class_or_instance(_set_timeout_class, _set_timeout_instance)
    set_timeout.__doc__ = ("E2B's set_timeout: the sandbox ends (lifecycle on_timeout) `timeout` seconds from now, "
                           "busy or idle (None: never).")

    def set_idle_timeout(self, timeout):
        """forkd's idle timeout in seconds, counted from now (None: never): every API call resets it."""
        self._t.json("POST", "/v1/sandboxes/%s/timeout" % self.sandbox_id,
                     json_body={"timeout_ms": None if timeout is None else int(timeout * 1000)})

    def _get_info_instance(self):
        return SandboxInfo(self._t.json("GET", "/v1/sandboxes/%s" % self.sandbox_id))

    def _get_info_class(cls, sandbox_id, url=None, token=None, socket_path=None, api_key=None):
        t = _transport(url, token, socket_path, api_key)
        return SandboxInfo(t.json("GET", "/v1/sandboxes/%s" % _quote(sandbox_id)))

    get_info = _class_or_instance(_get_info_class, _get_info_instance)
    get_info.__doc__ = "A sandbox's state (Sandbox.get_info(id) or sb.get_info()), also one that exited."

    def get_host(self, port):
        """Where guest TCP port `port` answers on the host, as "host:port" (E2B: get_host(port)). A port
        not exposed yet is exposed now (the sandbox needs a network: mode user or netns)."""
        for p in self.get_info().network.get("ports") or []:
            if p["port"] == port:
                return p["host"]
        return self.expose(port)

    def unexpose(self, port):
        """Stops exposing guest TCP port `port` on the host."""
        self._t.json("DELETE", "/v1/sandboxes/%s/ports/%d" % (self.sandbox_id, int(port)))

    def set_egress(self, egress):
        """Replaces the egress policy while it runs, e.g. {"mode": "deny"} once dependencies are
        installed (network netns, or user created with egress allow or list)."""
        self._t.json("POST", "/v1/sandboxes/%s/egress" % self.sandbox_id, json_body=dict(egress))

    def expose(self, port):
        """Exposes guest TCP port `port` on the host while the sandbox lives; returns "host:port"."""
        w = self._t.json("POST", "/v1/sandboxes/%s/ports" % self.sandbox_id, json_body={"port": int(port)})
        for p in (w.get("network") or {}).get("ports") or []:
            if p["port"] == port:
                return p["host"]
        raise InvalidArgumentError("port %s was not exposed" % port, code="invalid_argument")

    def _get_metrics_instance(self, start=None, end=None, request_timeout=None):
        return _metrics(self._t, self.sandbox_id, start, end)

    def _get_metrics_class(cls, sandbox_id, start=None, end=None, url=None, token=None, socket_path=None,
                           api_key=None, request_timeout=None):
        return _metrics(_transport(url, token, socket_path, api_key), sandbox_id, start, end)

    get_metrics = _class_or_instance(_get_metrics_class, _get_metrics_instance)
    get_metrics.__doc__ = ("E2B's SandboxMetrics samples (timestamp, cpu_used_pct, cpu_count, mem_used, mem_total, "
                           "disk_used, disk_total) from the daemon's host-side view of the sandbox's VM.")

    def create_snapshot(self, name=None, request_timeout=None):
        """A snapshot of this running sandbox (memory, disk, processes: a forkd branch); it keeps
        running. Sandbox(snapshot_id) starts sandboxes from it."""
        tag = name or "%s-snap-%s" % (self.sandbox_id, secrets.token_hex(3))
        r = self._t.json("POST", "/v1/sandboxes/%s/branch" % self.sandbox_id,
                         json_body={"tag": tag, "wait": True}, timeout=0)
        return SnapshotInfo(r["tag"])

    def _list_snapshots_instance(self, limit=None, next_token=None, request_timeout=None):
        return _list_snapshots(self._t, self.sandbox_id)

    def _list_snapshots_class(cls, sandbox_id=None, limit=None, next_token=None, url=None, token=None,
                              socket_path=None, api_key=None, request_timeout=None):
        return _list_snapshots(_transport(url, token, socket_path, api_key), sandbox_id)

    list_snapshots = _class_or_instance(_list_snapshots_class, _list_snapshots_instance)
    list_snapshots.__doc__ = ("Snapshots made by create_snapshot (of this sandbox, or of sandbox_id), as "
                              "SnapshotInfo(snapshot_id, names).")

    def _delete_snapshot_instance(self, snapshot_id, request_timeout=None):
        return _delete_snapshot(self._t, snapshot_id)

    def _delete_snapshot_class(cls, snapshot_id, url=None, token=None, socket_path=None, api_key=None,
                               request_timeout=None):
        return _delete_snapshot(_transport(url, token, socket_path, api_key), snapshot_id)

    delete_snapshot = _class_or_instance(_delete_snapshot_class, _delete_snapshot_instance)
    delete_snapshot.__doc__ = "Deletes a snapshot. False if there was none (409 while sandboxes run from it)."

    def fork(self, count=1, timeout=None, request_timeout=None):
        """E2B's fork of this running sandbox: one branch (a short pause; this sandbox keeps its id
        and runs on) from which `count` new sandboxes start. A list with one entry per fork: a
        Sandbox, or the ForkdError that fork failed with (each succeeds or fails on its own)."""
        tag = "%s-fork-%s" % (self.sandbox_id, secrets.token_hex(3))
        self._t.json("POST", "/v1/sandboxes/%s/branch" % self.sandbox_id, json_body={"tag": tag, "wait": True},
                     timeout=0)
        body = {"snapshot_tag": tag, "n": int(count)}
        if timeout is not None:
            body["deadline_ms"] = int(timeout * 1000)
        if self._envs:
            body["env"] = dict(self._envs)
        try:
            r = self._t.json("POST", "/v1/sandboxes", json_body=body, timeout=0)
        except ForkdError as e:  # every fork failed
            failures = (e.details or {}).get("failures") or [{"index": i} for i in range(int(count))]
            return [error_of_failure(f, e) for f in failures]
        out = [None] * int(count)
        ok = iter(r["sandboxes"])
        for f in r["failures"]:
            out[f["index"]] = error_of_failure(f)
        for i in range(int(count)):
            if out[i] is None:
                w = next(ok)
                child = Sandbox(sandbox_id=w["id"], _transport_obj=self._t)
                child._envs = dict(self._envs)
                child.commands._envs = dict(self._envs)
                out[i] = child
        return out

    def is_running(self):
        try:
            return self.get_info().state == "running"
        except NotFoundError:
            return False

    def branch(self, tag=None, wait=True):
        """BRANCH: snapshots this running sandbox (memory, disk, processes, interpreter state) with a
        short pause, as a new snapshot tag to fork. Returns BranchInfo(tag, status, pause_ms,
        private_bytes); with wait=False it returns once the sandbox runs again ("writing")."""
        body = {"wait": bool(wait)}
        if tag:
            body["tag"] = tag
        r = self._t.json("POST", "/v1/sandboxes/%s/branch" % self.sandbox_id, json_body=body, timeout=0)
        return BranchInfo(r["tag"], r["status"], r["pause_ms"], r["private_bytes"])

    def run_code(self, code, language=None, context=None, on_stdout=None, on_stderr=None, on_result=None,
                 on_error=None, envs=None, timeout=60, request_timeout=None):
        """Runs a notebook cell in the warm interpreter (E2B's run_code): statements run, the final
        expression's value is the main result, globals persist (a forked child inherits its parent's);
        errors come back in execution.error, not raised. Returns E2B's Execution (results, logs,
        error, execution_count). language: "python" (default) or "javascript" (needs node in the
        image); context: a Context from create_code_context (its own globals and cwd); envs: for
        this cell only (over the sandbox's). Callbacks get each stdout/stderr chunk, each Result,
        the ExecutionError. Fields the default cell does not need are sent only when set, so Python
        cells also work against an older daemon."""
        if context is not None and language is not None and getattr(context, "language", language) != language:
            raise InvalidArgumentError("give a context or a language, not both", code="invalid_argument")
        language = language or getattr(context, "language", None) or "python"
        if language not in LANGUAGES:
            raise InvalidArgumentError("no %s kernel (known: %s)" % (language, ", ".join(LANGUAGES)),
                                       code="invalid_argument")
        t = timeout or 3600
        body = {"code": code, "timeout_ms": int(t * 1000)}
        if language != "python":
            body["language"] = language
        if context is not None:
            body["context_id"] = context.id if isinstance(context, Context) else str(context)
        env = dict(self._envs)
        env.update(envs or {})
        if env:
            body["env"] = env
        streamed = None
        if (on_stdout or on_stderr) and getattr(self, "_eval_stream", True):
            streamed = self._eval_streamed(body, on_stdout, on_stderr, request_timeout or t + 30)
        w = streamed if streamed is not None else self._eval(body, request_timeout or t + 30)
        ex = execution_of(w)
        if streamed is None:
            if on_stdout:
                for s in ex.logs.stdout:
                    on_stdout(s)
            if on_stderr:
                for s in ex.logs.stderr:
                    on_stderr(s)
        if on_result:
            for r in ex.results:
                on_result(r)
        if on_error and ex.error is not None:
            on_error(ex.error)
        return ex

    def _eval_streamed(self, body, on_stdout, on_stderr, timeout):
        """POST .../eval/stream: output to the callbacks while the cell runs; None from a daemon
        without the route (the plain eval is used then)."""
        from .errors import error_from_envelope
        try:
            for ev in self._t.ndjson("POST", "/v1/sandboxes/%s/eval/stream" % self.sandbox_id, json_body=body,
                                     timeout=timeout):
                t = ev.get("type")
                if t == "stdout" and on_stdout:
                    on_stdout(ev.get("text", ""))
                elif t == "stderr" and on_stderr:
                    on_stderr(ev.get("text", ""))
                elif t == "result":
                    return ev["result"]
                elif t == "error":
                    e = ev.get("error") or {}
                    raise error_from_envelope(200, e.get("code", "internal"), e.get("message", "eval failed"),
                                              e.get("details"))
        except NotFoundError as e:
            if "route" not in e.message and "Not Found" not in e.message:
                raise
            self._eval_stream = False
            return None
        raise ForkdError("the eval stream ended without a result", code="connection")

    def _eval(self, body, timeout):
        path = "/v1/sandboxes/%s/eval" % self.sandbox_id
        if "env" not in body or getattr(self, "_cell_env", True):
            try:
                return self._t.json("POST", path, json_body=body, timeout=timeout)
            except InvalidArgumentError as e:
                if "env" not in body or "env" not in str(e.message) + str(e.details):
                    raise
                self._cell_env = False  # a daemon whose eval takes no env yet
        # Such a daemon: the environment is set in the kernel (it then stays for later cells).
        env = body.pop("env")
        lang = body.get("language", "python")
        import json as _json
        setup = ("Object.assign(process.env, %s)" % _json.dumps(env) if lang == "javascript"
                 else "__import__('os').environ.update(%s)" % _json.dumps(env))
        pre = {"code": setup, "timeout_ms": 30000}
        for k in ("language", "context_id"):
            if k in body:
                pre[k] = body[k]
        self._t.json("POST", path, json_body=pre, timeout=60)
        return self._t.json("POST", path, json_body=body, timeout=timeout)

    def create_code_context(self, cwd=None, language=None, request_timeout=None):
        """A new interpreter context (its own globals; E2B's create_code_context)."""
        body = {"language": language or "python"}
        if cwd:
            body["cwd"] = cwd
        return Context.of(self._t.json("POST", "/v1/sandboxes/%s/contexts" % self.sandbox_id, json_body=body))

    def list_code_contexts(self, language=None, request_timeout=None):
        """The contexts of a kernel (python by default), its default one included."""
        q = {"language": language} if language else None
        r = self._t.json("GET", "/v1/sandboxes/%s/contexts" % self.sandbox_id, query=q)
        return [Context.of(c) for c in r.get("contexts", [])]

    def remove_code_context(self, context, request_timeout=None):
        cid, q = _context_ref(context)
        self._t.json("DELETE", "/v1/sandboxes/%s/contexts/%s" % (self.sandbox_id, _quote(cid)), query=q)

    def restart_code_context(self, context, request_timeout=None):
        """Forgets a context's globals and count (its id and cwd stay)."""
        cid, q = _context_ref(context)
        self._t.json("POST", "/v1/sandboxes/%s/contexts/%s/restart" % (self.sandbox_id, _quote(cid)), query=q)

    def __repr__(self):
        return "Sandbox(sandbox_id=%r)" % self.sandbox_id


class BranchInfo:
    def __init__(self, tag, status, pause_ms, private_bytes):
        self.tag = tag
        self.status = status
        self.pause_ms = pause_ms
        self.private_bytes = private_bytes

    def __repr__(self):
        return "BranchInfo(tag=%r, status=%r, pause_ms=%.1f)" % (self.tag, self.status, self.pause_ms)


class ForkError(ForkdError):
    """Some children of a fork failed; the ones that started are in .sandboxes (still running)."""

    def __init__(self, sandboxes, failures):
        super().__init__("%d of %d children failed: %s" % (
            len(failures), len(failures) + len(sandboxes), failures[0]["message"] if failures else ""),
            code="fork_partial", details={"failures": failures})
        self.sandboxes = sandboxes
        self.failures = failures


class SandboxState:
    """E2B's SandboxState values (forkd's: running, paused, exited; lost via a cluster gateway)."""

    RUNNING = "running"
    PAUSED = "paused"


class SnapshotInfo:
    """E2B's SnapshotInfo: snapshot_id (a forkd snapshot tag: Sandbox(snapshot_id) forks it), names."""

    def __init__(self, snapshot_id):
        self.snapshot_id = snapshot_id
        self.names = [snapshot_id]

    def __repr__(self):
        return "SnapshotInfo(snapshot_id=%r)" % self.snapshot_id


class SandboxMetrics:
    """E2B's SandboxMetrics (bytes, percent), from the daemon's host-side view."""

    def __init__(self, m):
        self.timestamp = _when(m["timestamp"])
        self.cpu_used_pct = m["cpu_used_pct"]
        self.cpu_count = m["cpu_count"]
        self.mem_used = m["mem_used"]
        self.mem_total = m["mem_total"]
        self.mem_cache = m.get("mem_cache", 0)
        self.disk_used = m["disk_used"]
        self.disk_total = m["disk_total"]

    def __repr__(self):
        return "SandboxMetrics(cpu_used_pct=%r, mem_used=%r)" % (self.cpu_used_pct, self.mem_used)


def error_of_failure(f, default=None):
    from .errors import error_from_envelope
    if "code" in f:
        return error_from_envelope(0, f["code"], f.get("message", "fork failed"))
    return default or ForkdError("fork failed")


def _context_ref(context):
    if isinstance(context, Context):
        return context.id, ({"language": context.language} if context.language != "python" else None)
    return str(context), None


def _on_timeout(lifecycle):
    action = lifecycle.get("on_timeout", "kill") if isinstance(lifecycle, dict) else getattr(lifecycle, "on_timeout")
    if isinstance(action, dict):
        action = action.get("action", "kill")
    if action not in ("kill", "pause"):
        raise InvalidArgumentError("lifecycle on_timeout must be 'kill' or 'pause'", code="invalid_argument")
    return action


def _connect(t, sandbox_id, timeout):
    w = t.json("GET", "/v1/sandboxes/%s" % _quote(sandbox_id))
    if w["state"] == "paused":
        w = t.json("POST", "/v1/sandboxes/%s/resume" % _quote(sandbox_id), timeout=0)
    elif w["state"] != "running":
        raise ConflictError("sandbox %s is not running (%s)" % (sandbox_id, w["exit_reason"] or w["state"]),
                            code="conflict", status=409)
    if timeout is not None:
        t.json("POST", "/v1/sandboxes/%s/deadline" % _quote(sandbox_id),
               json_body={"deadline_ms": int(timeout * 1000)})
    return w["id"]


def _pause(t, sandbox_id):
    w = t.json("GET", "/v1/sandboxes/%s" % _quote(sandbox_id))
    if w["state"] == "paused":
        return False
    try:
        t.json("POST", "/v1/sandboxes/%s/pause" % _quote(sandbox_id), timeout=0)
    except ConflictError:
        if t.json("GET", "/v1/sandboxes/%s" % _quote(sandbox_id))["state"] == "paused":
            return False
        raise
    return True


def _metrics(t, sandbox_id, start=None, end=None):
    q = {}
    for k, v in (("start", start), ("end", end)):
        if v is not None:
            q[k] = v.astimezone(timezone.utc).isoformat().replace("+00:00", "Z") if isinstance(v, datetime) else v
    r = t.json("GET", "/v1/sandboxes/%s/metrics" % _quote(sandbox_id), query=q)
    return [SandboxMetrics(m) for m in r["metrics"]]


def _list_snapshots(t, sandbox_id):
    snaps = t.json("GET", "/v1/snapshots")["snapshots"]
    if sandbox_id:
        pre = (sandbox_id + "-snap-", sandbox_id + "-fork-")
        snaps = [s for s in snaps if s["tag"].startswith(pre)]
    return [SnapshotInfo(s["tag"]) for s in snaps]


def _delete_snapshot(t, snapshot_id):
    try:
        t.json("DELETE", "/v1/snapshots/%s" % _quote(snapshot_id))
        return True
    except NotFoundError:
        return False


def _quote(s):
    from urllib.parse import quote
    return quote(s, safe="")


def _kill(t, sandbox_id):
    try:
        t.json("DELETE", "/v1/sandboxes/%s" % _quote(sandbox_id), timeout=60)
        return True
    except NotFoundError:
        return False


def _fork(t, tag, n, timeout=None, metadata=None, on_idle=None, limits=None, network=None, envs=None,
          idle_timeout=None, on_deadline=None):
    """timeout: the absolute deadline (s, E2B's); idle_timeout: forkd's idle one (s)."""
    body = {"snapshot_tag": tag, "n": n}
    if envs:
        body["env"] = dict(envs)  # the sandbox's own environment (every command and cell sees it)
    if limits:
        # {"memory_mib": ..., "cpus": ..., "pids": ..., "disk_mib": ...}: host-side limits (see the REST API).
        body["limits"] = dict(limits)
    if on_idle:
        body["on_idle"] = on_idle
    if network:
        body["network"] = dict(network)
    if timeout is not None:
        body["deadline_ms"] = int(timeout * 1000)
    if idle_timeout is not None:
        body["timeout_ms"] = int(idle_timeout * 1000)
    if on_deadline:
        body["on_deadline"] = on_deadline
    if metadata:
        body["metadata"] = dict(metadata)
    r = t.json("POST", "/v1/sandboxes", json_body=body, timeout=0)
    ids = [s["id"] for s in r["sandboxes"]]
    if r["failures"]:
        raise ForkError([Sandbox(sandbox_id=i, _transport_obj=t) for i in ids], r["failures"])
    return ids


def _ensure_default(t):
    try:
        t.json("POST", "/v1/snapshots", json_body={"tag": DEFAULT_SNAPSHOT, "template": "python"}, timeout=0)
    except ConflictError:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:  # someone else is creating it
            try:
                t.json("GET", "/v1/snapshots/" + DEFAULT_SNAPSHOT)
                return
            except NotFoundError:
                time.sleep(1)
        raise


def fork(snapshot, n, timeout=None, metadata=None, url=None, token=None, socket_path=None, api_key=None,
         limits=None, network=None, envs=None, idle_timeout=None):
    """Forks n children of snapshot in one request (they start in parallel); returns them when every
    one answers. If some fail, raises ForkError whose .sandboxes holds the ones running.
    network: e.g. {"mode": "netns", "egress": {"mode": "deny"}, "expose": [8000]} (default none)."""
    t = _transport(url, token, socket_path, api_key)
    out = []
    for i in _fork(t, snapshot, n, timeout, metadata, limits=limits, network=network, envs=envs,
                   idle_timeout=idle_timeout):
        sb = Sandbox(sandbox_id=i, _transport_obj=t)
        sb._envs = dict(envs or {})
        sb.commands._envs = dict(envs or {})
        out.append(sb)
    return out
