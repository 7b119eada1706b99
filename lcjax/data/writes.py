"""Writing an output folder whole: a folder that already holds files is refused unless the
caller says to replace it, and the new contents are written into a temporary folder beside
it that then takes its place, so a reader never sees old and new files mixed and a failed
write leaves the old folder as it was (and no temporary behind).

:func:`check_writable` is the refusal alone (run it before any work);
:func:`replace_folder` is the write; :func:`check_removable` guards every removal of a
folder the user named (also ``lcjax train --overwrite``).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import secrets
import shutil
from collections.abc import Iterator

from lcjax.errors import UsageError

__all__ = ["check_removable", "check_writable", "replace_folder"]


def check_removable(path: str | os.PathLike) -> None:
    """Raises ValueError if ``path`` is the filesystem root, the home folder, or the working
    folder or one above it: folders no command removes or replaces."""
    real, cwd = os.path.realpath(path), os.path.realpath(os.getcwd())
    home = os.path.realpath(os.path.expanduser("~"))
    if real in (os.path.realpath(os.sep), home) or cwd == real or cwd.startswith(
            real.rstrip(os.sep) + os.sep):
        raise UsageError(f"{os.fspath(path)!r} is the root, home or working folder (or above "
                         "it): refusing to replace it; name a subfolder")


def check_writable(out: str | os.PathLike, *, overwrite: bool) -> None:
    """Raises ValueError if ``out`` is a file, or a folder holding files while ``overwrite``
    is False (the message lists a few of them)."""
    path = os.fspath(out)
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"output {path!r} is a file, not a folder")
    entries = sorted(os.listdir(path)) if os.path.isdir(path) else []
    if entries and not overwrite:
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise UsageError(f"output folder {path!r} already holds data ({shown}): choose a new "
                         "folder, or replace it whole with overwrite=True (--overwrite)")


@contextlib.contextmanager
def replace_folder(out: str | os.PathLike, *, overwrite: bool) -> Iterator[pathlib.Path]:
    """Yields an empty temporary folder beside ``out``; when the block ends without error
    it becomes ``out`` (the old ``out``, if any, is removed), on error it is removed.

    Raises:
      ValueError: as :func:`check_writable`, or ``out`` may not be replaced
        (:func:`check_removable`).
    """
    check_writable(out, overwrite=overwrite)
    final = os.path.abspath(out)
    check_removable(final)
    parent, name = os.path.split(final)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    os.mkdir(tmp)  # the usual permissions (umask), unlike tempfile.mkdtemp's 0o700
    try:
        yield pathlib.Path(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _swap_in(tmp, final)


def _swap_in(tmp: str, final: str) -> None:
    """Renames ``tmp`` to ``final``, moving an existing ``final`` aside first and removing
    it after (or putting it back if the rename fails)."""
    if not os.path.exists(final):
        os.rename(tmp, final)
        return
    head, tail = os.path.split(tmp)
    old = os.path.join(head, tail.replace(".tmp-", ".old-", 1))
    os.rename(final, old)
    try:
        os.rename(tmp, final)
    except BaseException:
        os.rename(old, final)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
