"""sidecar/store/atomic.py: files and folders appear whole, under the temporary names the
store's leftover sweep knows."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

import pytest

from sidecar.store.atomic import (
    aside_path,
    replace_folder,
    temp_path,
    write_file,
    write_folder,
)
from sidecar.store.folders import _LEFTOVER


def test_temporary_names_are_the_ones_the_leftover_sweep_removes(tmp_path: Path) -> None:
    for name in (temp_path(tmp_path / "index.json"), aside_path(tmp_path / "20261201T120000Z")):
        m = _LEFTOVER.match(name.name)
        assert m is not None and int(m["pid"]) == os.getpid()
    assert temp_path(tmp_path / "a.svg").name == f".a.svg.tmp-{os.getpid()}"


@pytest.mark.parametrize("durable", [True, False])
def test_write_file_takes_text_bytes_or_a_writer(tmp_path: Path, durable: bool) -> None:
    def writer(handle: BinaryIO) -> None:
        handle.write(b"written")

    for name, content, expected in (("t.txt", "text\n", b"text\n"), ("b.bin", b"\x00\x01",
                                    b"\x00\x01"), ("w.bin", writer, b"written")):  # fmt: skip
        write_file(tmp_path / name, content, durable=durable)
        assert (tmp_path / name).read_bytes() == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.bin", "t.txt", "w.bin"]


def test_write_file_replaces_and_leaves_nothing_on_failure(tmp_path: Path) -> None:
    path = tmp_path / "index.json"
    write_file(path, "old")

    def broken(handle: BinaryIO) -> None:
        handle.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_file(path, broken)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["index.json"]
    write_file(path, "new")
    assert path.read_text() == "new"


def test_a_file_gets_the_umask_mode_not_a_private_one(tmp_path: Path) -> None:
    mask = os.umask(0o022)
    try:
        write_file(tmp_path / "plot.svg", "<svg/>", durable=False)
    finally:
        os.umask(mask)
    assert (tmp_path / "plot.svg").stat().st_mode & 0o777 == 0o644


def test_write_folder_makes_a_new_folder_whole(tmp_path: Path) -> None:
    final = tmp_path / "out" / "20261201T120000Z"
    write_folder(final, lambda d: (d / "summary.json").write_text("{}"))
    assert [p.name for p in final.iterdir()] == ["summary.json"]
    assert [p.name for p in final.parent.iterdir()] == ["20261201T120000Z"]


def test_write_folder_never_replaces_a_folder_with_files(tmp_path: Path) -> None:
    final = tmp_path / "snap"
    write_folder(final, lambda d: (d / "a").write_text("first"))
    with pytest.raises(OSError):
        write_folder(final, lambda d: (d / "a").write_text("second"))
    assert (final / "a").read_text() == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["snap"]


def test_a_failed_fill_leaves_no_temporary_folder(tmp_path: Path) -> None:
    def fill(folder: Path) -> None:
        (folder / "half").write_text("x")
        raise RuntimeError("writer bug")

    with pytest.raises(RuntimeError):
        write_folder(tmp_path / "snap", fill)
    assert list(tmp_path.iterdir()) == []


def test_our_own_leftover_does_not_block_a_write(tmp_path: Path) -> None:
    """In a container the sidecar is PID 1 on every run: a temp folder of ours may be there."""
    temp_path(tmp_path / "snap").mkdir()
    (temp_path(tmp_path / "snap") / "stale").write_text("x")
    write_folder(tmp_path / "snap", lambda d: (d / "new").write_text("y"))
    assert [p.name for p in tmp_path.iterdir()] == ["snap"]
    assert [p.name for p in (tmp_path / "snap").iterdir()] == ["new"]


def test_replace_folder_swaps_the_old_folder_out(tmp_path: Path) -> None:
    run = tmp_path / "logdir" / "host" / "m@8000"
    replace_folder(run, lambda d: (d / "events.1").write_text("one"))
    replace_folder(run, lambda d: (d / "events.2").write_text("two"), durable=True)
    assert [p.name for p in run.iterdir()] == ["events.2"]
    assert [p.name for p in run.parent.iterdir()] == ["m@8000"]
