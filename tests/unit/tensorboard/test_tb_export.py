"""`vllm-sidecar export tensorboard` on recorded snapshot folders (schema 1, 2 and 3, two
deployments), read back with TensorBoard's own reader (EventAccumulator), as TensorBoard reads
a logdir: one step per snapshot at its wall time, the values the summaries hold, no step twice
after a re-export."""

from __future__ import annotations

import shutil
from datetime import datetime
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from sidecar.cli import main
from sidecar.errors import InputError
from sidecar.records.summary import SnapshotSummary
from sidecar.store.summary_io import read_summary
from sidecar.tensorboard.scalars import export_tensorboard, scalars

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
RECORDED = (
    sorted((FIXTURES / "diff").glob("*/2026*"))
    + sorted((FIXTURES / "schema1").glob("2026*"))
    + sorted((FIXTURES / "trend").glob("schema*/2026*"))
)


def store(tmp_path: Path) -> Path:
    """A daemon's output folder: host `vm` with every recorded snapshot folder."""
    host = tmp_path / "out" / "vm"
    host.mkdir(parents=True)
    for folder in RECORDED:
        shutil.copytree(folder, host / folder.name)
    return tmp_path / "out"


def events(run: Path) -> EventAccumulator:
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})  # 0: keep every event
    acc.Reload()
    return acc


def by_run() -> dict[str, list[SnapshotSummary]]:
    runs: dict[str, list[SnapshotSummary]] = {}
    for folder in RECORDED:
        s = read_summary(folder)
        runs.setdefault(s.deployment or "unknown-deployment", []).append(s)
    return {k: sorted(v, key=lambda s: s.created_at) for k, v in runs.items()}


def test_one_step_per_snapshot_at_its_wall_time_with_its_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, logdir = store(tmp_path), tmp_path / "tb"
    assert main(["export", "tensorboard", str(out), "--logdir", str(logdir)]) == 0
    printed = capsys.readouterr()
    expected = by_run()
    assert sorted(p.name for p in (logdir / "vm").iterdir()) == sorted(expected)
    assert "exported 19 snapshots into 3 runs" in printed.err
    for deployment, summaries in expected.items():
        assert f"vm/{deployment}: {len(summaries)} steps" in printed.out
        acc = events(logdir / "vm" / deployment)
        tags = set(acc.Tags()["scalars"])
        for step, s in enumerate(summaries):
            wall = datetime.fromisoformat(s.created_at).timestamp()
            for tag, value in scalars(s).items():
                assert tag in tags
                (event,) = [e for e in acc.Scalars(tag) if e.step == step]
                assert event.wall_time == wall
                assert event.value == pytest.approx(value, rel=1e-6)  # float32 in the file
        # the figures named in the brief, for a schema-3 window of load
        if deployment == "tiny@59399":
            s = summaries[0]
            worker = acc.Scalars("share/worker/forward")
            sampled = [x for x in summaries if "worker" in x.by_role]  # one window saw none
            assert len(worker) == len(sampled) < len(summaries)  # 0 where it ran no forward
            assert worker[0].value == pytest.approx(s.by_role["worker"]["forward"])
            ttft = s.serving.ttft_p95_s
            assert acc.Scalars("serving/ttft_p95_s")[0].value == pytest.approx(ttft)
            assert s.kv_cache is not None and s.kv_cache.bytes is not None
            kv = acc.Scalars("memory/kv_cache_gib")[0].value
            assert kv == pytest.approx(s.kv_cache.bytes / 2**30)
            assert "memory/rss_gib/worker" in tags and "memory/host_used_gib" in tags
            assert "main/engine_core/model_wait" in tags and "cpu/worker_cores" in tags


def test_findings_are_counted_in_all_and_per_severity() -> None:
    from sidecar.advice.findings import findings

    for folder in RECORDED:
        s = read_summary(folder)
        tags, found = scalars(s), findings(s)
        assert tags["findings/count"] == len(found)
        assert sum(tags[f"findings/{sev}"] for sev in ("info", "warning", "critical")) == len(found)


def test_re_export_rewrites_and_adds_without_duplicating(tmp_path: Path) -> None:
    out, logdir = store(tmp_path), tmp_path / "tb"
    later = sorted((out / "vm").iterdir())[-1]  # the latest window: tiny@42393 (max-num-seqs 1)
    moved = tmp_path / later.name
    later.rename(moved)
    export_tensorboard(out, logdir)
    run = logdir / "vm" / "tiny@42393"
    before = len(events(run).Scalars("sampling/samples"))
    export_tensorboard(out, logdir)  # the same OUT again
    again = events(run)
    assert len(again.Scalars("sampling/samples")) == before
    assert len(list(run.iterdir())) == 1  # one event file: the run was rewritten
    moved.rename(later)  # a new window since: one step more, steps 0..n-1 once each
    export_tensorboard(out, logdir)
    steps = [e.step for e in events(run).Scalars("sampling/samples")]
    assert steps == list(range(before + 1))
    assert not [p for p in (logdir / "vm").iterdir() if p.name.startswith(".")]


def test_hosts_unreadable_summaries_and_bad_paths(tmp_path: Path) -> None:
    out, logdir = store(tmp_path), tmp_path / "tb"
    shutil.copytree(out / "vm", out / "vm2")
    broken = out / "vm2" / RECORDED[0].name / "summary.json"
    broken.write_text("{")
    notes: list[str] = []
    runs = export_tensorboard(out, logdir, note=notes.append)
    assert any(f"skipped {broken.parent}" in n for n in notes)
    steps = {(r.path.parent.name, r.path.name): r.steps for r in runs}  # a run per host folder
    assert sum(n for (h, _), n in steps.items() if h == "vm") == len(RECORDED)
    assert sum(n for (h, _), n in steps.items() if h == "vm2") == len(RECORDED) - 1
    only = export_tensorboard(out, tmp_path / "tb2", host="vm")
    assert sum(r.steps for r in only) == len(RECORDED)
    with pytest.raises(InputError, match="is not a folder"):
        export_tensorboard(tmp_path / "missing", logdir)
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="is a file: give a folder"):
        export_tensorboard(out, tmp_path / "file")


def test_the_cli_turns_bad_inputs_into_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", "tensorboard", str(tmp_path / "missing"), "--logdir", "tb"]) == 3
    assert "is not a folder: point at the daemon's output.dir" in capsys.readouterr().err
    assert main(["export", "tensorboard", str(tmp_path)]) == 2  # --logdir is required
    assert "--logdir" in capsys.readouterr().err


def test_custom_metrics_are_tags_of_their_own() -> None:
    """Schema 4's `custom` section: a measured series is `custom/<name>`; one that was not
    measured (its URL refused) writes no point rather than a 0."""
    from dataclasses import replace

    from sidecar.records.readings import CustomMetric

    s = replace(read_summary(RECORDED[0]), custom=(
        CustomMetric("tokens_out", "rate", 551.3, unit="/s", metric="vllm:generation_tokens"),
        CustomMetric("router_queue", "mean", None, reason="connection refused"),
    ))  # fmt: skip
    tags = scalars(s)
    assert tags["custom/tokens_out"] == 551.3
    assert "custom/router_queue" not in tags
