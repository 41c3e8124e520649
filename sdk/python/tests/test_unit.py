"""The Python SDK's E2B surface against a fake daemon (no VMs): what it sends and how it reads the
replies. Run by test/unit/sdk-python-unit.test.ts, or directly: python3 sdk/python/tests/test_unit.py.

Each behaviour here is one E2B's own suites check (envs at creation, user, TimeoutException, handle
iteration, home layout, kill of a missing sandbox, the list paginator, fork, connect of a paused one).
"""

import base64
import json
import os
import sys
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import forkd  # noqa: E402
from forkd import (CommandExitException, NotFoundException, Sandbox, SandboxQuery,  # noqa: E402
                   TimeoutException)

PASSWD_WITH_USER = "default root /root\nroot /root\nuser /home/user\n"
PASSWD_ROOT_ONLY = "default root /root\nroot /root\nnobody /nonexistent\n"


def view(i, state="running", metadata=None):
    return {"id": i, "tag": "snap", "pid": 1, "state": state, "created": "2026-12-01T00:00:00.000Z",
            "exit_reason": None, "timings": {"launch_ms": 1, "restore_ms": 1, "ready_ms": 1, "total_ms": 3},
            "from_pool": False, "timeout_ms": None, "expires_at": None, "ends_at": None,
            "metadata": metadata or {}, "owner": None, "limits": {}, "network": None}


class Fake:
    """The daemon's replies, and every request it got: (method, path, query, body)."""

    def __init__(self):
        self.requests = []
        self.passwd = PASSWD_WITH_USER
        self.sandboxes = {"sb-aaaaaaaaaaaaaaaa": view("sb-aaaaaaaaaaaaaaaa")}
        self.exec_reply = None  # a function of the exec body -> list of events
        self.fork_failures = []
        self.release = threading.Event()

    def execs(self):
        return [b for (m, p, q, b) in self.requests if p.endswith("/exec/stream")]

    def handle(self, method, path, query, body):
        self.requests.append((method, path, query, body))
        parts = path.split("/")
        if path == "/v1/sandboxes" and method == "POST":
            n = body.get("n", 1)
            ids = ["sb-%016d" % (len(self.sandboxes) + i) for i in range(n)]
            failed = {f["index"] for f in self.fork_failures}
            made = [view(ids[i]) for i in range(n) if i not in failed]
            for v in made:
                self.sandboxes[v["id"]] = v
            return 201, {"sandboxes": made, "failures": self.fork_failures}
        if path == "/v1/sandboxes" and method == "GET":
            items = sorted(self.sandboxes.values(), key=lambda v: v["id"])
            limit = int(query.get("limit", ["100"])[0])
            after = query.get("next_token", [None])[0]
            if after:
                items = [v for v in items if v["id"] > after]
            page = items[:limit]
            more = len(items) > limit
            return 200, {"sandboxes": page, "next_token": page[-1]["id"] if more else None}
        if len(parts) >= 4 and parts[1:3] == ["v1", "sandboxes"]:
            sid = parts[3]
            rest = "/".join(parts[4:])
            if sid not in self.sandboxes:
                return 404, {"error": {"code": "not_found", "message": "no sandbox %s" % sid, "details": {}}}
            sb = self.sandboxes[sid]
            if rest == "" and method == "GET":
                return 200, sb
            if rest == "" and method == "DELETE":
                del self.sandboxes[sid]
                return 200, {"deleted": sid}
            if rest == "resume":
                sb["state"] = "running"
                return 200, sb
            if rest == "pause":
                sb["state"] = "paused"
                return 200, sb
            if rest == "branch":
                return 201, {"tag": body["tag"], "status": "ready", "pause_ms": 1, "private_bytes": 1,
                             "snapshot": None}
            if rest == "files" and method == "PUT":
                return 201, {"path": query["path"][0], "size": len(body)}
            if rest == "files/stat":
                return 200, {"path": query["path"][0], "type": "file", "size": 4, "mode": 0o644, "mtime_ms": 0}
            if rest == "files/watch":
                root = query["path"][0]
                return "hold", [{"type": "ready"}, {"type": "create", "path": root + "/a.txt", "is_dir": False},
                                {"type": "write", "path": root + "/sub/b", "is_dir": False}]
            if rest.endswith("/resize"):
                return 200, {"pid": 7, "cmd": "sh", "started": "2026-12-01T00:00:00.000Z", "stdin_open": True}
            if rest == "exec/stream":
                return 200, self.exec_events(body)
        return 404, {"error": {"code": "not_found", "message": "no route %s %s" % (method, path), "details": {}}}

    def exec_events(self, body):
        cmd = body["cmd"]
        if isinstance(cmd, str) and "/etc/passwd" in cmd:
            out = self.passwd
        elif self.exec_reply:
            return self.exec_reply(body)
        else:
            out = ""
        events = [{"type": "started", "pid": 42}]
        if out:
            events.append({"type": "stdout", "data": base64.b64encode(out.encode()).decode()})
        events.append({"type": "exit", "exit_code": 0, "signal": None, "timed_out": False})
        return events


def serve(fake):
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do(self):
            u = urlsplit(self.path)
            n = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(n) if n else b""
            if self.headers.get("transfer-encoding") == "chunked":
                raw = b""
                while True:
                    size = int(self.rfile.readline().strip(), 16)
                    if size == 0:
                        self.rfile.readline()
                        break
                    raw += self.rfile.read(size)
                    self.rfile.readline()
            body = json.loads(raw) if self.headers.get("content-type") == "application/json" else raw
            status, reply = fake.handle(self.command, u.path, parse_qs(u.query), body)
            if status == "hold":  # a stream that stays open, as a watch's does
                self.send_response(200)
                self.send_header("content-type", "application/x-ndjson")
                self.end_headers()
                self.wfile.write(b"".join(json.dumps(e).encode() + b"\n" for e in reply))
                self.wfile.flush()
                fake.release.wait(10)
                return
            if isinstance(reply, list):
                data = b"".join(json.dumps(e).encode() + b"\n" for e in reply)
            else:
                data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = do

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


class E2BSurfaceTest(unittest.TestCase):
    def setUp(self):
        self.fake = Fake()
        self.srv = serve(self.fake)
        self.url = "http://127.0.0.1:%d" % self.srv.server_address[1]

    def tearDown(self):
        self.fake.release.set()
        self.srv.shutdown()
        self.srv.server_close()

    def sandbox(self, **kw):
        return Sandbox(snapshot="snap", url=self.url, token="t", **kw)

    def test_envs_at_creation_are_sent_and_every_command_sees_them(self):
        sb = self.sandbox(envs={"A": "1", "B": "2"})
        create = [b for (m, p, q, b) in self.fake.requests if m == "POST" and p == "/v1/sandboxes"][0]
        self.assertEqual(create["env"], {"A": "1", "B": "2"})
        sb.commands.run("echo $A", envs={"B": "override"})
        self.assertEqual(self.fake.execs()[-1]["env"], {"A": "1", "B": "override"})

    def test_user_is_sent_and_defaults_to_the_e2b_account_in_its_home(self):
        sb = self.sandbox()
        sb.commands.run("whoami", user="root")
        self.assertEqual((self.fake.execs()[-1]["user"], self.fake.execs()[-1]["cwd"]), ("root", "/root"))
        sb.commands.run("whoami")
        self.assertEqual((self.fake.execs()[-1]["user"], self.fake.execs()[-1]["cwd"]), ("user", "/home/user"))
        sb.commands.run("pwd", cwd="/tmp")
        self.assertEqual(self.fake.execs()[-1]["cwd"], "/tmp")

    def test_an_image_without_the_account_keeps_its_own_user(self):
        self.fake.passwd = PASSWD_ROOT_ONLY
        sb = self.sandbox()
        sb.commands.run("whoami")
        self.assertEqual((self.fake.execs()[-1]["user"], self.fake.execs()[-1]["cwd"]), ("root", "/root"))
        self.assertEqual(sb.files.write("notes.txt", "hi").path, "/root/notes.txt")

    def test_relative_paths_resolve_against_home_and_files_go_to_the_user(self):
        sb = self.sandbox()
        info = sb.files.write("dir/a.txt", "data")
        self.assertEqual(info.path, "/home/user/dir/a.txt")
        chown = self.fake.execs()[-1]
        self.assertEqual(chown["user"], "root")
        self.assertIn("chown user: -- /home/user/dir/a.txt", chown["cmd"])
        infos = sb.files.write_files([{"path": "b", "data": b"x"}, forkd.WriteEntry("/abs/c", "y")])
        self.assertEqual([i.path for i in infos], ["/home/user/b", "/abs/c"])

    def test_a_command_timeout_is_a_timeout_exception_also_when_iterating(self):
        self.fake.exec_reply = lambda body: [
            {"type": "started", "pid": 7},
            {"type": "stdout", "data": base64.b64encode(b"partial").decode()},
            {"type": "exit", "exit_code": None, "signal": 9, "timed_out": True},
        ]
        sb = self.sandbox()
        with self.assertRaises(TimeoutException) as cm:
            sb.commands.run("sleep 10", timeout=2)
        self.assertEqual(cm.exception.stdout, "partial")
        handle = sb.commands.run("sleep 10", timeout=2, background=True)
        seen = []
        with self.assertRaises(TimeoutException):
            for stdout, stderr, pty in handle:
                seen.append((stdout, stderr, pty))
        self.assertEqual(seen, [("partial", None, None)])

    def test_an_exit_code_is_a_command_exit_exception_with_the_output(self):
        self.fake.exec_reply = lambda body: [
            {"type": "started", "pid": 7},
            {"type": "stderr", "data": base64.b64encode(b"bad\n").decode()},
            {"type": "exit", "exit_code": 3, "signal": None, "timed_out": False},
        ]
        with self.assertRaises(CommandExitException) as cm:
            self.sandbox().commands.run("exit 3")
        self.assertEqual((cm.exception.exit_code, cm.exception.stderr, cm.exception.stdout), (3, "bad\n", ""))

    def test_kill_of_a_missing_sandbox_is_false_and_get_info_not_found(self):
        self.assertFalse(Sandbox.kill("sb-zzzzzzzzzzzzzzzz", url=self.url, token="t"))
        with self.assertRaises(NotFoundException):
            Sandbox.get_info("sb-zzzzzzzzzzzzzzzz", url=self.url, token="t")

    def test_list_pages_with_the_paginator_and_sends_the_query(self):
        self.fake.sandboxes.clear()
        for i in range(5):
            self.fake.sandboxes["sb-b%015d" % i] = view("sb-b%015d" % i, metadata={"k": "v"})
        p = Sandbox.list(query=SandboxQuery(metadata={"k": "v"}, state=["running"]), limit=2, url=self.url,
                         token="t")
        pages = []
        while p.has_next:
            pages.append([s.sandbox_id for s in p.next_items()])
        self.assertEqual([len(x) for x in pages], [2, 2, 1])
        q = [q for (m, path, q, b) in self.fake.requests if m == "GET" and path == "/v1/sandboxes"][0]
        self.assertEqual((q["state"], q["metadata"], q["limit"]), (["running"], ["k=v"], ["2"]))
        self.assertEqual(len(Sandbox.list(url=self.url, token="t")), 5)

    def test_fork_returns_a_sandbox_or_an_error_per_fork(self):
        sb = self.sandbox(envs={"E": "1"})
        self.fake.fork_failures = [{"index": 1, "code": "vmm_error", "message": "no memory"}]
        out = sb.fork(count=3)
        self.assertEqual([type(x).__name__ for x in out], ["Sandbox", "ForkdError", "Sandbox"])
        branch = [b for (m, p, q, b) in self.fake.requests if p.endswith("/branch")][0]
        create = [b for (m, p, q, b) in self.fake.requests if m == "POST" and p == "/v1/sandboxes"][-1]
        self.assertEqual((create["snapshot_tag"], create["n"], create["env"]), (branch["tag"], 3, {"E": "1"}))

    def test_connect_resumes_a_paused_sandbox_and_pause_says_whether_it_paused(self):
        sid = "sb-aaaaaaaaaaaaaaaa"
        self.assertTrue(Sandbox.pause(sid, url=self.url, token="t"))
        self.assertFalse(Sandbox.pause(sid, url=self.url, token="t"))
        sb = Sandbox.connect(sid, url=self.url, token="t")
        self.assertEqual(self.fake.sandboxes[sid]["state"], "running")
        self.assertEqual(sb.sandbox_id, sid)

    def test_timeout_and_lifecycle_on_timeout_are_the_deadlines(self):
        self.sandbox(lifecycle={"on_timeout": "pause", "auto_resume": False}, timeout=60, idle_timeout=30)
        create = [b for (m, p, q, b) in self.fake.requests if m == "POST" and p == "/v1/sandboxes"][0]
        self.assertEqual((create["on_deadline"], create["deadline_ms"], create["timeout_ms"], create.get("on_idle")),
                         ("pause", 60000, 30000, None))

    def test_entry_info_has_e2b_fields(self):
        self.fake.exec_reply = lambda body: [
            {"type": "started", "pid": 9},
            {"type": "stdout", "data": base64.b64encode(b"user:user\n").decode()},
            {"type": "exit", "exit_code": 0, "signal": None, "timed_out": False},
        ]
        info = self.sandbox().files.get_info("/home/user/f")
        self.assertEqual((info.name, info.type, info.size, info.mode, info.permissions, info.owner, info.group),
                         ("f", forkd.FileType.FILE, 4, 0o644, "-rw-r--r--", "user", "user"))

    def test_pty_runs_on_a_terminal_and_its_output_is_bytes(self):
        self.fake.exec_reply = lambda body: [
            {"type": "started", "pid": 7},
            {"type": "stdout", "data": base64.b64encode(b"\x1b[1mhi\r\n").decode()},
            {"type": "exit", "exit_code": 0, "signal": None, "timed_out": False},
        ]
        sb = self.sandbox()
        got = []
        h = sb.pty.create(forkd.PtySize(rows=24, cols=80), on_data=got.append)
        body = self.fake.execs()[-1]
        self.assertEqual(body["pty"], {"rows": 24, "cols": 80})
        self.assertNotIn("keep_stdin_open", body)
        self.assertEqual(h.wait().exit_code, 0)
        self.assertEqual((got, h.stdout), ([b"\x1b[1mhi\r\n"], ""))
        sb.pty.resize(7, {"rows": 50, "cols": 132})
        r = [b for (m, p, q, b) in self.fake.requests if p.endswith("/commands/7/resize")]
        self.assertEqual(r, [{"rows": 50, "cols": 132}])

    def test_watch_dir_names_events_under_the_directory_and_stop_returns_at_once(self):
        import time
        sb = self.sandbox()
        w = sb.files.watch_dir("w", recursive=True)
        q = [q for (m, p, q, b) in self.fake.requests if p.endswith("/files/watch")][0]
        self.assertEqual((q["path"], q["recursive"]), (["/home/user/w"], ["1"]))
        deadline = time.monotonic() + 5
        seen = []
        while len(seen) < 2 and time.monotonic() < deadline:
            seen += w.get_new_events()
            time.sleep(0.05)
        self.assertEqual([(e.name, e.type) for e in seen], [("a.txt", "create"), ("sub/b", "write")])
        t0 = time.monotonic()
        w.stop()  # while the daemon holds the stream open
        self.assertLess(time.monotonic() - t0, 5)


class WebhookSignatureTest(unittest.TestCase):
    # The daemon's own signature of this body at this time (src/webhooks/signature.ts).
    SIG = "v1=76b63ef3661c69438a4bb1a7461b4cf04800ea2500e7a88f0b073a7e46dbee98"

    def test_verify_webhook_accepts_the_daemons_signature_and_refuses_changes(self):
        h = {"Forkd-Signature": self.SIG, "forkd-timestamp": "1700000000"}
        self.assertTrue(forkd.verify_webhook("s" * 20, h, b'{"a":1}', now_s=1700000010))
        self.assertFalse(forkd.verify_webhook("s" * 20, h, b'{"a":2}', now_s=1700000010))
        self.assertFalse(forkd.verify_webhook("t" * 20, h, b'{"a":1}', now_s=1700000010))
        self.assertFalse(forkd.verify_webhook("s" * 20, h, b'{"a":1}', now_s=1700001000))
        self.assertFalse(forkd.verify_webhook("s" * 20, {}, b'{"a":1}', now_s=1700000010))


if __name__ == "__main__":
    unittest.main()
