"""Files and folders that appear whole or not at all: written under a temporary name beside the
final one, then renamed into place with os.replace (the node_exporter textfile pattern), so a
reader, or a `kill -9` mid-write, never sees half a file.

Every temporary name is `.<name>.tmp-<pid>` and every folder set aside is `.<name>.del-<pid>`:
the names the store's leftover sweep (`SnapshotStore.cleanup_temp`, `_LEFTOVER` in
sidecar/store/folders.py) recognises, so what a killed writer leaves is removed at the next
start. Errors are raised as they come (the temporary name removed first): each caller turns them
into its own message, which names the fix.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

# Text, bytes, or a function that writes into the open (binary) temporary file.
Content = str | bytes | Callable[[BinaryIO], object]
Fill = Callable[[Path], object]  # writes the folder's files into the (empty) folder it is given


def temp_path(final: Path) -> Path:
    """`.<name>.tmp-<pid>` beside FINAL."""
    return final.with_name(f".{final.name}.tmp-{os.getpid()}")


def aside_path(final: Path) -> Path:
    """`.<name>.del-<pid>` beside FINAL: where a folder goes before it is removed."""
    return final.with_name(f".{final.name}.del-{os.getpid()}")


def write_file(path: Path, content: Content, *, durable: bool = True) -> None:
    """PATH holds CONTENT, whole; the folder must exist. `durable`: the file and its folder are
    fsynced, so the new content survives a power cut (the store's files); a command's output
    (a plot, a page) skips that."""
    tmp = temp_path(path)
    try:
        if isinstance(content, str):
            with tmp.open("w") as text:  # the locale's encoding, as `Path.write_text`
                text.write(content)
                _sync(text.fileno(), text.flush, durable)
        else:
            with tmp.open("wb") as handle:
                if isinstance(content, bytes):
                    handle.write(content)
                else:
                    content(handle)
                _sync(handle.fileno(), handle.flush, durable)
        os.replace(tmp, path)
        if durable:
            fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_folder(final: Path, fill: Fill, *, durable: bool = True) -> None:
    """A new folder FINAL (its parents made as needed) with the files FILL writes; an OSError
    when a folder with files is already there. `durable`: every file and both folders fsynced."""
    _swap(final, fill, durable=durable, replace=False)


def replace_folder(final: Path, fill: Fill, *, durable: bool = False) -> None:
    """FINAL with the files FILL writes, in place of the folder there (if any): the old folder
    is renamed aside first (a folder with files cannot be renamed over) and removed after, so a
    reader sees the old folder or the new one."""
    _swap(final, fill, durable=durable, replace=True)


def _swap(final: Path, fill: Fill, *, durable: bool, replace: bool) -> None:
    tmp, old = temp_path(final), aside_path(final)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # our pid's leftover (PID 1 in every container)
        tmp.mkdir()
        fill(tmp)
        if durable:
            _fsync_tree(tmp)
        if replace and final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        if durable:
            fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if replace:
            shutil.rmtree(old, ignore_errors=True)  # a leftover goes at the next cleanup


def fsync_dir(folder: Path) -> None:
    """Make a rename (or a new file) in FOLDER durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    for path in folder.iterdir():
        if path.is_dir():
            _fsync_tree(path)
            continue
        with path.open("rb") as handle:
            os.fsync(handle.fileno())
    fsync_dir(folder)


def _sync(fd: int, flush: Callable[[], None], durable: bool) -> None:
    if durable:
        flush()
        os.fsync(fd)
