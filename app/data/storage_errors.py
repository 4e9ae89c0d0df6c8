"""What a failed database write means for the user, in words: another Hearth holds the database, or the disk
is full, or the file cannot be written.

No Qt here: the window and the chat pane show these texts; :func:`storage_error_text` tells a storage failure
from any other error.
"""

from __future__ import annotations

import errno
import sqlite3

LOCKED_TEXT = ("Hearth could not save to its conversations database because another program is using it, "
               "most likely another Hearth window. Close the other Hearth and try again; "
               "what is on screen is kept, and nothing saved before is lost.")
FULL_TEXT = ("Hearth could not save to its conversations database because the disk is full. "
             "Free some disk space and try again; what is on screen is kept, and nothing saved before is lost.")
READ_ONLY_TEXT = ("Hearth could not save to its conversations database because the file or its folder cannot "
                  "be written. Check that Hearth's data folder is yours and writable, then try again.")

_LOCKED_CODES = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}
_FULL_CODES = {sqlite3.SQLITE_FULL}
_READ_ONLY_CODES = {sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN}


def _code(exc: sqlite3.Error) -> int | None:
    """The primary SQLite result code (the extended code's low byte), when the error carries one."""
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else int(code) & 0xFF


def storage_error_text(exc: BaseException) -> str | None:
    """What happened and what to do, for a database failure; None for an error that is not one.

    Args:
        exc: raised by :class:`~app.data.storage.Storage` (or by SQLite through it).
    """
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return FULL_TEXT
    if isinstance(exc, OSError) and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return READ_ONLY_TEXT
    if not isinstance(exc, sqlite3.Error):
        return None
    code, message = _code(exc), str(exc).lower()
    if code in _LOCKED_CODES or "locked" in message or "busy" in message:
        return LOCKED_TEXT
    if code in _FULL_CODES or "full" in message:
        return FULL_TEXT
    if code in _READ_ONLY_CODES or "readonly" in message or "read-only" in message:
        return READ_ONLY_TEXT
    return (f"Hearth could not use its conversations database ({exc}). Try again; if it keeps failing, "
            "restart Hearth. What is on screen is kept.")


def is_storage_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a database failure that :func:`storage_error_text` explains."""
    return storage_error_text(exc) is not None
