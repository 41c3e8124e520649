#!/usr/bin/env python3
"""Host-side tests for forkd-agent (standard library only).

Runs `forkd-agent --fd N --no-init` on one end of a socketpair and speaks the protocol of
docs/agent-protocol.md on the other end. Usage: test_agent.py PATH-TO-AGENT
Environment: AGENT_WRAPPER (e.g. "valgrind -q") is prefixed to the agent command line.
"""

import json
import os
import queue
import shlex
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EVALSRV = os.path.join(HERE, "..", "..", "evalsrv", "forkd_eval.py")
PYTHON = "/usr/bin/python3"

# types
PING, IDENTITY, SYNC, WINDOW, CANCEL, STREAMS = 0x01, 0x02, 0x03, 0x04, 0x05, 0x06
EXEC, STDIN, SIGNAL, RESIZE = 0x10, 0x11, 0x12, 0x13
READ, WRITE_OPEN, WRITE_DATA, WRITE_END = 0x20, 0x21, 0x22, 0x23
LIST, STAT, MKDIR, REMOVE, RENAME, WATCH, EVAL = 0x24, 0x25, 0x26, 0x27, 0x28, 0x29, 0x30
WATCH_EVENT = 0x94
OK, DATA, END, ERROR, STARTED, STDOUT, STDERR, EXIT = 0x81, 0x82, 0x83, 0x8F, 0x90, 0x91, 0x92, 0x93
TERMINAL = {OK, END, ERROR, EXIT}
# tags
ARG, ENV, CWD, SHELL, TIMEOUT_MS, STDIN_F, PATH, PATH2, MODE, FLAGS, DATA_F, CODE = range(1, 13)
SEED, TIME_NS, HOSTNAME, SANDBOX_ID, SIGNAL_F, WINDOW_F, USER, LANGUAGE = 13, 14, 15, 16, 17, 20, 21, 22
PTY_ROWS, PTY_COLS, RECURSIVE, EVENT = 23, 24, 25, 26
VERSION, PID, EXIT_CODE, EXIT_SIGNAL, TIMED_OUT, ERRNO, MESSAGE = 32, 33, 34, 35, 36, 37, 38
SIZE, MTIME_NS, FILE_TYPE, NAME, JSON_F, UPTIME_MS, EVAL_READY, KERNELS = 39, 40, 41, 42, 44, 45, 46, 47
STREAM_F, KIND, PTY_F = 48, 49, 50
FEATURES = 51
INT_TAGS = {TIMEOUT_MS, STDIN_F, MODE, FLAGS, TIME_NS, SIGNAL_F, WINDOW_F, VERSION, PID, EXIT_CODE,
            EXIT_SIGNAL, TIMED_OUT, ERRNO, SIZE, MTIME_NS, FILE_TYPE, UPTIME_MS, EVAL_READY,
            PTY_ROWS, PTY_COLS, RECURSIVE, STREAM_F, KIND, PTY_F}
MAX_FRAME = 1024 * 1024 + 64


def field(tag, value):
    if isinstance(value, int):
        value = struct.pack(">q", value)
    elif isinstance(value, str):
        value = value.encode()
    return struct.pack(">BI", tag, len(value)) + value


def frame(ftype, stream, fields=()):
    payload = b"".join(field(t, v) for t, v in fields)
    return struct.pack(">IBI", 5 + len(payload), ftype, stream) + payload


def parse_fields(payload):
    out, off = [], 0
    while off < len(payload):
        tag, n = struct.unpack_from(">BI", payload, off)
        off += 5
        v = payload[off:off + n]
        off += n
        out.append((tag, struct.unpack(">q", v)[0] if tag in INT_TAGS else v))
    return out


class Frame:
    def __init__(self, ftype, stream, fields):
        self.type, self.stream, self.fields = ftype, stream, fields

    def get(self, tag, default=None):
        for t, v in self.fields:
            if t == tag:
                return v
        return default

    def all(self, tag):
        return [v for t, v in self.fields if t == tag]

    def __repr__(self):
        return "Frame(0x%02x, %d, %r)" % (self.type, self.stream, self.fields[:6])


# An empty config dir and no JavaScript kernel source: today's defaults, whatever the host has.
NO_CONFIG = os.path.join(tempfile.gettempdir(), "forkd-agent-test-no-config")
BASE_ARGS = ["--config-dir", NO_CONFIG, "--evalsrv", EVALSRV, "--python", PYTHON,
             "--evaljs", os.path.join(NO_CONFIG, "none.js")]


class Agent:
    def __init__(self, binary, args=BASE_ARGS):
        self.sock, child = socket.socketpair()
        wrapper = shlex.split(os.environ.get("AGENT_WRAPPER", ""))
        cmd = wrapper + [binary, "--fd", str(child.fileno()), "--no-init"] + list(args)
        self.proc = subprocess.Popen(cmd, pass_fds=[child.fileno()])
        child.close()
        self.queues = {}
        self.lock = threading.Lock()
        self.next_stream = 1
        self.wlock = threading.Lock()
        threading.Thread(target=self._reader, daemon=True).start()

    def q(self, stream):
        with self.lock:
            return self.queues.setdefault(stream, queue.Queue())

    def _recv_exact(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf

    def _reader(self):
        try:
            while True:
                (length,) = struct.unpack(">I", self._recv_exact(4))
                assert 5 <= length <= MAX_FRAME, length
                body = self._recv_exact(length)
                f = Frame(body[0], struct.unpack(">I", body[1:5])[0], parse_fields(body[5:]))
                self.q(f.stream).put(f)
        except (EOFError, OSError):
            pass

    def stream(self):
        with self.lock:
            s = self.next_stream
            self.next_stream += 1
            return s

    def send(self, ftype, stream, fields=()):
        self.send_raw(frame(ftype, stream, fields))

    def send_raw(self, data):
        with self.wlock:
            self.sock.sendall(data)

    def recv(self, stream, timeout=10):
        try:
            return self.q(stream).get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("timeout waiting on stream %d" % stream)

    def until_end(self, stream, timeout=20):
        frames, deadline = [], time.time() + timeout
        while True:
            f = self.recv(stream, max(0.1, deadline - time.time()))
            frames.append(f)
            if f.type in TERMINAL:
                return frames

    def call(self, ftype, fields=(), timeout=20):
        s = self.stream()
        self.send(ftype, s, fields)
        return self.until_end(s, timeout)[-1]

    def run(self, fields, timeout=20):
        """EXEC; returns (stdout, stderr, exit frame, all frames)."""
        s = self.stream()
        self.send(EXEC, s, fields)
        frames = self.until_end(s, timeout)
        out = b"".join(f.get(DATA_F) for f in frames if f.type == STDOUT)
        err = b"".join(f.get(DATA_F) for f in frames if f.type == STDERR)
        return out, err, frames[-1], frames

    def eval(self, code, timeout_ms=None, language=None):
        fields = [(CODE, code)] + ([(TIMEOUT_MS, timeout_ms)] if timeout_ms else [])
        fields += [(LANGUAGE, language)] if language else []
        f = self.call(EVAL, fields, timeout=30)
        return f, json.loads(f.get(JSON_F)) if f.get(JSON_F) is not None else None

    def close(self):
        self.sock.close()
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(10)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def expect_error(f, errno_value, what):
    check(f.type == ERROR and f.get(ERRNO) == errno_value,
          "%s: expected ERROR %d, got %r" % (what, errno_value, f))


# ---------------------------------------------------------------------------- tests

def t_ping(a):
    f = a.call(PING)
    check(f.type == OK and f.get(VERSION) == 1 and f.get(UPTIME_MS) >= 0, f)
    check(f.get(KERNELS) == b"python", "kernels %r" % f.get(KERNELS))
    check(b"file-user" in f.get(FEATURES, b"").split(b","), "features %r" % f.get(FEATURES))
    deadline = time.time() + 20
    while a.call(PING).get(EVAL_READY) != 1:
        check(time.time() < deadline, "eval server never became ready")
        time.sleep(0.1)


def t_exec_basic(a, tmp):
    out, err, ex, frames = a.run([(ARG, "echo"), (ARG, "hello world")])
    check(frames[0].type == STARTED and frames[0].get(PID) > 0, frames[0])
    check(out == b"hello world\n" and ex.get(EXIT_CODE) == 0 and ex.get(TIMED_OUT) == 0, ex)
    out, err, ex, _ = a.run([(SHELL, "echo out; echo err >&2; exit 3")])
    check(out == b"out\n" and err == b"err\n" and ex.get(EXIT_CODE) == 3, (out, err, ex))
    out, _, _, _ = a.run([(SHELL, "echo $FOO:$HOME:$LANG; pwd"), (ENV, "FOO=bar=baz"),
                          (ENV, "HOME=/nowhere"), (CWD, tmp)])
    check(out == ("bar=baz:/nowhere:C.UTF-8\n%s\n" % tmp).encode(), out)
    out, _, _, _ = a.run([(SHELL, "pwd; echo $PATH")])
    check(out == b"/root\n/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n", out)
    f = a.call(EXEC, [(ARG, "/nonexistent/binary")])
    expect_error(f, 2, "exec of missing binary")
    f = a.call(EXEC, [(ARG, "true"), (CWD, "/nonexistent")])
    expect_error(f, 2, "exec with missing cwd")
    expect_error(a.call(EXEC, [(ENV, "A=1")]), 22, "exec without ARG")
    expect_error(a.call(EXEC, [(ARG, "a\0b")]), 22, "ARG with NUL")


def t_streaming(a):
    s = a.stream()
    a.send(EXEC, s, [(SHELL, "echo a; sleep 1; echo b")])
    check(a.recv(s).type == STARTED, "started")
    t0 = time.time()
    f = a.recv(s)
    check(f.type == STDOUT and f.get(DATA_F) == b"a\n", f)
    check(time.time() - t0 < 0.8, "first chunk arrived only at the end")
    rest = a.until_end(s)
    check(rest[-1].type == EXIT and time.time() - t0 >= 0.9, rest)


def t_stdin(a):
    s = a.stream()
    a.send(EXEC, s, [(ARG, "cat"), (STDIN_F, 1)])
    check(a.recv(s).type == STARTED, "started")
    blob = bytes(range(256)) * 1024
    for i in range(0, len(blob), 50000):
        a.send(STDIN, s, [(DATA_F, blob[i:i + 50000])])
    a.send(STDIN, s, [])
    frames = a.until_end(s)
    out = b"".join(f.get(DATA_F) for f in frames if f.type == STDOUT)
    check(out == blob and frames[-1].get(EXIT_CODE) == 0, (len(out), frames[-1]))
    out, _, ex, _ = a.run([(ARG, "cat")])  # no STDIN: /dev/null
    check(out == b"" and ex.get(EXIT_CODE) == 0, ex)


def gone(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(") ")[1][0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        # Gone between the open and the read: a reaped process's stat reads as ESRCH.
        return True


def t_timeout(a):
    t0 = time.time()
    out, _, ex, _ = a.run([(SHELL, "sleep 100 & echo $!; sleep 100"), (TIMEOUT_MS, 500)])
    check(ex.get(TIMED_OUT) == 1 and ex.get(EXIT_SIGNAL) == 9, ex)
    check(time.time() - t0 < 5, "timeout took too long")
    bg = int(out)
    deadline = time.time() + 5
    while not gone(bg):
        check(time.time() < deadline, "background child %d survived the timeout" % bg)
        time.sleep(0.05)
    # background process keeping the pipes open does not hold the exec open
    t0 = time.time()
    out, _, ex, _ = a.run([(SHELL, "sleep 3 & echo done")])
    check(out == b"done\n" and ex.get(EXIT_CODE) == 0 and time.time() - t0 < 2, ex)


def t_signal(a):
    s = a.stream()
    a.send(EXEC, s, [(ARG, "sleep"), (ARG, "100")])
    check(a.recv(s).type == STARTED, "started")
    a.send(SIGNAL, s, [(SIGNAL_F, 15)])
    ex = a.until_end(s)[-1]
    check(ex.type == EXIT and ex.get(EXIT_SIGNAL) == 15 and ex.get(TIMED_OUT) == 0, ex)
    _, _, ex, _ = a.run([(SHELL, "kill -9 $$")])
    check(ex.get(EXIT_SIGNAL) == 9 and ex.get(EXIT_CODE) is None, ex)


def t_concurrent(a):
    streams = []
    for i in range(50):
        s = a.stream()
        a.send(EXEC, s, [(SHELL, "sleep 0.5; echo %d" % i)])
        streams.append(s)
    t0 = time.time()
    for i, s in enumerate(streams):
        frames = a.until_end(s)
        out = b"".join(f.get(DATA_F) for f in frames if f.type == STDOUT)
        check(out == b"%d\n" % i and frames[-1].get(EXIT_CODE) == 0, frames)
    check(time.time() - t0 < 10, "concurrent execs were serialised")


def t_big_output(a):
    out, _, ex, _ = a.run([(SHELL, "head -c 20000000 /dev/zero")], timeout=60)
    check(len(out) == 20000000 and ex.get(EXIT_CODE) == 0, (len(out), ex))


def quiet(a, stream, secs):
    """Nothing arrives on `stream` for `secs`."""
    try:
        f = a.q(stream).get(timeout=secs)
    except queue.Empty:
        return
    raise AssertionError("frame past the window: %r" % f)


def data_of(frames, types=(STDOUT, STDERR, DATA)):
    return sum(len(f.get(DATA_F)) for f in frames if f.type in types)


def take(a, stream, n, timeout=20):
    """Frames of `stream` until `n` output bytes came (not more), or its terminal frame."""
    frames, got, deadline = [], 0, time.time() + timeout
    while got < n:
        f = a.recv(stream, max(0.1, deadline - time.time()))
        frames.append(f)
        got += data_of([f])
        if f.type in TERMINAL:
            break
    check(got == n, "%d bytes within a window of %d" % (got, n))
    return frames


def t_window_exec(a):
    """A paced exec sends no more than its window; credit releases the rest; others run on."""
    total, w = 3000000, 100000
    s = a.stream()
    a.send(EXEC, s, [(SHELL, "head -c %d /dev/zero; echo tail >&2" % total), (WINDOW_F, w)])
    st = a.recv(s)
    check(st.type == STARTED and st.get(WINDOW_F) == w, "STARTED echoes the window: %r" % st)
    got = take(a, s, w)
    check(all(f.type == STDOUT for f in got), got)
    quiet(a, s, 0.7)
    # Another stream is not held up by the stalled one.
    out, _, ex, _ = a.run([(SHELL, "echo other")], timeout=10)
    check(out == b"other\n" and ex.get(EXIT_CODE) == 0, "a second exec ran: %r" % ex)
    quiet(a, s, 0.1)
    # Credit a little: exactly that much more comes, in chunks that never exceed it.
    a.send(WINDOW, s, [(WINDOW_F, 5000)])
    take(a, s, 5000)
    quiet(a, s, 0.3)
    a.send(WINDOW, s, [(WINDOW_F, 1 << 30)])
    rest = a.until_end(s, timeout=60)
    out = data_of(rest, (STDOUT,))
    err = b"".join(f.get(DATA_F) for f in rest if f.type == STDERR)
    check(w + 5000 + out == total and err == b"tail\n", (out, err))
    check(rest[-1].type == EXIT and rest[-1].get(EXIT_CODE) == 0, rest[-1])
    # An unpaced exec (no WINDOW, an old host) says nothing of windows.
    _, _, _, frames = a.run([(ARG, "true")])
    check(frames[0].get(WINDOW_F) is None, frames[0])
    # A bad WINDOW is refused; a WINDOW for an unknown stream or a bad one is ignored.
    expect_error(a.call(EXEC, [(ARG, "true"), (WINDOW_F, b"x")]), 22, "WINDOW not an i64")
    a.send(WINDOW, 999999, [(WINDOW_F, 10)])
    a.send(WINDOW, 999998, [])
    check(a.call(PING).type == OK, "alive")


def t_window_exit(a):
    """Output left when a paced command exits waits for credit; EXIT comes after it."""
    s = a.stream()
    a.send(EXEC, s, [(SHELL, "head -c 60000 /dev/zero"), (WINDOW_F, 1000)])
    check(a.recv(s).type == STARTED, "started")
    take(a, s, 1000)
    quiet(a, s, 0.7)  # the command has exited by now; its pipe holds the rest
    a.send(WINDOW, s, [(WINDOW_F, 1 << 20)])
    rest = a.until_end(s)
    check(data_of(rest) == 59000 and rest[-1].type == EXIT and rest[-1].get(EXIT_CODE) == 0,
          (data_of(rest), rest[-1]))


def t_window_read(a, tmp):
    path = os.path.join(tmp, "paced.bin")
    blob = os.urandom(300000)
    with open(path, "wb") as f:
        f.write(blob)
    s = a.stream()
    a.send(READ, s, [(PATH, path), (WINDOW_F, 70000)])
    got = take(a, s, 70000)
    check(got[0].type == DATA and got[0].get(WINDOW_F) == 70000, "first DATA echoes: %r" % got[0])
    check(all(f.get(WINDOW_F) is None for f in got[1:]), "only the first DATA says WINDOW")
    quiet(a, s, 0.5)
    a.send(WINDOW, s, [(WINDOW_F, 1 << 20)])
    rest = a.until_end(s)
    data = b"".join(f.get(DATA_F) for f in got + rest if f.type == DATA)
    check(data == blob and rest[-1].type == END and rest[-1].get(SIZE) == len(blob), len(data))
    # CANCEL: the read stops without a reply and its stream id is free again.
    s = a.stream()
    a.send(READ, s, [(PATH, path), (WINDOW_F, 1000)])
    take(a, s, 1000)
    a.send(CANCEL, s)
    quiet(a, s, 0.5)
    a.send(READ, s, [(PATH, path), (WINDOW_F, 1 << 20)])
    frames = a.until_end(s)
    check(frames[-1].type == END and frames[-1].get(SIZE) == len(blob), frames[-1])


def t_cancel_exec(a):
    s = a.stream()
    a.send(EXEC, s, [(SHELL, "sleep 100 & echo $!; sleep 100"), (WINDOW_F, 1 << 20)])
    check(a.recv(s).type == STARTED, "started")
    bg = int(a.recv(s).get(DATA_F))
    a.send(CANCEL, s)
    deadline = time.time() + 5
    while not gone(bg):
        check(time.time() < deadline, "CANCEL left the command's group running")
        time.sleep(0.05)
    quiet(a, s, 0.3)
    out, _, ex, _ = a.run([(ARG, "echo"), (ARG, "reused")], timeout=10)
    check(out == b"reused\n", out)


def streams(a, window=0):
    """STREAMS on the host's reserved stream: {id: {tag: [values]}} of what is in flight."""
    s = 0xFFFFFFFF
    a.send(STREAMS, s, [(WINDOW_F, window)] if window else [])
    f = a.recv(s)
    check(f.type == OK, "STREAMS: %r" % f)
    out, cur = {}, None
    for t, v in f.fields:
        if t == STREAM_F:
            cur = out.setdefault(v, {})
        elif cur is not None:
            cur.setdefault(t, []).append(v)
    return out


def t_streams(a, tmp):
    """STREAMS: what an earlier host left in flight, as a new host takes over."""
    path = os.path.join(tmp, "handover.bin")
    with open(path, "wb") as f:
        f.write(os.urandom(200000))
    d = os.path.join(tmp, "handover")
    os.mkdir(d)
    # The earlier host's: a command (paced, its window used up), a shell command with stdin,
    # a read stalled on its window, a write half done.
    cmd = a.stream()
    a.send(EXEC, cmd, [(ARG, "sh"), (ARG, "-c"), (ARG, "head -c 5000 /dev/zero; sleep 30"),
                       (WINDOW_F, 1000)])
    check(a.recv(cmd).type == STARTED, "started")
    take(a, cmd, 1000)
    sh = a.stream()
    a.send(EXEC, sh, [(SHELL, "cat; echo bye"), (STDIN_F, 1)])
    pid_sh = a.recv(sh).get(PID)
    rd = a.stream()
    a.send(READ, rd, [(PATH, path), (WINDOW_F, 1000)])
    take(a, rd, 1000)
    wr = a.stream()
    a.send(WRITE_OPEN, wr, [(PATH, os.path.join(d, "f"))])
    a.send(WRITE_DATA, wr, [(DATA_F, b"x" * 100)])
    t0 = time.time_ns()
    got = streams(a, window=1 << 20)
    check(set(got) == {cmd, sh}, "listed %r" % sorted(got))
    c = got[cmd]
    check(c[KIND] == [1] and c[PID][0] > 0 and c[STDIN_F] == [0], "command %r" % c)
    check(c[ARG] == [b"sh", b"-c", b"head -c 5000 /dev/zero; sleep 30"] and SHELL not in c, c)
    check(c[WINDOW_F] == [1 << 20], "paced again with the new window: %r" % c[WINDOW_F])
    check(0 < t0 - c[TIME_NS][0] < 60 * 10**9, "start time %r" % c[TIME_NS])
    g = got[sh]
    check(g[PID] == [pid_sh] and g[STDIN_F] == [1] and g[SHELL] == [b"cat; echo bye"], g)
    # The read and the write are gone (the temporary file too); the command's output flows
    # again under the new window, and its stream id is still taken.
    check(os.listdir(d) == [], "write left %r" % os.listdir(d))
    quiet(a, rd, 0.3)
    rest = take(a, cmd, 4000)
    check(data_of(rest) == 4000, "output after the handover")
    a.send(EXEC, cmd, [(ARG, "true")])
    expect_error(a.recv(cmd), 16, "a new EXEC on a stream still in flight")
    # The new host drives what it took over: stdin, signals.
    a.send(STDIN, sh, [(DATA_F, b"hi\n")])
    a.send(STDIN, sh)
    frames = a.until_end(sh)
    out = b"".join(f.get(DATA_F) for f in frames if f.type == STDOUT)
    check(out == b"hi\nbye\n" and frames[-1].type == EXIT, frames)
    a.send(SIGNAL, cmd, [(SIGNAL_F, 9)])
    frames = a.until_end(cmd)
    check(frames[-1].type == EXIT and frames[-1].get(EXIT_SIGNAL) == 9, frames[-1])
    check(streams(a) == {}, "nothing left in flight")


def t_cancel_write(a, tmp):
    """An abandoned write leaves neither its target nor its temporary file."""
    d = os.path.join(tmp, "cancelled")
    os.mkdir(d)
    s = a.stream()
    a.send(WRITE_OPEN, s, [(PATH, os.path.join(d, "f"))])
    a.send(WRITE_DATA, s, [(DATA_F, b"x" * 1000)])
    check(a.call(PING).type == OK and len(os.listdir(d)) == 1, "temp file while writing")
    a.send(CANCEL, s)
    a.send(WRITE_END, s)  # no longer in flight: discarded
    check(a.call(PING).type == OK, "alive")
    quiet(a, s, 0.3)
    check(os.listdir(d) == [], "left behind: %r" % os.listdir(d))


def t_files(a, tmp):
    blob = bytes(range(256)) * (5 * 4096)  # 5 MiB, every byte value
    path = os.path.join(tmp, "sub", "dir", "blob.bin")
    s = a.stream()
    a.send(WRITE_OPEN, s, [(PATH, path), (FLAGS, 1), (MODE, 0o600)])
    for i in range(0, len(blob), 1 << 20):
        a.send(WRITE_DATA, s, [(DATA_F, blob[i:i + (1 << 20)])])
    a.send(WRITE_END, s)
    f = a.until_end(s)[-1]
    check(f.type == OK and f.get(SIZE) == len(blob), f)
    check(open(path, "rb").read() == blob, "written file differs")
    check(os.stat(path).st_mode & 0o777 == 0o600, "mode")
    check(os.listdir(os.path.dirname(path)) == ["blob.bin"], "temp file left behind")
    s = a.stream()
    a.send(READ, s, [(PATH, path)])
    frames = a.until_end(s)
    check(frames[-1].type == END and frames[-1].get(SIZE) == len(blob), frames[-1])
    check(all(len(f.get(DATA_F)) <= 65536 for f in frames[:-1]), "chunk too big")
    check(b"".join(f.get(DATA_F) for f in frames[:-1]) == blob, "read differs")
    # empty file, default mode
    s = a.stream()
    a.send(WRITE_OPEN, s, [(PATH, os.path.join(tmp, "empty"))])
    a.send(WRITE_END, s)
    check(a.until_end(s)[-1].get(SIZE) == 0, "empty write")
    check(os.stat(os.path.join(tmp, "empty")).st_mode & 0o777 == 0o644, "default mode")
    frames = a.until_end(_send(a, READ, [(PATH, os.path.join(tmp, "empty"))]))
    check([f.type for f in frames] == [END] and frames[0].get(SIZE) == 0, frames)
    # write to a missing directory without FLAGS fails at once, later frames are ignored
    s = a.stream()
    a.send(WRITE_OPEN, s, [(PATH, os.path.join(tmp, "nodir", "x"))])
    a.send(WRITE_DATA, s, [(DATA_F, b"x")])
    a.send(WRITE_END, s)
    expect_error(a.recv(s), 2, "write into missing dir")
    check(a.call(PING).type == OK, "ping after failed write")
    check(a.q(s).empty(), "extra frames after failed WRITE_OPEN")

    # mkdir -p, stat, list, rename, remove -r
    d = os.path.join(tmp, "a", "b", "c")
    check(a.call(MKDIR, [(PATH, d), (FLAGS, 1)]).type == OK, "mkdir -p")
    check(a.call(MKDIR, [(PATH, d), (FLAGS, 1)]).type == OK, "mkdir -p again")
    expect_error(a.call(MKDIR, [(PATH, d)]), 17, "mkdir existing")
    expect_error(a.call(MKDIR, [(PATH, os.path.join(tmp, "x", "y"))]), 2, "mkdir no parent")
    f = a.call(STAT, [(PATH, d)])
    check(f.type == OK and f.get(FILE_TYPE) == 2 and f.get(MODE) == 0o755, f)
    with open(os.path.join(tmp, "a", "file"), "wb") as fh:
        fh.write(b"12345")
    os.symlink("/etc", os.path.join(tmp, "a", "link"))
    f = a.call(STAT, [(PATH, os.path.join(tmp, "a", "link"))])
    check(f.get(FILE_TYPE) == 3, "lstat of symlink")
    f = a.call(LIST, [(PATH, os.path.join(tmp, "a"))])
    check(f.type == OK and f.all(NAME) == [b"b", b"file", b"link"], f)
    check(f.all(FILE_TYPE) == [2, 1, 3] and f.all(SIZE)[1] == 5, f)
    check(abs(f.all(MTIME_NS)[1] - os.stat(os.path.join(tmp, "a", "file")).st_mtime_ns) == 0,
          "mtime")
    check(a.call(RENAME, [(PATH, os.path.join(tmp, "a", "file")),
                          (PATH2, os.path.join(tmp, "a", "b", "moved"))]).type == OK, "rename")
    check(os.path.exists(os.path.join(tmp, "a", "b", "moved")), "renamed file")
    expect_error(a.call(REMOVE, [(PATH, os.path.join(tmp, "a"))]), 39, "rmdir non-empty")
    # recursive remove must not follow the symlink into /etc
    check(a.call(REMOVE, [(PATH, os.path.join(tmp, "a")), (FLAGS, 1)]).type == OK, "rm -r")
    check(not os.path.exists(os.path.join(tmp, "a")) and os.path.exists("/etc/passwd"), "rm -r")
    check(a.call(REMOVE, [(PATH, os.path.join(tmp, "empty"))]).type == OK, "rm file")

    # errors
    expect_error(a.call(STAT, [(PATH, "/nonexistent")]), 2, "stat missing")
    expect_error(a.call(READ, [(PATH, "/nonexistent")]), 2, "read missing")
    expect_error(a.call(READ, [(PATH, tmp)]), 21, "read directory")
    expect_error(a.call(LIST, [(PATH, "/nonexistent")]), 2, "list missing")
    expect_error(a.call(REMOVE, [(PATH, "/nonexistent"), (FLAGS, 1)]), 2, "remove missing")
    for op in (READ, STAT, LIST, MKDIR, REMOVE, WRITE_OPEN):
        expect_error(a.call(op, []), 22, "op 0x%x without PATH" % op)
    expect_error(a.call(RENAME, [(PATH, "/tmp/x")]), 22, "rename without PATH2")
    expect_error(a.call(MKDIR, [(PATH, tmp), (MODE, b"xyz")]), 22, "bad i64")


def t_pty(a):
    expect_error(a.call(EXEC, [(ARG, "true"), (PTY_ROWS, 24)]), 22, "PTY_ROWS without PTY_COLS")
    expect_error(a.call(EXEC, [(ARG, "true"), (PTY_ROWS, 0), (PTY_COLS, 80)]), 22, "zero rows")
    expect_error(a.call(EXEC, [(ARG, "true"), (PTY_ROWS, 24), (PTY_COLS, 65536)]), 22, "cols > 65535")
    s = a.stream()
    a.send(EXEC, s, [(SHELL, "read x; stty size"), (PTY_ROWS, 10), (PTY_COLS, 20), (WINDOW_F, 1 << 20)])
    st = a.recv(s)
    check(st.type == STARTED and st.get(PTY_ROWS) == 10 and st.get(PTY_COLS) == 20, st)
    a.send(RESIZE, s, [(PTY_ROWS, 0), (PTY_COLS, 5)])  # invalid: ignored, the exec goes on
    a.send(RESIZE, s, [(PTY_ROWS, "xy")])
    a.send(RESIZE, s, [(PTY_ROWS, 11), (PTY_COLS, 21)])
    a.send(STDIN, s, [(DATA_F, "\n")])
    frames = a.until_end(s)
    out = b"".join(f.get(DATA_F) for f in frames if f.type == STDOUT)
    check(frames[-1].type == EXIT and out.endswith(b"11 21\r\n"), (out, frames[-1]))
    a.send(RESIZE, 999999, [(PTY_ROWS, 5), (PTY_COLS, 5)])  # no such stream: discarded
    out, _, ex, _ = a.run([(ARG, "true")])
    check(ex.get(EXIT_CODE) == 0, "the agent goes on after stray RESIZEs")


def watch_events(a, s, n, timeout=10):
    evs = []
    while len(evs) < n:
        f = a.recv(s, timeout)
        check(f.type == WATCH_EVENT, f)
        evs.append((f.get(EVENT).decode(), f.get(PATH).decode(), f.get(FILE_TYPE)))
    return evs


def t_watch(a, tmp):
    expect_error(a.call(WATCH, []), 22, "WATCH without PATH")
    expect_error(a.call(WATCH, [(PATH, "rel")]), 22, "relative PATH")
    expect_error(a.call(WATCH, [(PATH, tmp), (RECURSIVE, "x")]), 22, "RECURSIVE not an i64")
    expect_error(a.call(WATCH, [(PATH, tmp + "/nope")]), 2, "missing dir")
    root = os.path.join(tmp, "watched")
    os.makedirs(os.path.join(root, "sub"))
    s = a.stream()
    window = 64 + len(root + "/sub")  # exactly one event's cost (64 + its path)
    a.send(WATCH, s, [(PATH, root + "//"), (RECURSIVE, 1), (WINDOW_F, window)])
    f = a.recv(s)
    check(f.type == OK and f.get(WINDOW_F) == window, f)
    # a directory moved within the tree is followed under its new name
    os.rename(os.path.join(root, "sub"), os.path.join(root, "moved"))
    evs = watch_events(a, s, 1)
    check(evs == [("rename", root + "/sub", 2)], evs)
    # the window held that one event; the next waits for credit
    quiet(a, s, 0.3)
    a.send(WINDOW, s, [(WINDOW_F, 10000)])
    evs = watch_events(a, s, 1)
    check(evs == [("create", root + "/moved", 2)], evs)
    open(os.path.join(root, "moved", "f"), "w").close()
    evs = watch_events(a, s, 1)
    check(evs == [("create", root + "/moved/f", 1)], evs)
    a.send(CANCEL, s)
    open(os.path.join(root, "after-cancel"), "w").close()
    quiet(a, s, 0.3)
    check(a.call(PING).type == OK, "alive after a cancelled watch")
    # a symlink to a directory is watched as the path given; a symlink to a file is ENOTDIR
    link = os.path.join(tmp, "link")
    os.symlink(root, link)
    os.symlink(os.path.join(root, "after-cancel"), os.path.join(tmp, "filelink"))
    expect_error(a.call(WATCH, [(PATH, os.path.join(tmp, "filelink"))]), 20, "symlink to a file")
    s = a.stream()
    a.send(WATCH, s, [(PATH, link)])
    check(a.recv(s).type == OK, "watch of a symlink to a directory")
    open(os.path.join(root, "via-link"), "w").close()
    evs = watch_events(a, s, 1)
    check(evs == [("create", link + "/via-link", 1)], evs)
    a.send(CANCEL, s)


def t_watch_nomem(binary, tmp):
    """Events lost for want of memory are reported as one overflow, and the watch goes on."""
    a = Agent(binary)  # its own: a fresh heap, with little free in it
    try:
        watch_nomem(a, tmp)
    finally:
        a.close()


def watch_nomem(a, tmp):
    import resource
    root = os.path.join(tmp, "nomem")
    os.makedirs(root)
    s = a.stream()
    a.send(WATCH, s, [(PATH, root), (WINDOW_F, 64 + len(root) + 2)])
    check(a.recv(s).type == OK, "watch started")
    open(os.path.join(root, "a"), "w").close()
    check(watch_events(a, s, 1) == [("create", root + "/a", 1)], "the window's one event")
    pid = a.proc.pid
    with open("/proc/%d/status" % pid) as st:
        data_kb = next(int(l.split()[1]) for l in st if l.startswith("VmData:"))
    old = resource.prlimit(pid, resource.RLIMIT_DATA)
    # Events queue (no credit) while the agent's heap may grow by little: copies of paths fail.
    resource.prlimit(pid, resource.RLIMIT_DATA, (data_kb * 1024, old[1]))
    try:
        for i in range(3500):
            open(os.path.join(root, "%04d" % i + "n" * 200), "w").close()
        time.sleep(0.5)
    finally:
        resource.prlimit(pid, resource.RLIMIT_DATA, old)
    a.send(WINDOW, s, [(WINDOW_F, 1 << 30)])
    types = []
    while True:
        try:
            f = a.q(s).get(timeout=1)
        except queue.Empty:
            break
        check(f.type == WATCH_EVENT, f)
        types.append(f.get(EVENT).decode())
    check(types.count("overflow") == 1 and types[-1] == "overflow" and len(types) < 3500,
          "events past memory are lost, reported once: %d events, %r" % (len(types), types[-3:]))
    open(os.path.join(root, "after"), "w").close()
    check(watch_events(a, s, 1) == [("create", root + "/after", 1)], "the watch goes on")
    a.send(CANCEL, s)
    check(a.call(PING).type == OK, "alive")


def _send(a, ftype, fields):
    s = a.stream()
    a.send(ftype, s, fields)
    return s


def t_protocol_errors(a):
    # oversized frame: the agent skips its bytes and answers E2BIG
    s = a.stream()
    big = MAX_FRAME + 100
    a.send_raw(struct.pack(">IBI", big, EXEC, s) + b"\0" * (big - 5))
    expect_error(a.recv(s), 7, "oversized frame")
    # malformed field list (field length beyond the frame)
    s = a.stream()
    a.send_raw(struct.pack(">IBI", 5 + 5, STAT, s) + struct.pack(">BI", PATH, 100))
    expect_error(a.recv(s), 22, "malformed fields")
    s = a.stream()
    a.send_raw(struct.pack(">IBI", 5 + 3, STAT, s) + b"\x07\x00\x00")
    expect_error(a.recv(s), 22, "truncated field header")
    expect_error(a.call(0x7E, []), 38, "unknown type")
    # a short frame (length < 5) is dropped, then framing continues
    a.send_raw(struct.pack(">I", 2) + b"zz")
    check(a.call(PING).type == OK, "ping after short frame")
    # garbage payloads with random types and fields never crash it
    rnd = __import__("random").Random(1)
    streams = []
    for _ in range(300):
        s = a.stream()
        t = rnd.choice([PING, SYNC, STDIN, SIGNAL, READ, WRITE_OPEN, WRITE_DATA, WRITE_END, LIST,
                        STAT, MKDIR, REMOVE, RENAME, 0x55, IDENTITY])
        body = bytes(rnd.randrange(256) for _ in range(rnd.randrange(40)))
        a.send_raw(struct.pack(">IBI", 5 + len(body), t, s) + body)
        streams.append(s)
    check(a.call(PING).type == OK, "ping after garbage")
    check(a.proc.poll() is None, "agent died")
    # unused unknown tags are ignored
    check(a.call(PING, [(99, b"future")]).type == OK, "unknown tag")


def t_limits(a):
    streams = []
    for _ in range(256):
        s = a.stream()
        a.send(EXEC, s, [(ARG, "sleep"), (ARG, "30")])
        streams.append(s)
    for s in streams:
        check(a.recv(s).type == STARTED, "start %d" % s)
    expect_error(a.call(EXEC, [(ARG, "true")]), 16, "257th stream")
    for s in streams:
        a.send(SIGNAL, s, [(SIGNAL_F, 9)])
    for s in streams:
        check(a.until_end(s)[-1].get(EXIT_SIGNAL) == 9, "killed")


def t_eval(a, have_numpy):
    f, r = a.eval("x = 21\nx * 2")
    check(f.type == OK and r["ok"] and r["value"] == "42", r)
    f, r = a.eval("y = x + 1")
    check(r["ok"] and r["value"] is None, r)
    f, r = a.eval("print('hi'); import sys; print('e', file=sys.stderr); y")
    check(r["stdout"] == "hi\n" and r["stderr"] == "e\n" and r["value"] == "22", r)
    f, r = a.eval("None")
    check(r["value"] is None, r)
    f, r = a.eval("def f():\n    return 1/0\nf()")
    check(not r["ok"] and r["error"]["name"] == "ZeroDivisionError", r)
    tb = r["error"]["traceback"]
    check("return 1/0" in tb and "forkd_eval" not in tb and "ZeroDivisionError" in tb, tb)
    f, r = a.eval("def (:")
    check(r["error"]["name"] == "SyntaxError", r)
    f, r = a.eval("import sys; sys.exit(3)")
    check(r["error"]["name"] == "SystemExit" and r["error"]["value"] == "3", r)
    f, r = a.eval("import os; os.write(1, b'\\xff\\xfe junk'); print(b'\\xff'.decode('latin1')); 'x'")
    check(r["ok"] and r["value"] == "'x'" and r["stdout"] == "\u00ff\n", r)
    f, r = a.eval("import sys; sys.stdout.buffer.write(b'\\xff ok'); 1")
    check(r["ok"] and r["stdout"] == "\ufffd ok", r)
    if have_numpy:
        f, r = a.eval("np.arange(4).sum()")
        check(r["ok"] and r["value"] in ("6", "np.int64(6)"), r)
    # timeout: SIGINT interrupts the loop; globals survive
    t0 = time.time()
    f, r = a.eval("while True: pass", timeout_ms=500)
    check(f.type == ERROR and f.get(ERRNO) == 110, f)
    check(r is not None and r["error"]["name"] == "KeyboardInterrupt", r)
    check(time.time() - t0 < 2, "interrupt took too long")
    f, r = a.eval("x")
    check(r["value"] == "21", "globals lost after interrupt: %r" % r)
    # a cell that ignores KeyboardInterrupt is killed after 2 s; the interpreter restarts cold
    t0 = time.time()
    f, r = a.eval("import time\nwhile True:\n    try:\n        while True: time.sleep(0.01)\n"
                  "    except KeyboardInterrupt: pass", timeout_ms=300)
    check(f.type == ERROR and f.get(ERRNO) == 110 and 2 <= time.time() - t0 < 5, (f, time.time() - t0))
    f, r = a.eval("'x' in globals()")
    check(r["value"] == "False", r)
    # the interpreter dying is reported, and it comes back lazily
    f, r = a.eval("import os; os._exit(1)")
    check(f.type == ERROR, f)
    f, r = a.eval("1+1")
    check(r["value"] == "2", r)
    # FIFO order with several in flight
    streams = [_send(a, EVAL, [(CODE, "import time; time.sleep(0.05); %d" % i)]) for i in range(5)]
    for i, s in enumerate(streams):
        r = json.loads(a.until_end(s)[-1].get(JSON_F))
        check(r["value"] == str(i), r)
    # huge output is capped to fit a frame
    f, r = a.eval("print('x' * 5000000)")
    check(f.type == OK and len(r["stdout"]) < 1000000, f)
    expect_error(a.call(EVAL, []), 22, "EVAL without CODE")


def t_identity(binary):
    """IDENTITY in a private mount+UTS namespace, so the host keeps its name and /run."""
    if subprocess.run(["unshare", "-mu", "true"], capture_output=True).returncode != 0:
        print("  (skipped: unshare not permitted)")
        return
    inner = " ".join(shlex.quote(x) for x in
                     [sys.executable, os.path.abspath(__file__), binary, "--identity-inner"])
    r = subprocess.run(["unshare", "-mu", "--propagation", "private", "sh", "-c",
                        "mount -t tmpfs tmpfs /run && exec " + inner])
    check(r.returncode == 0, "identity test failed")


def identity_inner(binary):
    a = Agent(binary)
    try:
        t_ping(a)
        a.eval("import random\ndef draw():\n    np = globals().get('np')\n"
               "    return random.random(), np and float(np.random.rand())")
        seed7 = "random.seed(7); 'np' in globals() and np.random.seed(7)"
        _, r1 = a.eval(seed7 + "; draw()")  # the first draws after seed(7)
        a.eval(seed7)
        f = a.call(IDENTITY, [(SEED, os.urandom(64)), (TIME_NS, time.time_ns()),
                              (HOSTNAME, "sandbox-1"), (SANDBOX_ID, "sb-123")])
        if f.type == ERROR and f.get(ERRNO) == 1:
            print("  (IDENTITY: %s; not permitted here)" % f.get(MESSAGE).decode())
        else:
            check(f.type == OK, f)
            a.call(PING)  # the id file is written right after the reply, before the next request
            check(open("/run/forkd/sandbox-id").read() == "sb-123", "sandbox id")
            check(socket.gethostname() == "sandbox-1", "hostname")
        _, r2 = a.eval("draw()")
        v1, v2 = eval(r1["value"]), eval(r2["value"])
        check(v1[0] != v2[0] and (v1[1] is None or v1[1] != v2[1]),
              "reseed did not change random state: %r %r" % (v1, v2))
        expect_error(a.call(IDENTITY, [(SEED, b"short")]), 22, "short seed")
    finally:
        a.close()


def write(path, data, mode=0o644):
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())
    os.chmod(path, mode)


def image_dirs(tmp, env, config):
    """A config dir (env, config) and an etc dir (passwd, group) like an image's."""
    root = os.path.join(tmp, "image")
    cfg, etc, work = (os.path.join(root, d) for d in ("forkd", "etc", "work"))
    for d in (root, cfg, etc, work, os.path.join(root, "home-alice"), os.path.join(root, "home-bob")):
        os.makedirs(d, exist_ok=True)
        os.chmod(d, 0o755)
    os.chmod(tmp, 0o755)  # the users below must reach their homes and the kernel
    if env is not None:
        write(os.path.join(cfg, "env"), env)
    if config is not None:
        write(os.path.join(cfg, "config"), config)
    write(os.path.join(etc, "passwd"),
          "root:x:0:0:root:/root:/bin/sh\n"
          "garbage line without fields\n"
          "alice:x:12345:12345:Alice:%s/home-alice:/bin/sh\n"
          "bob:x:23456:100::%s/home-bob:/bin/sh\n"
          "nohome:x:34567:34567::/nonexistent:/bin/sh\n" % (root, root))
    write(os.path.join(etc, "group"),
          "root:x:0:\nalice:x:12345:\nstaff:x:50:alice,bob\nusers:x:100:\nwheel:x:10:bob\n")
    return root, cfg, etc, work


def ids(a, user=None, extra=()):
    """uid, gid, sorted groups, cwd, HOME, USER, LOGNAME, FOO of a command run as `user`."""
    fields = [(SHELL, 'id -u; id -g; id -G; pwd; echo "$HOME|$USER|$LOGNAME|$FOO"')]
    fields += [(USER, user)] if user is not None else []
    out, err, ex, frames = a.run(fields + list(extra))
    if ex.type == ERROR:
        return ex
    check(ex.get(EXIT_CODE) == 0, (out, err, ex))
    lines = out.decode().splitlines()
    return (int(lines[0]), int(lines[1]), sorted(int(g) for g in lines[2].split()), lines[3],
            lines[4])


def t_users(binary, tmp):
    """Image config and exec USER: the default user, env, cwd; explicit users; unknown ones."""
    work = os.path.join(tmp, "image", "work")
    root, cfg, etc, work = image_dirs(
        tmp, b"FOO=bar\0PATH=/usr/bin:/bin\0=bad\0novalue\0\0HOME=/image-home\0",
        "# comment\nunknown=1\ncwd=%s\r\nuser=alice\n" % work)
    a = Agent(binary, BASE_ARGS + ["--config-dir", cfg, "--etc-dir", etc])
    try:
        # the default user (config): its groups, the image's env (its HOME wins), config cwd
        check(ids(a) == (12345, 12345, [50, 12345], work, "/image-home|alice|alice|bar"), ids(a))
        # explicit users get their own HOME, USER, LOGNAME and supplementary groups
        check(ids(a, "bob") == (23456, 100, [10, 50, 100], work,
                                "%s/home-bob|bob|bob|bar" % root), ids(a, "bob"))
        check(ids(a, "root") == (0, 0, [0], work, "/root|root|root|bar"), ids(a, "root"))
        check(ids(a, "alice:users")[:3] == (12345, 100, [100]), ids(a, "alice:users"))
        check(ids(a, "23456:50")[:3] == (23456, 50, [50]), ids(a, "23456:50"))
        check(ids(a, "bob:12345")[:3] == (23456, 12345, [12345]), ids(a, "bob:12345"))
        # a uid the image does not list: gid 0, HOME / (as Docker does)
        check(ids(a, "4242") == (4242, 0, [0], work, "/|||bar"), ids(a, "4242"))
        check(ids(a, "4242:4343")[:3] == (4242, 4343, [4343]), ids(a, "4242:4343"))
        # ENV and CWD of the request still win
        got = ids(a, "bob", [(ENV, "HOME=/x"), (ENV, "FOO=baz"), (CWD, "/")])
        check(got[3:] == ("/", "/x|bob|bob|baz"), got)
        # unknown users and groups, bad specs: a clear error, the agent lives on
        f = ids(a, "mallory")
        expect_error(f, 2, "unknown user")
        check(b"no user 'mallory'" in f.get(MESSAGE), f.get(MESSAGE))
        f = ids(a, "alice:nogroup")
        expect_error(f, 2, "unknown group")
        check(b"no group 'nogroup'" in f.get(MESSAGE), f.get(MESSAGE))
        for bad in ("", ":50", "alice:"):
            expect_error(ids(a, bad), 22, "bad user spec %r" % bad)
        # the kernel runs as the default user, in the default cwd, with the image's env
        f, r = a.eval("import os; (os.getuid(), os.getgid(), sorted(os.getgroups()), os.getcwd(), "
                      "os.environ['FOO'], os.environ['HOME'])")
        check(r and r["ok"] and r["value"] == repr((12345, 12345, [50, 12345], work, "bar",
                                                   "/image-home")), (f, r))
    finally:
        a.close()
    # without config: root, /root, today's environment (HOME from passwd; USER, LOGNAME set)
    root, cfg, etc, work = image_dirs(os.path.join(tmp, "plain") + "/", None, None)
    a = Agent(binary, BASE_ARGS + ["--config-dir", cfg, "--etc-dir", etc])
    try:
        out, _, ex, _ = a.run([(SHELL, "id -u; pwd; env | sort | grep -v '^PWD=\\|^SHLVL=\\|^_='")])
        check(out.decode().splitlines() == [
            "0", "/root", "HOME=/root", "LANG=C.UTF-8", "LOGNAME=root",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "USER=root"], out)
        check(ids(a, "nohome")[3] == "/", "a user without a home starts in /")
    finally:
        a.close()
    # root always works, even without /etc/passwd; a default user the image lacks is an error
    root, cfg, etc, work = image_dirs(os.path.join(tmp, "nopasswd") + "/", None, "user=ghost\n")
    os.unlink(os.path.join(etc, "passwd"))
    a = Agent(binary, BASE_ARGS + ["--config-dir", cfg, "--etc-dir", etc])
    try:
        check(ids(a, "root")[:4] == (0, 0, [0], "/root"), ids(a, "root"))
        f = ids(a)
        expect_error(f, 2, "missing default user")
        check(f.get(MESSAGE).startswith(b"default user: no user 'ghost'"), f.get(MESSAGE))
        check(a.call(PING).type == OK, "alive")
    finally:
        a.close()


def t_file_users(binary, tmp):
    """File requests with USER are checked, and what they make is owned, as that user's."""
    if os.geteuid() != 0:
        print("note: not root; file requests as users skipped")
        return
    os.chmod(tmp, 0o755)  # the users below must reach their homes
    root, cfg, etc, work = image_dirs(os.path.join(tmp, "fileusers") + "/", None, None)
    alice, bob = os.path.join(root, "home-alice"), os.path.join(root, "home-bob")
    os.chown(alice, 12345, 12345)
    os.chmod(alice, 0o700)
    os.chown(bob, 23456, 100)
    secret = os.path.join(work, "shadow")
    write(secret, "root's secret", 0o600)
    mine = os.path.join(alice, "mine")
    write(mine, "alice's own", 0o600)
    os.chown(mine, 12345, 12345)
    a = Agent(binary, BASE_ARGS + ["--config-dir", cfg, "--etc-dir", etc])

    def read(path, user=None):
        frames = a.until_end(_send(a, READ, [(PATH, path)] + ([(USER, user)] if user else [])))
        if frames[-1].type == ERROR:
            return frames[-1]
        return b"".join(f.get(DATA_F) for f in frames[:-1])

    def as_(user, op, fields):
        return a.call(op, fields + [(USER, user)])

    try:
        # reads: the user's permissions, root's as root (named or not)
        f = read(secret, "alice")
        expect_error(f, 13, "alice reads root's 0600 file")
        check(b"Permission denied" in f.get(MESSAGE), f.get(MESSAGE))
        check(read(secret, "root") == b"root's secret", "root reads it")
        check(read(secret) == b"root's secret", "no USER: the agent (root)")
        check(read(mine, "alice") == b"alice's own", "alice reads her file")
        expect_error(read(mine, "bob"), 13, "bob reads alice's file")
        expect_error(read(mine, "mallory"), 2, "unknown user")
        expect_error(read(mine, ":x"), 22, "bad user spec")
        # writes: made as the user (parents too); refused where the user may not write
        target = os.path.join(bob, "new", "dir", "f.txt")
        s = a.stream()
        a.send(WRITE_OPEN, s, [(PATH, target), (FLAGS, 1), (USER, "bob")])
        a.send(WRITE_DATA, s, [(DATA_F, b"bob's")])
        a.send(WRITE_END, s)
        check(a.until_end(s)[-1].type == OK, "bob writes in his home")
        for p in (target, os.path.dirname(target), os.path.join(bob, "new")):
            st = os.stat(p)
            check((st.st_uid, st.st_gid) == (23456, 100), "%s owned by %d:%d" % (p, st.st_uid, st.st_gid))
        s = a.stream()
        a.send(WRITE_OPEN, s, [(PATH, os.path.join(work, "by-bob")), (USER, "bob")])
        expect_error(a.recv(s), 13, "bob writes into root's directory")
        s = a.stream()
        a.send(WRITE_OPEN, s, [(PATH, secret), (USER, "alice")])
        expect_error(a.recv(s), 13, "alice replaces root's file")
        check(open(secret).read() == "root's secret", "root's file intact")
        # stat, list, mkdir, remove, rename: as the user
        expect_error(as_("bob", STAT, [(PATH, mine)]), 13, "bob stats in alice's 0700 home")
        check(as_("alice", STAT, [(PATH, mine)]).type == OK, "alice stats her file")
        expect_error(as_("bob", LIST, [(PATH, alice)]), 13, "bob lists alice's home")
        check(as_("alice", LIST, [(PATH, alice)]).all(NAME) == [b"mine"], "alice lists her home")
        check(as_("bob", MKDIR, [(PATH, os.path.join(bob, "made"))]).type == OK, "bob's mkdir")
        check(os.stat(os.path.join(bob, "made")).st_uid == 23456, "bob's directory is bob's")
        expect_error(as_("bob", MKDIR, [(PATH, os.path.join(work, "nope"))]), 13, "mkdir in root's")
        expect_error(as_("bob", REMOVE, [(PATH, secret)]), 13, "bob removes root's file")
        expect_error(as_("bob", RENAME, [(PATH, secret), (PATH2, os.path.join(bob, "stolen"))]), 13,
                     "bob moves root's file")
        check(os.path.exists(secret), "root's file still there")
        check(as_("bob", REMOVE, [(PATH, os.path.join(bob, "new")), (FLAGS, 1)]).type == OK, "rm -r")
        # watch: as the user, also for directories added later
        expect_error(as_("bob", WATCH, [(PATH, alice)]), 13, "bob watches alice's home")
        s = a.stream()
        a.send(WATCH, s, [(PATH, alice), (RECURSIVE, 1), (USER, "alice")])
        check(a.recv(s).type == OK, "alice watches her home")
        private = os.path.join(alice, "private")
        os.mkdir(private, 0o700)  # root's: alice may not read it
        check(watch_events(a, s, 1) == [("create", private, 2)], "the private directory")
        open(os.path.join(private, "hidden"), "w").close()
        open(os.path.join(alice, "seen"), "w").close()
        evs = watch_events(a, s, 1)
        check(evs == [("create", os.path.join(alice, "seen"), 1)], "not watched as alice: %r" % evs)
        a.send(CANCEL, s)
        # the agent is itself again: root's file, a root exec, a root-owned write
        check(read(secret) == b"root's secret", "root again")
        out, _, ex, _ = a.run([(SHELL, "id -u; id -G")])
        check(out == b"0\n0\n", "exec as root after file requests as users: %r" % out)
        s = a.stream()
        a.send(WRITE_OPEN, s, [(PATH, os.path.join(work, "by-root"))])
        a.send(WRITE_END, s)
        check(a.until_end(s)[-1].type == OK and os.stat(os.path.join(work, "by-root")).st_uid == 0,
              "a write without USER is root's")
    finally:
        a.close()


def t_config_bounds(binary, tmp):
    """A huge env file is cut at its bound (the cut entry dropped), a garbage config ignored."""
    big = b"A=1\0" + b"B=" + b"y" * (2 << 20) + b"\0C=3\0"
    root, cfg, etc, work = image_dirs(os.path.join(tmp, "big") + "/", big,
                                      b"cwd=relative\nuser=\n" + bytes(range(256)) * 1000 + b"\ncwd=/\n")
    a = Agent(binary, BASE_ARGS + ["--config-dir", cfg, "--etc-dir", etc])
    try:
        out, _, ex, _ = a.run([(SHELL, 'pwd; echo "$A|${#B}|$C"')])
        check(out == b"/root\n1|0|\n", out)
    finally:
        a.close()


JS_STANDIN = os.path.join(HERE, "..", "..", "evalsrv", "forkd_eval.py")


def t_kernels(binary, tmp):
    """Two kernels: LANGUAGE dispatches, each keeps its own globals; PING's KERNELS/EVAL_READY."""
    # the JavaScript kernel's place taken by a second Python one (the JS kernel is tested on its own)
    a = Agent(binary, ["--config-dir", NO_CONFIG, "--evalsrv", EVALSRV, "--python", PYTHON,
                       "--evaljs", JS_STANDIN, "--node", PYTHON])
    try:
        deadline = time.time() + 30
        while a.call(PING).get(EVAL_READY) != 1:
            check(time.time() < deadline, "kernels never became ready")
            time.sleep(0.1)
        check(a.call(PING).get(KERNELS) == b"python,javascript", a.call(PING))
        _, r = a.eval("x = 41; import os; os.getpid()")
        py_pid = r["value"]
        _, r = a.eval("import os; os.getpid()", language="javascript")
        check(r["ok"] and r["value"] != py_pid, "one interpreter for both: %r" % r)
        _, r = a.eval("x", language="javascript")
        check(not r["ok"] and r["error"]["name"] == "NameError", "globals shared: %r" % r)
        _, r = a.eval("x + 1", language="python")
        check(r["value"] == "42", r)
        # timeouts are per kernel: a stuck JS cell does not hold Python's
        s = _send(a, EVAL, [(CODE, "import time\nwhile True: time.sleep(0.01)"), (TIMEOUT_MS, 1500),
                            (LANGUAGE, "javascript")])
        t0 = time.time()
        _, r = a.eval("x")
        check(r["value"] == "41" and time.time() - t0 < 1.4, "python waited for javascript")
        expect_error(a.until_end(s, 15)[-1], 110, "javascript cell timed out")
        _, r = a.eval("x", language="javascript")
        check(not r["ok"], "javascript kernel state after the interrupt: %r" % r)
        expect_error(a.call(EVAL, [(CODE, "1"), (LANGUAGE, "cobol")]), 22, "unknown language")
        # IDENTITY queues a reseed ahead of each kernel's next cell; both still answer
        s = a.stream()
        a.send(IDENTITY, s, [(SEED, b"s" * 32)])
        a.until_end(s)
        for lang in ("python", "javascript"):
            _, r = a.eval("1 + 1", language=lang)
            check(r["value"] == "2", (lang, r))
    finally:
        a.close()
    # no interpreter: an ERROR at once naming it; no kernels at all: ready at once
    work = os.path.join(tmp, "nointerp", "image", "work")
    root, cfg, etc, work = image_dirs(os.path.join(tmp, "nointerp") + "/",
                                      b"PATH=%s\0" % work.encode(), None)
    a = Agent(binary, ["--config-dir", cfg, "--etc-dir", etc, "--evalsrv", EVALSRV,
                       "--python", "/nonexistent/python3", "--evaljs", JS_STANDIN])
    try:
        f = a.call(PING)
        check(f.get(KERNELS) == b"" and f.get(EVAL_READY) == 1, f)
        t0 = time.time()
        f = a.call(EVAL, [(CODE, "1")])
        expect_error(f, 2, "missing python")
        check(f.get(MESSAGE) == b"no python3 interpreter at /nonexistent/python3", f.get(MESSAGE))
        f = a.call(EVAL, [(CODE, "1"), (LANGUAGE, "javascript")])
        expect_error(f, 2, "missing node")
        check(f.get(MESSAGE) == b"no node interpreter in this image (eval needs node or nodejs on PATH)",
              f.get(MESSAGE))
        check(time.time() - t0 < 2, "missing interpreters must fail at once")
        # installed later (on the image's PATH): found at the next EVAL
        os.symlink(PYTHON, os.path.join(work, "nodejs"))
        _, r = a.eval("6 * 7", language="javascript")
        check(r and r["value"] == "42", r)
        check(a.call(PING).get(KERNELS) == b"javascript", a.call(PING))
    finally:
        a.close()
    # the interpreter exists, the kernel's source does not
    a = Agent(binary, ["--config-dir", NO_CONFIG, "--evalsrv", EVALSRV, "--python", PYTHON,
                       "--evaljs", "/nonexistent/forkd_eval.js", "--node", PYTHON])
    try:
        f = a.call(EVAL, [(CODE, "1"), (LANGUAGE, "javascript")])
        expect_error(f, 2, "missing kernel source")
        check(f.get(MESSAGE) == b"the javascript kernel /nonexistent/forkd_eval.js is missing in this image",
              f.get(MESSAGE))
        check(a.call(PING).get(KERNELS) == b"python", "kernels")
    finally:
        a.close()


def wait_ready(a, secs=10):
    """PING until EVAL_READY is 1 (well before the kernels' 30 s handshake bound); the reply."""
    deadline = time.time() + secs
    while True:
        f = a.call(PING)
        if f.get(EVAL_READY) == 1:
            return f
        check(time.time() < deadline, "eval never became ready: %r" % f)
        time.sleep(0.1)


def t_broken_kernels(binary, tmp):
    """A kernel that cannot start (exits at once, answers garbage, its default user missing) is
    settled: PING is ready without it, KERNELS lacks it, an EVAL of it errors at once, saying why."""
    d = os.path.join(tmp, "broken")
    os.makedirs(d, exist_ok=True)
    exits = os.path.join(d, "python3-exits")
    write(exits, "#!/bin/sh\nexit 3\n", 0o755)
    garbage = os.path.join(d, "python3-garbage")
    write(garbage, "#!/bin/sh\necho 'this is not a kernel reply'\nexec sleep 1000\n", 0o755)
    for fake, what in ((exits, "exits at once"), (garbage, "prints garbage")):
        a = Agent(binary, ["--config-dir", NO_CONFIG, "--evalsrv", EVALSRV, "--python", fake,
                           "--evaljs", os.path.join(NO_CONFIG, "none.js")])
        try:
            f = wait_ready(a)
            check(f.get(KERNELS) == b"", "%s: kernels %r" % (what, f.get(KERNELS)))
            t0 = time.time()
            f = a.call(EVAL, [(CODE, "1")])
            check(f.type == ERROR and f.get(ERRNO), "%s: %r" % (what, f))
            msg = f.get(MESSAGE) or b""
            check(msg.startswith(b"the python kernel failed to start: "), "%s: %r" % (what, msg))
            check(time.time() - t0 < 10, "%s: the eval waited %.1fs" % (what, time.time() - t0))
            check(a.call(PING).get(EVAL_READY) == 1, "%s: still ready after the eval" % what)
        finally:
            a.close()
    # the image's default user is not in its /etc/passwd: the kernel cannot start as it
    root, cfg, etc, work = image_dirs(os.path.join(tmp, "ghostkernel") + "/", None, "user=ghost\n")
    os.unlink(os.path.join(etc, "passwd"))
    a = Agent(binary, BASE_ARGS + ["--config-dir", cfg, "--etc-dir", etc])
    try:
        f = wait_ready(a)
        check(f.get(KERNELS) == b"", "kernels %r" % f.get(KERNELS))
        t0 = time.time()
        f = a.call(EVAL, [(CODE, "1")])
        expect_error(f, 2, "eval as a missing default user")
        check(f.get(MESSAGE).startswith(b"default user: no user 'ghost'"), f.get(MESSAGE))
        check(time.time() - t0 < 10, "the eval waited %.1fs" % (time.time() - t0))
    finally:
        a.close()


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        st = f.read().split(") ")[1].split()
    return (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK")


def t_disconnect(binary):
    """Host goes away mid-exec: the agent keeps running and does not spin."""
    a = Agent(binary)
    try:
        t_ping(a)
        s = a.stream()
        a.send(EXEC, s, [(SHELL, "sleep 1; echo done")])
        check(a.recv(s).type == STARTED, "started")
        cpu0 = cpu_seconds(a.proc.pid)
        a.sock.close()
        time.sleep(1.5)
        check(a.proc.poll() is None, "agent exited on disconnect")
        cpu = cpu_seconds(a.proc.pid) - cpu0
        check(cpu < 0.3, "agent burned %.2fs CPU while disconnected" % cpu)
    finally:
        a.proc.kill()
        a.proc.wait(10)


def main():
    binary = os.path.abspath(sys.argv[1])
    os.makedirs(NO_CONFIG, exist_ok=True)
    if len(sys.argv) > 2 and sys.argv[2] == "--identity-inner":
        identity_inner(binary)
        return
    have_numpy = subprocess.run([PYTHON, "-c", "import numpy"],
                                capture_output=True).returncode == 0
    a = Agent(binary)
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        tests = [("ping", lambda: t_ping(a)),
                 ("exec", lambda: t_exec_basic(a, tmp)),
                 ("streaming", lambda: t_streaming(a)),
                 ("stdin", lambda: t_stdin(a)),
                 ("timeout", lambda: t_timeout(a)),
                 ("signal", lambda: t_signal(a)),
                 ("concurrent", lambda: t_concurrent(a)),
                 ("big output", lambda: t_big_output(a)),
                 ("files", lambda: t_files(a, tmp)),
                 ("window exec", lambda: t_window_exec(a)),
                 ("window exit", lambda: t_window_exit(a)),
                 ("window read", lambda: t_window_read(a, tmp)),
                 ("cancel exec", lambda: t_cancel_exec(a)),
                 ("cancel write", lambda: t_cancel_write(a, tmp)),
                 ("streams", lambda: t_streams(a, tmp)),
                 ("protocol errors", lambda: t_protocol_errors(a)),
                 ("pty", lambda: t_pty(a)),
                 ("watch", lambda: t_watch(a, tmp)),
                 ("watch out of memory", lambda: t_watch_nomem(binary, tmp)),
                 ("limits", lambda: t_limits(a)),
                 ("eval", lambda: t_eval(a, have_numpy)),
                 ("identity", lambda: t_identity(binary)),
                 ("users", lambda: t_users(binary, tmp)),
                 ("file users", lambda: t_file_users(binary, tmp)),
                 ("config bounds", lambda: t_config_bounds(binary, tmp)),
                 ("kernels", lambda: t_kernels(binary, tmp)),
                 ("broken kernels", lambda: t_broken_kernels(binary, tmp)),
                 ("disconnect", lambda: t_disconnect(binary))]
        only = os.environ.get("ONLY")
        for name, fn in tests:
            if only and name not in only.split(","):
                continue
            t0 = time.time()
            try:
                fn()
                print("ok   %-16s %.2fs" % (name, time.time() - t0))
            except Exception as e:
                failed += 1
                print("FAIL %-16s %s" % (name, e))
        check(a.proc.poll() is None, "agent died during the tests")
        rc = a.close()
    if not have_numpy:
        print("note: numpy not installed for %s; numpy checks skipped" % PYTHON)
    if rc not in (0, -signal.SIGTERM):
        print("agent exit status %d" % rc)
        failed += 1
    print("%s: %d failed" % ("FAIL" if failed else "PASS", failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
