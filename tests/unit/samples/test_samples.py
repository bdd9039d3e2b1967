"""The recorded samples shipped in the package (sidecar/samples/) and `vllm-sidecar samples`:
written out whole, never over a folder that holds something else, read through
importlib.resources (from a zip too), every folder read and reported by today's code, and every
command the output suggests run on the folder it wrote."""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import sidecar
import sidecar.samples as samples_module
from sidecar.cli import cli, main
from sidecar.errors import OutputError
from sidecar.records.summary import SCHEMA_VERSION
from sidecar.samples import (
    DATA,
    README,
    RECORDING,
    Sample,
    described,
    next_commands,
    write_samples,
)
from sidecar.store.layout import OutputTree, SnapshotKind
from sidecar.store.stacks import COLLAPSED, PARQUET

PACKAGE_DIR = Path(samples_module.__file__).parent  # the checkout's copy, to build other copies
SHIPPED = described(Path("unused"))
IDS = [s.path for s in SHIPPED.samples]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The samples written once for the read-only tests of this module."""
    dest = tmp_path_factory.mktemp("samples") / "out"
    write_samples(dest)
    return dest


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def shipped_part(folder: Path) -> dict[str, bytes]:
    """What of a written host folder comes from the package as it is (all but the
    stacks.collapsed files written from the stacks.parquet beside them)."""
    return {k: v for k, v in tree(folder).items() if Path(k).name != COLLAPSED}


def test_the_output_folder_is_written_whole_with_its_readme(tmp_path: Path) -> None:
    dest = tmp_path / "new" / "samples"  # parents made
    done = write_samples(dest)
    assert sorted(p.name for p in dest.iterdir()) == sorted([done.host, README])
    assert shipped_part(dest / done.host) == tree(PACKAGE_DIR / DATA / done.host)
    assert (dest / README).read_bytes() == (PACKAGE_DIR / README).read_bytes()
    assert done.files == len(tree(dest / done.host))
    assert done.size_bytes == sum(len(b) for b in tree(dest / done.host).values())
    assert not [p for p in dest.rglob("*") if p.name.startswith(".")]  # no temporary left


def written_once(dest: Path) -> Path:
    return dest / write_samples(dest).host


def test_each_stacks_collapsed_is_the_one_the_daemon_wrote(written: Path) -> None:
    """Not shipped, written from stacks.parquet: byte for byte the daemon's file, whose sha256
    the recorder kept after checking the same."""
    sums = json.loads((PACKAGE_DIR / RECORDING).read_text())["collapsed_sha256"]
    parquets = sorted(p.parent for p in written.rglob(PARQUET))
    assert len(sums) == len(parquets) >= len(SHIPPED.samples)
    for folder in parquets:
        digest = hashlib.sha256((folder / COLLAPSED).read_bytes()).hexdigest()
        assert digest == sums[str(folder.relative_to(written))], folder


def test_the_samples_cover_what_the_first_minute_needs() -> None:
    """Snapshots under three loads, a baseline of the steady load, an incident; and the steady
    baseline is the latest (what `diff --baseline` compares the latest snapshot with)."""
    kinds = {(s.sample, s.kind) for s in SHIPPED.samples}
    for wanted in [("prefill-heavy", "snapshot"), ("steady", "snapshot"),
                   ("kv-starved", "snapshot"), ("steady", "baseline"),
                   ("incident", "incident")]:  # fmt: skip
        assert wanted in kinds
    baselines = [s for s in SHIPPED.samples if s.kind == "baseline"]
    assert baselines[-1].sample == "steady"
    snapshots = [s for s in SHIPPED.samples if s.kind == "snapshot"]
    assert snapshots[-1].sample == "kv-starved"


def test_the_package_data_is_small_and_has_no_hidden_files() -> None:
    files = [p for p in PACKAGE_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert sum(p.stat().st_size for p in files) < 1.5 * 2**20
    assert not [p for p in files if any(part.startswith(".") for part in p.parts[-6:])]


def test_the_readme_describes_every_shipped_folder() -> None:
    text = (PACKAGE_DIR / README).read_text()
    record = json.loads((PACKAGE_DIR / RECORDING).read_text())
    for path in record["folders"]:
        assert f"| `{path.split('/', 1)[1]}` |" in text, path
    assert record["healthy"]["vllm_log"]["version"] in text


@pytest.mark.parametrize("sample", SHIPPED.samples, ids=IDS)
def test_every_shipped_folder_loads_and_reports_with_this_code(
    written: Path, sample: Sample
) -> None:
    snap = sidecar.load(written / sample.path)
    assert snap.summary.schema == SCHEMA_VERSION  # recorded by this version: no upgrade
    assert "[Profile] Computation Time:" in snap.report()
    stacks = snap.stacks()  # the flame graph's input
    assert len(stacks) > 0 and stacks["weight"].sum() > 0
    assert (written / sample.path / "stacks.collapsed").is_file()


def test_the_folder_reads_as_one_host_with_its_baselines(written: Path) -> None:
    out = OutputTree(written)
    assert out.hosts() == [SHIPPED.host]
    assert len(out.snapshots(SnapshotKind.BASELINE)) == 1
    latest = out.latest(SnapshotKind.SNAPSHOT)
    assert latest is not None and latest.name == Path(SHIPPED.of("kv-starved")[-1].path).name


def test_a_folder_with_something_in_it_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match=r"is not empty \(notes.txt\): give a new or empty"):
        write_samples(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_samples_written_before_are_replaced_only_with_force(tmp_path: Path) -> None:
    done = write_samples(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / done.host / "stray").write_text("left from before")
    with pytest.raises(OutputError, match=rf"add --force to replace the samples there "
                                          rf"\({done.host}, {README}; nothing else"):  # fmt: skip
        write_samples(tmp_path)
    write_samples(tmp_path, force=True)
    assert not (tmp_path / done.host / "stray").exists()
    assert (tmp_path / "notes.txt").read_text() == "mine"  # nothing else touched
    assert shipped_part(tmp_path / done.host) == tree(PACKAGE_DIR / DATA / done.host)


def test_a_file_in_the_way_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(OutputError, match="is not a folder"):
        write_samples(tmp_path / "f")


def copy_as(package: str, where: Path) -> Path:
    """The samples package's files (no module but an empty __init__) as PACKAGE under WHERE."""
    dest = where / package
    shutil.copytree(PACKAGE_DIR, dest, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    (dest / "__init__.py").write_text("")
    return dest


@pytest.mark.parametrize("how", ["folder", "zip"])
def test_the_samples_are_read_as_package_data_not_beside_the_module(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """importlib.resources finds them wherever the package is: another folder on sys.path (as
    `pip install --target` makes), or a zip (where no file path exists at all)."""
    package = f"copied_samples_{how}"
    copied = copy_as(package, tmp_path / "site")
    root = tmp_path / "site"
    if how == "zip":
        root = tmp_path / "site.zip"
        with zipfile.ZipFile(root, "w") as z:
            for path in copied.rglob("*"):
                z.write(path, path.relative_to(tmp_path / "site"))
        shutil.rmtree(tmp_path / "site")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, package, raising=False)
    try:
        done = write_samples(tmp_path / "out", package=package)
    finally:
        sys.modules.pop(package, None)
    assert tree(tmp_path / "out" / done.host) == tree(written_once(tmp_path / "again"))
    assert done.samples == SHIPPED.samples


def test_the_command_writes_them_and_every_next_command_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a new user runs it: a relative folder, then each command it suggests, as printed."""
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    result = runner.invoke(cli, ["samples", "my samples"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"wrote {len(SHIPPED.samples) - 1} snapshots and 1 incident (")
    commands = [line.strip() for line in result.output.split("next, try:")[1].splitlines()
                if line.strip().startswith("vllm-sidecar ")]  # fmt: skip
    assert commands == [c for c, _ in next_commands(SHIPPED, "my samples")]
    outputs = {}
    for command in commands:
        args = shlex.split(command)[1:]
        run = runner.invoke(cli, args)
        assert run.exit_code == 0, f"{command}\n{run.output}\n{run.exception!r}"
        outputs[" ".join(args[:2])] = run.output
    assert "[Profile] Findings:" in outputs["report my samples"]
    assert (tmp_path / "my samples" / "report.html").is_file()
    assert (tmp_path / "my samples" / "flame.svg").is_file()  # -o is a prefix


def test_format_json_prints_the_samples_and_the_next_commands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["samples", "--format", "json", str(tmp_path / "s")]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert err == ""
    assert [s["path"] for s in doc["samples"]] == IDS
    assert doc["host"] == SHIPPED.host
    assert doc["files"] == len(tree(tmp_path / "s" / SHIPPED.host))
    assert doc["next"][0]["command"] == f"vllm-sidecar report {tmp_path / 's'}"


def test_the_refusal_is_an_output_error_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["samples", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["samples", str(tmp_path)]) == OutputError.exit_code
    assert "add --force" in capsys.readouterr().err
    assert main(["samples", "--force", str(tmp_path)]) == 0


def test_next_commands_quote_a_folder_with_spaces() -> None:
    commands = [c for c, _ in next_commands(SHIPPED, "my samples")]
    assert commands[0] == "vllm-sidecar report 'my samples'"
    assert all(shlex.split(c)[0] == "vllm-sidecar" for c in commands)


def test_flamegraph_of_an_output_folder_draws_its_latest_snapshot(
    written: Path, tmp_path: Path
) -> None:
    runner = CliRunner()
    whole = runner.invoke(cli, ["flamegraph", str(written), "-o", str(tmp_path / "whole")])
    assert whole.exit_code == 0, whole.output
    latest = runner.invoke(cli, ["report", "--format", "json", str(written)])
    name = json.loads(latest.output)["snapshot"]
    (chosen,) = [f.path for f in OutputTree(written).snapshots() if f.path.name == name]
    one = runner.invoke(cli, ["flamegraph", str(chosen), "-o", str(tmp_path / "one")])
    assert one.exit_code == 0, one.output
    assert (tmp_path / "whole.svg").read_text() == (tmp_path / "one.svg").read_text()
