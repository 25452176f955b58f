"""The command line's files: check that an output can be written before measuring, and never lose what was
measured when writing fails after all."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from fp8select.errors import Fp8SelectError

__all__ = ["check_writable", "save_or_rescue", "write_json"]


def check_writable(path: str | Path, what: str, *, directory: bool = False, hint: str = "") -> None:
    """Fail now, with one line, if the file ``path`` (or, with ``directory``, a file in it) could
    not be written later.

    Writes and removes a temporary file in the directory (or, when the directory is still to be
    created, checks its nearest existing parent); creates nothing else and leaves an existing
    file untouched.
    """
    target = Path(path).expanduser()
    folder = target if directory else target.parent
    where = f"{what} {str(target)!r}"

    def fail(reason: str) -> NoReturn:
        raise Fp8SelectError(f"cannot write {where}: {reason}" + (f" ({hint})" if hint else ""))

    if not directory and target.is_dir():
        fail("it is a directory")
    if not directory and target.exists() and not target.is_file():  # /dev/null, a fifo: an atomic replace would clobber it
        fail("it is not a regular file")
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        fail(f"{str(existing)!r} is not a directory")
    if existing != folder:  # to be created when writing: its nearest existing parent must take a new directory
        if not os.access(existing, os.W_OK | os.X_OK):
            fail(f"cannot create a directory in {str(existing)!r} (permission denied)")
    else:
        try:
            fd, probe = tempfile.mkstemp(dir=folder, prefix=".fp8select-write-check-")
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            fail(str(exc.strerror or exc))
    if not directory and target.exists() and not os.access(target, os.W_OK):
        fail("permission denied")


def save_or_rescue(path: str | Path, save: Callable[[Path], None], data: Any, what: str) -> bool:
    """``save(path)``, or, when that fails, ``data`` as JSON in a fallback file, saying where.

    Measurements can take long; a write that fails after them (a disk filled up, a directory
    removed) must not lose them. The fallback is a new file in the current directory, else in
    the temporary directory, else the JSON goes to standard output. Returns whether ``path`` was written.
    """
    target = Path(path).expanduser()
    try:
        save(target)
        return True
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    text = json.dumps(data, indent=1, sort_keys=True, default=str) + "\n"
    stem = f"fp8select-{what.replace(' ', '-')}-{time.strftime('%Y%m%d-%H%M%S')}-"
    for directory in (os.getcwd(), tempfile.gettempdir()):
        try:
            fd, rescue = tempfile.mkstemp(dir=directory, prefix=stem, suffix=".json")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError:
            continue
        print(f"fp8select: error: cannot write the {what} to {str(target)!r} ({reason}); it was saved to {rescue!r} "
              "instead", file=sys.stderr)
        return False
    print(f"fp8select: error: cannot write the {what} to {str(target)!r} ({reason}), nor a fallback file; "
          "here it is:", file=sys.stderr)
    print(text)
    return False


def write_json(data: Any) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1)

    return write
