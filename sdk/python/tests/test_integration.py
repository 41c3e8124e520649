"""The Python SDK against a real forkd daemon with real VMs.

Run by test/integration/sdk-python.test.ts after `pip install ./sdk/python` into a fresh venv;
the daemon is found through FORKD_SOCKET. Needs the snapshot named by FORKD_TEST_SNAPSHOT, made
with warm_eval "seed_value = 41".
"""

import hashlib
import os
import time
import unittest

import forkd
from forkd import (CommandExitError, Controller, InvalidArgumentError, NotFoundError, NotFoundException, Sandbox,
                   SandboxQuery,
                   TimeoutError, fork)

SNAP = os.environ["FORKD_TEST_SNAPSHOT"]


class SandboxTest(unittest.TestCase):
    sb = None

    @classmethod
    def setUpClass(cls):
        cls.sb = Sandbox(snapshot=SNAP, metadata={"suite": "py"})

    @classmethod
    def tearDownClass(cls):
        if cls.sb is not None:
            cls.sb.kill()

    def test_01_info_and_list(self):
        info = self.sb.get_info()
        self.assertEqual(info.snapshot, SNAP)
        self.assertEqual(info.state, "running")
        self.assertEqual(info.metadata, {"suite": "py"})
        self.assertEqual(sorted(info.timings), ["launch_ms", "ready_ms", "restore_ms", "total_ms"])
        self.assertGreater(info.timings["total_ms"], 0)
        self.assertTrue(self.sb.is_running())
        self.assertEqual([s.sandbox_id for s in Sandbox.list(metadata={"suite": "py"})], [self.sb.sandbox_id])
        self.assertEqual(Sandbox.connect(self.sb.sandbox_id).sandbox_id, self.sb.sandbox_id)

    def test_02_commands(self):
        r = self.sb.commands.run("echo out; echo err >&2; echo $GREETING; pwd", envs={"GREETING": "héllo"}, cwd="/tmp")
        self.assertEqual((r.exit_code, r.stdout, r.stderr), (0, "out\nhéllo\n/tmp\n", "err\n"))
        self.assertEqual(self.sb.commands.run("tr a-z A-Z", stdin="shout").stdout, "SHOUT")
        self.assertEqual(self.sb.commands.run(["printf", "%s|", "a b", "c"]).stdout, "a b|c|")
        with self.assertRaises(CommandExitError) as cm:
            self.sb.commands.run("echo no >&2; exit 3")
        self.assertEqual((cm.exception.exit_code, cm.exception.stderr), (3, "no\n"))
        with self.assertRaises(CommandExitError) as cm:
            self.sb.commands.run("sleep 10", timeout=0.5)
        self.assertTrue(cm.exception.result.timed_out)

    def test_03_streaming_callbacks_fire_while_running(self):
        seen = []
        t0 = time.monotonic()
        r = self.sb.commands.run("echo first; sleep 2; echo second", on_stdout=lambda s: seen.append((time.monotonic() - t0, s)))
        end = time.monotonic() - t0
        self.assertEqual(r.stdout, "first\nsecond\n")
        self.assertEqual(seen[0][1], "first\n")
        self.assertLess(seen[0][0], end - 1.0, seen)

    def test_04_background_commands(self):
        cat = self.sb.commands.run("cat", background=True, stdin=True)
        self.assertGreater(cat.pid, 1)
        self.assertTrue(any(p.pid == cat.pid and p.stdin_open for p in self.sb.commands.list()))
        cat.send_stdin("hello ")
        cat.send_stdin(b"world")
        cat.close_stdin()
        self.assertEqual(cat.wait().stdout, "hello world")
        sleeper = self.sb.commands.run("sleep 600", background=True, timeout=0)
        self.assertTrue(any(p.pid == sleeper.pid for p in self.sb.commands.list()))
        self.assertTrue(sleeper.kill())
        with self.assertRaises(CommandExitError) as cm:
            sleeper.wait()
        self.assertEqual(cm.exception.result.signal, 9)
        self.assertFalse(any(p.pid == sleeper.pid for p in self.sb.commands.list()))
        self.assertFalse(self.sb.commands.kill(sleeper.pid))

    def test_05_files(self):
        w = self.sb.files.write("/root/notes/a.txt", "grüße\n")
        self.assertEqual((w.path, w.name), ("/root/notes/a.txt", "a.txt"))
        self.assertEqual(self.sb.files.read("/root/notes/a.txt"), "grüße\n")
        every = bytes(range(256))
        self.sb.files.write("/root/bytes.bin", every)
        self.assertEqual(self.sb.files.read("/root/bytes.bin", format="bytes"), every)
        big = os.urandom(10 << 20)
        self.assertEqual(self.sb.files.write("/root/big.bin", big).size, len(big))
        back = self.sb.files.read("/root/big.bin", format="bytes")
        self.assertEqual(hashlib.sha256(back).hexdigest(), hashlib.sha256(big).hexdigest())
        streamed = b"".join(self.sb.files.read("/root/big.bin", format="stream"))
        self.assertEqual(len(streamed), len(big))
        # A generator is streamed to the guest, not held whole.
        self.sb.files.write("/root/gen.bin", (bytes([i]) * 65536 for i in range(32)))
        gen = self.sb.files.get_info("/root/gen.bin")
        self.assertEqual(gen.size, 32 * 65536)
        self.assertGreater(gen.modified_time.year, 2000)  # read from the stat's mtime_ms
        names = {"%s:%s" % (e.name, e.type) for e in self.sb.files.list("/root")}
        self.assertTrue({"notes:dir", "big.bin:file"} <= names, names)
        self.assertTrue(self.sb.files.exists("/root/notes/a.txt"))
        self.assertFalse(self.sb.files.exists("/root/nope"))
        self.assertTrue(self.sb.files.make_dir("/root/x/y/z"))
        self.assertFalse(self.sb.files.make_dir("/root/x/y/z"))
        moved = self.sb.files.rename("/root/notes/a.txt", "/root/x/a.txt")
        self.assertEqual((moved.path, moved.type), ("/root/x/a.txt", "file"))
        self.sb.files.remove("/root/x")
        self.assertFalse(self.sb.files.exists("/root/x"))
        with self.assertRaises(NotFoundError):
            self.sb.files.read("/root/x/a.txt")

    def test_06_run_code(self):
        a = self.sb.run_code("import math\nr = 3\nprint('radius', r)\nround(math.pi * r * r, 2)")
        self.assertEqual(a.text, "28.27")
        self.assertEqual(a.logs.stdout, ["radius 3\n"])
        self.assertIsNone(a.error)
        self.assertEqual(self.sb.run_code("r * 2").text, "6")
        c = self.sb.run_code("def f():\n    return 1 / 0\nf()")
        self.assertEqual(c.error.name, "ZeroDivisionError")
        self.assertIn("return 1 / 0", c.error.traceback)
        self.assertIsNone(c.text)
        self.assertEqual(self.sb.run_code("seed_value").text, "41", "the snapshot's globals are inherited")
        with self.assertRaises(InvalidArgumentError):
            self.sb.run_code("1", language="cobol")

    def test_07_matplotlib_png(self):
        r = self.sb.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nNone", timeout=120)
        self.assertIsNone(r.error, r.error and r.error.traceback)
        pngs = [x.png for x in r.results if x.png]
        self.assertTrue(pngs, r.results)
        import base64
        self.assertEqual(base64.b64decode(pngs[0])[1:4], b"PNG")

    def test_08_errors_are_typed(self):
        with self.assertRaises(NotFoundError):
            Sandbox.connect("sb-aaaaaaaaaaaaaaaa")
        with self.assertRaises(InvalidArgumentError):
            Sandbox.connect("../../etc")
        with self.assertRaises(NotFoundError):
            Sandbox(snapshot="no-such-snapshot")
        with self.assertRaises(NotFoundError):  # E2B's layout: under the user's home (root's here)
            self.sb.files.read("relative/path")
        self.assertFalse(Sandbox.kill("sb-aaaaaaaaaaaaaaaa"))
        with self.assertRaises(forkd.ConnectionError):
            list(Sandbox.list(socket_path="/nonexistent/forkd.sock"))  # a paginator: read when iterated
        with self.assertRaises(TimeoutError):  # also the built-in TimeoutError
            self.sb.run_code("import time; time.sleep(5)", request_timeout=1)


class ForkAndLifecycleTest(unittest.TestCase):
    def test_fork_children_inherit_and_diverge(self):
        kids = fork(SNAP, 3)
        try:
            self.assertEqual([k.run_code("seed_value").text for k in kids], ["41"] * 3)
            for i, k in enumerate(kids):
                k.run_code("seed_value = %d" % (i * 100))
            self.assertEqual([k.run_code("seed_value").text for k in kids], ["0", "100", "200"])
        finally:
            for k in kids:
                k.kill()

    def test_branch(self):
        with Sandbox(snapshot=SNAP) as sb:
            sb.files.write("/root/step.txt", "after step 1")
            sb.run_code("plan = ['explore', 'exploit']")
            b = sb.branch(tag="py-branch")
            self.assertEqual((b.tag, b.status), ("py-branch", "ready"))
            self.assertGreater(b.pause_ms, 0)
            sb.run_code("plan.append('later')")
            kids = fork("py-branch", 2)
            try:
                for k in kids:
                    self.assertEqual(k.files.read("/root/step.txt"), "after step 1")
                    self.assertEqual(k.run_code("len(plan)").text, "2")
            finally:
                for k in kids:
                    k.kill()
            self.assertEqual(sb.run_code("len(plan)").text, "3")

    def test_context_manager_kills(self):
        with Sandbox.create(snapshot=SNAP) as sb:
            sid = sb.sandbox_id
            self.assertEqual(sb.commands.run("echo hi").stdout, "hi\n")
        self.assertFalse(any(s.sandbox_id == sid for s in Sandbox.list()))

    def test_idle_timeout(self):
        sb = Sandbox(snapshot=SNAP, idle_timeout=60)
        try:
            self.assertEqual(sb.get_info().idle_timeout, 60)
            sb.set_idle_timeout(3)
            for _ in range(4):
                sb.commands.run("true")
                time.sleep(1)
            self.assertTrue(sb.is_running())
            time.sleep(6)
            info = sb.get_info()
            self.assertEqual((info.state, info.exit_reason), ("exited", "idle timeout"))
        finally:
            sb.kill()

    def test_deadline_kills_a_busy_sandbox(self):
        # E2B's timeout is absolute: a sandbox busy all the while ends at its deadline
        sb = Sandbox(snapshot=SNAP, timeout=600, idle_timeout=600, lifecycle={"on_timeout": "kill"})
        try:
            info = sb.get_info()
            self.assertIsNotNone(info.deadline)
            self.assertEqual((info.idle_timeout, info.lifecycle["on_timeout"]), (600, "kill"))
            busy = sb.commands.run("sleep 600", background=True, timeout=0)
            sb.set_timeout(3)
            info = sb.get_info()
            self.assertEqual(info.end_at, info.deadline)
            state = info.state
            for _ in range(120):
                if state != "running":
                    break
                time.sleep(0.5)
                state = sb.get_info().state
            info = sb.get_info()
            self.assertEqual(info.state, "exited")
            self.assertIn("deadline", info.exit_reason)
            with self.assertRaises(forkd.ForkdError):
                busy.wait()
        finally:
            sb.kill()

    def test_controller(self):
        c = Controller()
        self.assertTrue(c.health()["ok"])
        self.assertIn(SNAP, [s["tag"] for s in c.list_snapshots()])
        snap = c.get_snapshot(SNAP)
        self.assertEqual(snap["tag"], SNAP)
        self.assertGreater(snap["machine"]["memory_mib"], 0)
        self.assertGreater(snap["timings"]["boot_ms"], 0)
        with self.assertRaises(InvalidArgumentError):
            c.create_snapshot("bad tag!")


class E2BSurfaceTest(unittest.TestCase):
    """E2B's behaviours, as its own suites check them, with forkd's template (no `user` account)."""

    def test_envs_user_layout_and_errors(self):
        with Sandbox(snapshot=SNAP, envs={"SB_ENV": "from-create"}, metadata={"suite": "py-e2b"}) as sb:
            self.assertEqual(sb.commands.run("echo $SB_ENV").stdout, "from-create\n")
            self.assertEqual(sb.commands.run("echo $SB_ENV", envs={"SB_ENV": "mine"}).stdout, "mine\n")
            self.assertEqual(sb.commands.run("id -un", user="nobody").stdout, "nobody\n")
            self.assertEqual(sb.commands.run("pwd").stdout, "/root\n")
            with self.assertRaises(forkd.TimeoutException):
                sb.commands.run("sleep 10", timeout=1)
            handle = sb.commands.run("sleep 10", timeout=1, background=True)
            with self.assertRaises(forkd.TimeoutException):
                for _ in handle:
                    pass
            with self.assertRaises(forkd.CommandExitException) as cm:
                sb.commands.run("echo o; echo e >&2; exit 4")
            self.assertEqual((cm.exception.exit_code, cm.exception.stdout, cm.exception.stderr), (4, "o\n", "e\n"))
            # files: relative to the home, E2B's EntryInfo
            self.assertEqual(sb.files.write("rel.txt", "test").path, "/root/rel.txt")
            info = sb.files.get_info("rel.txt")
            self.assertEqual((info.name, info.type, info.size, info.mode, info.permissions, info.owner, info.group),
                             ("rel.txt", forkd.FileType.FILE, 4, 0o644, "-rw-r--r--", "root", "root"))
            self.assertTrue(sb.files.make_dir("d1/d2"))
            self.assertFalse(sb.files.make_dir("d1/d2"))
            d = sb.files.get_info("d1")
            self.assertEqual((d.type, d.size, d.permissions[0]), ("dir", 0, "d"))
            self.assertEqual([i.path for i in sb.files.write_files([{"path": "d1/a", "data": "a"},
                                                                    forkd.WriteEntry("/tmp/b", b"b")])],
                             ["/root/d1/a", "/tmp/b"])
            self.assertEqual(sorted(e.name for e in sb.files.list("d1", depth=2)), ["a", "d2"])
            with self.assertRaises(NotFoundException):
                sb.files.get_info("no-such-file")
            # gzip uploads (E2B's use_gzip): bytes and a stream, stored decompressed
            text = "gzipped " * 50000
            self.assertEqual(sb.files.write("gz.txt", text, use_gzip=True).path, "/root/gz.txt")
            self.assertEqual(sb.files.read("gz.txt"), text)
            parts = [b"a" * (1 << 20), b"end"]
            sb.files.write("/tmp/gz.bin", iter(parts), use_gzip=True)
            self.assertEqual(sb.files.read("/tmp/gz.bin", format="bytes"), b"".join(parts))
            # iterating a background command, and following it with commands.connect
            h = sb.commands.run("for i in 1 2 3; do echo $i; sleep 0.3; done", background=True)
            follower = sb.commands.connect(h.pid)
            self.assertEqual("".join(out for out, _, _ in h if out), "1\n2\n3\n")
            tail = follower.wait()  # what came after the connect
            self.assertEqual(tail.exit_code, 0)
            self.assertTrue("1\n2\n3\n".endswith(tail.stdout), tail.stdout)
            # a command started by this object, attached to from another one (Sandbox.connect): the
            # output from the attach on and the exit reach both; kill() from the attached side kills it
            other = Sandbox.connect(sb.sandbox_id)
            bg = sb.commands.run("read x; echo got $x; echo err >&2; exit 3", background=True, stdin=True)
            live = []
            far = other.commands.connect(bg.pid, on_stdout=live.append)
            other.commands.send_stdin(bg.pid, "hi\n")
            with self.assertRaises(CommandExitError) as cm:
                far.wait()
            self.assertEqual((cm.exception.exit_code, cm.exception.stdout, cm.exception.stderr), (3, "got hi\n", "err\n"))
            self.assertEqual("".join(live), "got hi\n")
            with self.assertRaises(CommandExitError):
                bg.wait()
            sleeper = sb.commands.run("sleep 600", background=True)
            first = other.commands.connect(sleeper.pid)
            second = other.commands.connect(sleeper.pid)
            self.assertTrue(second.kill())
            for w in (sleeper, first, second):
                with self.assertRaises(CommandExitError) as cm:
                    w.wait()
                self.assertEqual(cm.exception.result.signal, 9)
            with self.assertRaises(NotFoundException):
                other.commands.connect(sleeper.pid)

    def test_lifecycle_list_metrics_fork_snapshots(self):
        sb = Sandbox(snapshot=SNAP, envs={"SB_ENV": "e"}, metadata={"suite": "py-e2b-life"})
        try:
            p = Sandbox.list(query=SandboxQuery(metadata={"suite": "py-e2b-life"}, state=["running"]), limit=1)
            ids = []
            while p.has_next:
                ids += [s.sandbox_id for s in p.next_items()]
            self.assertEqual(ids, [sb.sandbox_id])
            m = sb.get_metrics()
            self.assertEqual(len(m), 1)
            self.assertGreaterEqual(m[0].cpu_count, 1)
            self.assertGreater(m[0].mem_used, 0)
            sb.files.write("/root/state.txt", "kept")
            forks = sb.fork(count=2)
            self.assertEqual([type(f).__name__ for f in forks], ["Sandbox", "Sandbox"])
            for f in forks:
                self.assertEqual(f.commands.run("cat /root/state.txt; echo $SB_ENV").stdout, "kepte\n")
                f.kill()
            snap = sb.create_snapshot()
            self.assertIn(snap.snapshot_id, [s.snapshot_id for s in sb.list_snapshots()])
            self.assertTrue(sb.pause())
            self.assertFalse(Sandbox.pause(sb.sandbox_id))
            self.assertIn(sb.sandbox_id, [s.sandbox_id for s in Sandbox.list(query={"state": ["paused"]})])
            back = Sandbox.connect(sb.sandbox_id)
            self.assertEqual(back.get_info().state, "running")
            self.assertEqual(back.files.read("/root/state.txt"), "kept")
        finally:
            self.assertTrue(Sandbox.kill(sb.sandbox_id))
        self.assertFalse(Sandbox.kill(sb.sandbox_id))


class TerminalAndWatchTest(unittest.TestCase):
    """pty and watch_dir over the daemon's exec pty/resize and files/watch routes."""

    def test_pty(self):
        with Sandbox(snapshot=SNAP) as sb:
            out = []
            h = sb.pty.create(forkd.PtySize(rows=24, cols=80), on_data=out.append, timeout=60)
            sb.pty.resize(h.pid, {"rows": 40, "cols": 100})
            sb.pty.send_stdin(h.pid, b"stty size; echo marker-$((6*7))\nexit\n")
            self.assertEqual(h.wait().exit_code, 0)
            text = b"".join(out).decode("utf-8", "replace")
            self.assertIn("40 100", text)
            self.assertIn("marker-42", text)

    def test_watch_dir(self):
        with Sandbox(snapshot=SNAP) as sb:
            sb.files.make_dir("/root/w")
            w = sb.files.watch_dir("/root/w", recursive=True)
            sb.files.write("/root/w/a.txt", "x")
            sb.commands.run("mkdir /root/w/sub && echo y > /root/w/sub/b.txt")
            deadline = time.monotonic() + 20
            seen = []
            while time.monotonic() < deadline and not any(e.name == "sub/b.txt" for e in seen):
                seen += w.get_new_events()
                time.sleep(0.2)
            w.stop()
            names = {(e.name, e.type) for e in seen}
            self.assertIn(("sub/b.txt", forkd.FilesystemEventType.CREATE), names, seen)
            self.assertTrue(any(n == "a.txt" for n, _ in names), seen)


class CodeContextsTest(unittest.TestCase):
    """run_code contexts, per-cell envs and streamed output (the daemon's contexts and
    eval/stream routes)."""

    def test_contexts_envs_and_streamed_output(self):
        with Sandbox(snapshot=SNAP, envs={"SB_ENV": "sandbox"}) as sb:
            ctx = sb.create_code_context()
            self.assertIn(ctx.id, [c.id for c in sb.list_code_contexts()])
            sb.run_code("x = 1", context=ctx)
            self.assertIsNone(sb.run_code("'x' in globals() or None").text)  # the default context has no x
            ex = sb.run_code("x + 1", context=ctx)
            self.assertEqual((ex.text, ex.execution_count), ("2", 2))
            seen = []
            ex = sb.run_code("import os; print(os.environ.get('SB_ENV'), os.environ.get('CELL'))",
                             envs={"CELL": "only-here"}, on_stdout=seen.append)
            self.assertEqual("".join(seen), "sandbox only-here\n")
            self.assertEqual(sb.run_code("import os; os.environ.get('CELL')").text, None)
            sb.remove_code_context(ctx)
            self.assertNotIn(ctx.id, [c.id for c in sb.list_code_contexts()])


if __name__ == "__main__":
    unittest.main(verbosity=2)
