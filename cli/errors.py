"""What the command line prints for an error it knows: one line, never a traceback.

cli.main's entry point calls `one_line` for any exception a command raises; an exception it does not
know (a bug) keeps its traceback.
"""

from __future__ import annotations


def one_line(exc: BaseException) -> str | None:
    """`xclp: …` for an error the user can act on, else None (let it propagate)."""
    import httpx

    from clients.agent import AgentError
    from clients.api import ApiError, NotTheApi
    from service.db import DatabaseError

    if isinstance(exc, httpx.InvalidURL):
        return f"error: --coordinator: not a URL ({exc}); give e.g. http://HOST:8000"
    if isinstance(exc, NotTheApi):  # a wrong --coordinator URL: the reply says nothing useful
        return f"error: {exc.detail}"
    if isinstance(exc, ApiError):  # the coordinator's message says what is wrong
        return f"coordinator said {_flat(exc)}"
    if isinstance(exc, (AgentError, DatabaseError, ValueError, OSError)):  # DataError is a ValueError
        return f"error: {_flat(exc)}"
    return None


def _flat(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
