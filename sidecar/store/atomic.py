"""Files and folders that appear whole or not at all: written under a temporary name beside the
final one, then renamed into place with os.replace (the node_exporter textfile pattern), so a
reader, or a `kill -9` mid-write, never sees half a file.

Every temporary name is `.<name>.tmp-<pid>` and every folder set aside is `.<name>.del-<pid>`:
the names the store's leftover sweep (`SnapshotStore.cleanup_temp`, `_LEFTOVER` in
sidecar/store/folders.py) recognises, so what a killed writer leaves is removed at the next
start. Errors are raised as they come (the temporary name removed first): each caller turns them
into its own message, which names the fix.

What the store writes is private (issue 26, item 2): its files are FILE_MODE and its folders
DIR_MODE whatever the process umask (Docker, Compose and Kubernetes run the daemon as root with
umask 022), set explicitly with fchmod/chmod; the umask itself is never changed. `private`
defaults to `durable`: the store's files are both, a command's output (a plot, a page, a copy)
is neither and keeps the umask's mode. A temporary name is never followed (issue 26, item 3: the
daemon is PID 1 in every container, so `.index.json.tmp-1` is a name anyone who can write the
folder could plant): a file is created with O_CREAT | O_EXCL | O_NOFOLLOW, a folder by mkdir
(which never follows); a leftover of ours in the way is removed without following it (unlink,
or rmtree, which does not follow links either) and a symbolic link there, which the sidecar
never makes, is refused with an OSError that says so.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

# Text, bytes, or a function that writes into the open (binary) temporary file.
Content = str | bytes | Callable[[BinaryIO], object]
Fill = Callable[[Path], object]  # writes the folder's files into the (empty) folder it is given

FILE_MODE = 0o640  # the store's files: the daemon's user reads and writes, its group reads
DIR_MODE = 0o750  # the store's folders
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def temp_path(final: Path) -> Path:
    """`.<name>.tmp-<pid>` beside FINAL."""
    return final.with_name(f".{final.name}.tmp-{os.getpid()}")


def aside_path(final: Path) -> Path:
    """`.<name>.del-<pid>` beside FINAL: where a folder goes before it is removed."""
    return final.with_name(f".{final.name}.del-{os.getpid()}")


def write_file(
    path: Path, content: Content, *, durable: bool = True, private: bool | None = None
) -> None:
    """PATH holds CONTENT, whole; the folder must exist. `durable`: the file and its folder are
    fsynced, so the new content survives a power cut (the store's files); a command's output
    (a plot, a page) skips that. `private` (default: `durable`): FILE_MODE whatever the umask;
    otherwise the umask's mode, as `Path.write_text` gives."""
    private = durable if private is None else private
    tmp = temp_path(path)
    fd = _create_file(tmp, private)
    try:
        if isinstance(content, str):
            with open(fd, "w") as text:  # the locale's encoding, as `Path.write_text`
                text.write(content)
                _sync(text.fileno(), text.flush, durable)
        else:
            with open(fd, "wb") as handle:
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


def write_folder(
    final: Path, fill: Fill, *, durable: bool = True, private: bool | None = None
) -> None:
    """A new folder FINAL (its parents made as needed) with the files FILL writes; an OSError
    when a folder with files is already there. `durable`: every file and both folders fsynced.
    `private` (default: `durable`): the folders made (parents too) DIR_MODE and every file in
    FINAL FILE_MODE, whatever the umask."""
    _swap(final, fill, durable=durable, replace=False, private=private)


def replace_folder(
    final: Path, fill: Fill, *, durable: bool = False, private: bool | None = None
) -> None:
    """FINAL with the files FILL writes, in place of the folder there (if any): the old folder
    is renamed aside first (a folder with files cannot be renamed over) and removed after, so a
    reader sees the old folder or the new one."""
    _swap(final, fill, durable=durable, replace=True, private=private)


def make_folder(folder: Path, *, private: bool = True) -> None:
    """FOLDER and the parents it lacks (`mkdir -p`). `private`: each folder made here is
    DIR_MODE whatever the umask (which mkdir's mode is subject to, so it is set again, on the
    folder opened without following a link); a folder already there keeps its mode."""
    if not private:
        folder.mkdir(parents=True, exist_ok=True)
        return
    missing: list[Path] = []
    while not folder.is_dir() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        try:
            path.mkdir(mode=DIR_MODE)
        except FileExistsError:
            if path.is_dir():
                continue  # made meanwhile (another writer): its maker set its mode
            raise
        _chmod_folder(path)


def _swap(final: Path, fill: Fill, *, durable: bool, replace: bool, private: bool | None) -> None:
    tmp, old = temp_path(final), aside_path(final)
    private = durable if private is None else private
    try:
        make_folder(final.parent, private=private)
        _remove_leftover(tmp)  # our pid's leftover (PID 1 in every container)
        tmp.mkdir(mode=DIR_MODE if private else 0o777)  # mkdir never follows a link
        if private:
            _chmod_folder(tmp)
        fill(tmp)
        if private:
            _make_private(tmp)
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


def _create_file(tmp: Path, private: bool) -> int:
    """TMP created, never opened as it was: O_EXCL fails on anything there, a symbolic link
    included (not followed), and a leftover of ours is removed first and the create tried
    again; a hard link there is unlinked, so the file it shares goes untouched. `private`:
    FILE_MODE, set again once open (the umask applies to the mode open is given)."""
    mode = FILE_MODE if private else 0o666
    try:
        fd = os.open(tmp, _CREATE, mode)
    except FileExistsError:
        _remove_leftover(tmp)
        fd = os.open(tmp, _CREATE, mode)
    if private:
        try:
            os.fchmod(fd, FILE_MODE)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
    return fd


def _remove_leftover(tmp: Path) -> None:
    """Whatever a killed writer of our pid left at TMP, removed without following it (rmtree
    does not follow links). A symbolic link is no leftover of the sidecar's, which makes none:
    an OSError (EEXIST) that says so, and the link stays for the operator to see."""
    try:
        info = os.lstat(tmp)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise OSError(
            errno.EEXIST,
            f"{tmp} is a symbolic link, which the sidecar never makes (someone planted it to "
            f"have a file it points to overwritten): remove it, and let no other user write "
            f"{tmp.parent}",
        )
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(tmp)
    else:
        tmp.unlink()


def _chmod_folder(folder: Path) -> None:
    """FOLDER DIR_MODE; opened with O_NOFOLLOW, so a link put in its place is not chmodded."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, DIR_MODE)
    finally:
        os.close(fd)


def _make_private(folder: Path) -> None:
    """Every file under FOLDER (a new, still private, temporary folder) FILE_MODE and every
    folder DIR_MODE: its writers (pyarrow, `Path.write_text`) create them with the umask's."""
    for path in folder.iterdir():
        mode = path.lstat().st_mode
        if stat.S_ISDIR(mode):
            path.chmod(DIR_MODE)
            _make_private(path)
        elif stat.S_ISREG(mode):
            path.chmod(FILE_MODE)


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
