"""Typed errors, mapped from the daemon's error envelope {"error": {"code", "message", "details"}}.

Catch ForkdError for all of them, or a subclass for one kind. TimeoutError and ConnectionError
are also the built-in exceptions of the same name, so existing handlers keep working.
"""

import builtins


class ForkdError(Exception):
    """Base of every forkd error. `code` is the daemon's stable error code."""

    def __init__(self, message, code="internal", status=0, details=None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.details = details or {}


SandboxException = ForkdError  # E2B's name
SandboxError = ForkdError


class InvalidArgumentError(ForkdError):
    pass


class NotFoundError(ForkdError):
    pass


class ConflictError(ForkdError):
    pass


class TimeoutError(ForkdError, builtins.TimeoutError):  # noqa: A001 - deliberate
    pass


class AuthenticationError(ForkdError):
    pass


class RateLimitError(ForkdError):
    """Too many sandboxes, or a rate limit."""


class UnavailableError(ForkdError):
    pass


class GuestError(ForkdError):
    """The guest misbehaved or its agent failed."""


class ConnectionError(ForkdError, builtins.ConnectionError):  # noqa: A001 - deliberate
    """The daemon could not be reached."""


NotFoundException = NotFoundError
InvalidArgumentException = InvalidArgumentError
TimeoutException = TimeoutError
AuthenticationException = AuthenticationError
RateLimitException = RateLimitError

_BY_CODE = {
    "invalid_argument": InvalidArgumentError,
    "not_found": NotFoundError,
    "conflict": ConflictError,
    "timeout": TimeoutError,
    "unauthenticated": AuthenticationError,
    "forbidden": AuthenticationError,
    "payload_too_large": InvalidArgumentError,
    "resource_exhausted": RateLimitError,
    "rate_limited": RateLimitError,
    "unavailable": UnavailableError,
    "guest_error": GuestError,
    "agent_protocol": GuestError,
}


def error_from_envelope(status, code, message, details=None):
    return _BY_CODE.get(code, ForkdError)(message, code=code, status=status, details=details)


class CommandResult:
    """What a finished command left. exit_code is -1 when a signal ended it."""

    def __init__(self, exit_code, stdout, stderr, signal=None, timed_out=False, error=None):
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr
        self.signal = signal
        self.timed_out = timed_out
        self.error = error

    def __repr__(self):
        return "CommandResult(exit_code=%r, stdout=%r, stderr=%r, error=%r)" % (
            self.exit_code, self.stdout[:200], self.stderr[:200], self.error)


class CommandExitError(ForkdError):
    """Raised by commands.run() (and a handle's wait()) when the exit code is not 0."""

    def __init__(self, result):
        how = "signal %d" % result.signal if result.signal is not None else "code %d" % result.exit_code
        super().__init__("command exited with %s%s" % (how, ": " + result.stderr[:500] if result.stderr else ""),
                         code="command_exit")
        self.result = result

    @property
    def exit_code(self):
        return self.result.exit_code

    @property
    def stdout(self):
        return self.result.stdout

    @property
    def stderr(self):
        return self.result.stderr

    @property
    def error(self):
        return self.result.error


CommandExitException = CommandExitError


class CommandTimeoutError(TimeoutError, CommandExitError):
    """A command ran past its `timeout` and was killed (E2B raises its TimeoutException for it).

    Both a TimeoutError (E2B's TimeoutException) and a CommandExitError (with the output so far)."""

    def __init__(self, result):
        ForkdError.__init__(self, "command timed out (killed after its timeout)%s" % (
            ": " + result.stderr[:500] if result.stderr else ""), code="timeout")
        self.result = result
