"""forkd's Python SDK: sandboxes forked from warm microVM snapshots, shaped like E2B's SDK so
moving over is a change of import. Standard library only; talks to the forkd daemon's REST API."""

from ._transport import DEFAULT_SOCKET
from .code import Context, Execution, ExecutionError, Logs, Result
from .commands import CommandHandle, Commands, ProcessInfo
from .controller import Controller
from .errors import (
    AuthenticationError,
    AuthenticationException,
    CommandExitError,
    CommandExitException,
    CommandResult,
    CommandTimeoutError,
    ConflictError,
    ConnectionError,
    ForkdError,
    GuestError,
    InvalidArgumentError,
    InvalidArgumentException,
    NotFoundError,
    NotFoundException,
    RateLimitError,
    RateLimitException,
    SandboxError,
    SandboxException,
    TimeoutError,
    TimeoutException,
    UnavailableError,
)
from .files import EntryInfo, Files, FileType, WriteEntry, WriteInfo
from .paginator import SandboxPaginator, SandboxQuery
from .pty import Pty, PtySize
from .sandbox import (DEFAULT_SNAPSHOT, BranchInfo, ForkError, Sandbox, SandboxInfo, SandboxMetrics,
                      SandboxState, SnapshotInfo, fork)
from .watch import EventType, FilesystemEvent, FilesystemEventType, WatchHandle
from .webhooks import verify_webhook

__version__ = "0.1.0"

__all__ = [
    "AuthenticationError", "AuthenticationException", "BranchInfo", "CommandExitError", "CommandExitException",
    "CommandHandle", "CommandResult", "Commands", "ConflictError", "ConnectionError", "Controller",
    "DEFAULT_SNAPSHOT", "DEFAULT_SOCKET", "EntryInfo", "Execution", "ExecutionError", "Files", "ForkError",
    "ForkdError", "GuestError", "InvalidArgumentError", "InvalidArgumentException", "Logs", "NotFoundError",
    "NotFoundException", "ProcessInfo", "RateLimitError", "RateLimitException", "Result", "Sandbox",
    "SandboxError", "SandboxException", "SandboxInfo", "TimeoutError", "TimeoutException", "UnavailableError", "WriteInfo",
    "fork", "CommandTimeoutError", "Context", "EventType", "FilesystemEventType", "FileType", "FilesystemEvent", "SandboxMetrics",
    "Pty", "PtySize", "SandboxPaginator", "SandboxQuery", "SandboxState", "SnapshotInfo", "WatchHandle", "WriteEntry",
    "verify_webhook",
]
