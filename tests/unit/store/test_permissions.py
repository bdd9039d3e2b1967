"""Issue 26, items 2 and 3: what the store writes is the daemon's alone (files 0640, folders
0750, whatever the umask), a link planted at a temporary name is never followed, and an output
folder that another user could write in is refused at start. On tmp_path; no processes."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.errors import OutputError
from sidecar.store.atomic import temp_path, write_file, write_folder
from sidecar.store.folders import SnapshotStore, check_writable
from sidecar.store.incidents import write_incident
from sidecar.store.layout import SnapshotKind
from sidecar.store.trend_table import TrendTable
from tests.unit.store.test_store import HOST, NO_LIMITS, T0, snapshot


@pytest.fixture(params=[0o022, 0o077, 0o000], ids=["umask-022", "umask-077", "umask-000"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """Docker's, Compose's and Kubernetes' 022 (world-readable), and the two extremes."""
    mask = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(mask)


def wrong_modes(root: Path) -> dict[str, str]:
    """Every folder and file under ROOT (ROOT included) whose mode is not 0750 / 0640."""
    wrong = {}
    for path in [root, *root.rglob("*")]:
        mode = path.lstat().st_mode & 0o7777
        if mode != (0o750 if path.is_dir() else 0o640):
            wrong[str(path.relative_to(root.parent))] = oct(mode)
    return wrong


# ---------------------------------------------------------------- item 2: modes


def test_what_the_store_writes_is_private_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    out = tmp_path / "out"
    check_writable(out / HOST)  # the daemon's start makes the output and host folders
    store = SnapshotStore(out, HOST, NO_LIMITS)
    written = store.write(snapshot(), SnapshotKind.SNAPSHOT)
    assert written.path is not None
    TrendTable(store.dir).compact()  # the table's main file, beside its parts folder
    write_incident(store.dir, snapshot(T0 + 60), {4242: ("py-spy dump", "Thread 0x1 (idle)\n")},
                   (), 0)  # fmt: skip
    names = {p.name for p in out.rglob("*")}
    assert {"index.json", "summary.json", "stacks.parquet", "dump-4242-other.txt"} <= names
    assert wrong_modes(out) == {}


def test_a_store_file_is_0640_and_a_commands_output_keeps_the_umask(
    tmp_path: Path, umask: int
) -> None:
    write_file(tmp_path / "index.json", "{}")
    write_file(tmp_path / "plot.svg", "<svg/>", durable=False)  # a command's output: the user's
    assert (tmp_path / "index.json").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "plot.svg").stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_new_folder_and_the_parents_it_needs_are_0750(tmp_path: Path, umask: int) -> None:
    write_folder(tmp_path / "out" / HOST / "snap", lambda d: (d / "deep").mkdir())
    assert wrong_modes(tmp_path / "out") == {}


# ---------------------------------------------------------------- item 3: planted links


def test_a_link_at_the_temporary_name_is_not_followed(tmp_path: Path) -> None:
    """The daemon is PID 1 in every container: `.index.json.tmp-1` is a name anyone can plant."""
    host = tmp_path / "out" / HOST
    host.mkdir(parents=True)
    victim = tmp_path / "shadow"
    victim.write_text("root's file")
    temp_path(host / "index.json").symlink_to(victim)
    with pytest.raises(OSError, match="symbolic link"):
        write_file(host / "index.json", '{"evil": true}')
    assert victim.read_text() == "root's file"
    assert not (host / "index.json").exists()


def test_the_store_refuses_a_planted_link_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    host = tmp_path / "out" / HOST
    host.mkdir(parents=True)
    victim = tmp_path / "shadow"
    victim.write_text("root's file")
    temp_path(host / "index.json").symlink_to(victim)
    with caplog.at_level(logging.WARNING, logger="vllm_sidecar"):
        SnapshotStore(tmp_path / "out", HOST, NO_LIMITS)  # writes its index at once
    assert victim.read_text() == "root's file"
    assert "symbolic link" in caplog.text


def test_a_hard_link_at_the_temporary_name_is_replaced_not_written_through(
    tmp_path: Path,
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.link(victim, temp_path(tmp_path / "index.json"))
    write_file(tmp_path / "index.json", "{}")
    assert victim.read_text() == "precious"
    assert (tmp_path / "index.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.json", "victim"]


def test_our_own_leftover_file_is_replaced(tmp_path: Path) -> None:
    """A `kill -9` mid-write by an earlier life of the same pid (PID 1 in a container)."""
    temp_path(tmp_path / "index.json").write_text("half")
    write_file(tmp_path / "index.json", "{}")
    assert [p.name for p in tmp_path.iterdir()] == ["index.json"]


def test_a_link_at_a_temporary_folder_name_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "etc"
    victim.mkdir()
    (victim / "passwd").write_text("root:x:0:0")
    out = tmp_path / "out"
    out.mkdir()
    temp_path(out / "snap").symlink_to(victim)
    with pytest.raises(OSError, match="symbolic link"):
        write_folder(out / "snap", lambda d: (d / "passwd").write_text("evil"))
    assert [p.name for p in victim.iterdir()] == ["passwd"]
    assert (victim / "passwd").read_text() == "root:x:0:0"


# ---------------------------------------------------------------- item 3: the output folder


@pytest.mark.parametrize("writable", ["out", HOST])
def test_a_folder_others_can_write_is_refused(tmp_path: Path, writable: str) -> None:
    (tmp_path / "out" / HOST).mkdir(parents=True)
    path = tmp_path / "out" if writable == "out" else tmp_path / "out" / HOST
    path.chmod(0o777)
    with pytest.raises(OutputError, match=r"writable by other users.*chmod o-w .*output\.dir"):
        check_writable(tmp_path / "out" / HOST)


def test_a_new_folder_under_one_others_can_write_is_refused_before_it_is_made(
    tmp_path: Path,
) -> None:
    (tmp_path / "out").mkdir(mode=0o777)
    (tmp_path / "out").chmod(0o777)
    with pytest.raises(OutputError, match=str(tmp_path / "out")):
        check_writable(tmp_path / "out" / HOST)
    assert not (tmp_path / "out" / HOST).exists()


def test_a_sticky_parent_such_as_tmp_is_accepted_but_not_as_the_folder_itself(
    tmp_path: Path,
) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out").chmod(0o1777)  # as /tmp: others may add names, not replace ours
    check_writable(tmp_path / "out" / HOST)
    (tmp_path / "out" / HOST).chmod(0o1777)
    with pytest.raises(OutputError, match="writable by other users"):
        check_writable(tmp_path / "out" / HOST)


def test_a_folder_of_another_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "out" / HOST).mkdir(parents=True)
    monkeypatch.setattr(os, "geteuid", lambda: 4242)  # the daemon runs as another user
    with pytest.raises(OutputError, match=r"owned by uid \d+.*chown .*4242"):
        check_writable(tmp_path / "out" / HOST)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_root_daemon_refuses_an_output_folder_a_user_owns(tmp_path: Path) -> None:
    """The attack of issue 26, item 3: the user owns (so can write) the folder root writes in."""
    (tmp_path / "out").mkdir()
    os.chown(tmp_path / "out", 65534, 65534)
    with pytest.raises(OutputError, match=r"owned by uid 65534.*chown"):
        check_writable(tmp_path / "out" / HOST)
    assert not (tmp_path / "out" / HOST).exists()


def test_the_daemons_own_folder_passes(tmp_path: Path) -> None:
    check_writable(tmp_path / "out" / HOST)
    check_writable(tmp_path / "out" / HOST)  # and again, once it is there
    check_writable(tmp_path / "out" / HOST / "tiny@8000")  # a fleet daemon's deployment folder
