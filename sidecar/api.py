"""The Python interface, for notebooks and scripts:

    from sidecar import Profiler, load, snapshots

    snap = Profiler(pid=4100).snapshot(30)        # one window, the CLI's `snapshot`
    snap.computation_breakdown()                  # phase shares per role (pandas)
    snap.memory_breakdown()                       # host, GPUs, processes, KV cache (pandas)
    print(snap.report())                          # the text `vllm-sidecar report` prints
    snap.save("profiles/")                        # a snapshot folder, as the CLI writes
    load("profiles/20261201T120000Z")             # any snapshot folder, schema 1 to 5
    snapshots("/var/lib/vllm-sidecar", since="7d")  # a daemon's store, one row per snapshot

Each call goes through the code the CLI runs (`commands.take_snapshot`: one `profile_window`;
`summary_io.read_summary`; `report.render`; the trend table of `trend_source.load_table`), so
the two cannot drift apart. Options are the CLI's settings, validated at construction into the
same frozen `Config` (a bad one is a `ConfigError` naming the argument and what fits).

Kept light: this module imports nothing heavy at import time; the sampler's stack loads on the
first `snapshot()`, pydantic on the first summary read, pandas when a DataFrame is asked for.
"""

from __future__ import annotations

import html
import logging
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar.errors import ConfigError, InputError, OutputError

if TYPE_CHECKING:
    from sidecar.advice.findings import Finding
    from sidecar.config.settings import Config
    from sidecar.dataframes import DataFrame
    from sidecar.records.summary import SnapshotSummary

log = logging.getLogger("vllm_sidecar")

PathLike = str | os.PathLike[str]
When = str | datetime | None

# Profiler's arguments -> the settings they set (sidecar/config/load.py), the CLI's flags' keys.
ARGUMENTS = {
    "pid": "target.pid", "pid_file": "target.pid_file", "discover": "target.discover",
    "proc_root": "target.proc_root", "host_proc": "target.host_proc",
    "any_python": "target.any_python", "rate": "sampling.rate_hz",
    "cpu_budget": "sampling.cpu_budget", "py_spy": "sampling.py_spy",
    "segment": "sampling.segment_s", "metrics_url": "metrics.url", "gpu": "gpu",
    "rules": "rules",
}  # fmt: skip
_ARGUMENT_OF = {key: arg for arg, key in ARGUMENTS.items()}


class Profiler:
    """A vLLM server to take snapshots of. Name it by `pid` (any of its processes), `pid_file`,
    or `discover=True`; the other arguments are the CLI's flags of the same names (`rate=20`
    or `"20"` Hz, `segment="5s"`, `cpu_budget="2%"`, `metrics_url=...`, `gpu=False`,
    `rules="my-phases.yaml"`), and `config` a YAML file as `--config` takes. Snapshots go to
    `out` (one folder each, as `snapshot --out` writes them) or, without it, to a temporary
    folder that lives as long as the `Snapshot` does: `Snapshot.save` keeps one."""

    def __init__(
        self,
        pid: int | None = None,
        *,
        discover: bool | None = None,
        pid_file: PathLike | None = None,
        rate: float | str | None = None,
        segment: float | str | None = None,
        cpu_budget: float | str | None = None,
        metrics_url: str | None = None,
        gpu: bool | None = None,
        rules: PathLike | None = None,
        proc_root: PathLike | None = None,
        host_proc: PathLike | None = None,
        any_python: bool | None = None,
        py_spy: PathLike | None = None,
        config: PathLike | None = None,
        out: PathLike | None = None,
    ) -> None:
        given = {"pid": pid, "discover": discover, "pid_file": pid_file, "rate": rate,
                 "segment": segment, "cpu_budget": cpu_budget, "metrics_url": metrics_url,
                 "gpu": gpu, "rules": rules, "proc_root": proc_root, "host_proc": host_proc,
                 "any_python": any_python, "py_spy": py_spy}  # fmt: skip
        self.config: Config = _config(given, config)
        self.out = Path(out) if out is not None else None

    def snapshot(
        self, seconds: float | str = 10.0, progress: Callable[[str], None] | None = None
    ) -> Snapshot:
        """Sample the server for `seconds` (30, "30s", "2m") and write the snapshot; `progress`
        hears the line the CLI prints when py-spy has attached and the window begins."""
        from sidecar.commands import take_snapshot
        from sidecar.config.settings import SnapshotOptions

        duration = _seconds(seconds)
        temporary = self.out is None
        out = Path(tempfile.mkdtemp(prefix="vllm-sidecar-")) if self.out is None else self.out
        try:
            folder, summary = take_snapshot(self.config, SnapshotOptions(out, duration), progress)
        except BaseException:
            if temporary:
                shutil.rmtree(out, ignore_errors=True)
            raise
        return Snapshot(folder, summary, temporary=out if temporary else None)

    def __repr__(self) -> str:
        t = self.config.target
        target = (f"pid={t.pid}" if t.pid is not None else f"pid_file={str(t.pid_file)!r}"
                  if t.pid_file is not None else "discover=True")  # fmt: skip
        return f"Profiler({target}, rate={self.config.sampling.rate_hz:g})"


class Snapshot:
    """One snapshot: its folder, its typed summary, and views of it."""

    def __init__(self, path: Path, summary: SnapshotSummary, temporary: Path | None = None) -> None:
        self.path = path
        self.summary = summary
        if temporary is not None:  # removed with the object (or at exit); `save` keeps a copy
            self._cleanup = weakref.finalize(self, shutil.rmtree, temporary, True)

    @property
    def name(self) -> str:
        return self.summary.name

    def report(self) -> str:
        """The text `vllm-sidecar report` prints for this snapshot."""
        from sidecar.report.text import render_report

        return render_report(self.summary)

    def findings(self, advice: PathLike | None = None) -> tuple[Finding, ...]:
        """What the report's `[Profile] Findings:` says, as records (most severe first):
        the packaged configs/advice.yaml, or ADVICE, your own rules file."""
        from sidecar.advice.findings import findings
        from sidecar.advice.rules import load_advice

        return findings(self.summary, load_advice(Path(advice)) if advice is not None else None)

    def memory_breakdown(self) -> DataFrame:
        """One row per (item, device): `item` is device (the host, each of the target's
        GPUs), process (its RSS on `host`, its memory on each GPU) or kv_cache; `used_bytes`,
        `total_bytes`, `share_of_total` (0-1). Missing readings are <NA>."""
        from sidecar.analyze.breakdown import MEMORY_COLUMNS, memory_rows
        from sidecar.dataframes import frame

        return frame(memory_rows(self.summary), MEMORY_COLUMNS)

    def computation_breakdown(self) -> DataFrame:
        """One row per (scope, role, phase): `share_of_role` (0-1) of the role's samples over
        all its threads (`scope` all_threads, the report's table) or its processes' main
        threads (main_thread); `samples` behind an all-threads share."""
        from sidecar.analyze.breakdown import COMPUTATION_COLUMNS, computation_rows
        from sidecar.dataframes import frame

        return frame(computation_rows(self.summary), COMPUTATION_COLUMNS)

    def stacks(self) -> DataFrame:
        """stacks.parquet: one row per distinct stack (role, thread, phase, stage, weight in
        samples, the deciding frame and rule, the stack), as the README's table says."""
        from sidecar.dataframes import read_stacks

        return read_stacks(self.path / "stacks.parquet")

    def save(self, out: PathLike, name: str | None = None) -> Path:
        """Copy the snapshot folder into the folder `out` (made if missing), as
        `out/<name>` (default: the snapshot's own name), as `snapshot --out` lays snapshots
        out; the copy appears whole or not at all. Returns the folder written."""
        dest = Path(out) / (name or self.path.name)
        if name is not None and (not name or Path(name).name != name or name.startswith(".")):
            raise ConfigError(f"save(name={name!r}): give a plain folder name, no / or leading .")
        if dest.exists():
            raise OutputError(f"{dest} exists: save to another folder or under another name")
        from sidecar.store.atomic import write_folder

        try:
            write_folder(dest, lambda tmp: shutil.copytree(self.path, tmp, dirs_exist_ok=True),
                         durable=False)  # fmt: skip
        except OSError as exc:
            raise OutputError(f"cannot save the snapshot to {dest}: {exc}: give a writable "
                              "path with free space") from exc  # fmt: skip
        return dest

    def _repr_html_(self) -> str:
        """A notebook's view (Jupyter shows it for a cell's last value): the text report's
        `[Profile]` block and each role's phase shares as bars. Every name is HTML-escaped:
        frames, roles and phases come from the target and the rules and can hold anything."""
        from sidecar.report.text import profile_block

        s = self.summary
        title = f"Snapshot {s.name} ({s.created_at}, {s.samples:,} samples)"
        return (
            f'<div class="vllm-sidecar-snapshot"><h4>{_e(title)}</h4>'
            f'<pre style="white-space:pre-wrap">{_e(profile_block(s))}</pre>'
            f"<h4>Phase shares per role</h4>{_phase_bars(s)}</div>"
        )

    def __repr__(self) -> str:
        s = self.summary
        return (f"Snapshot({s.name!r}, created_at={s.created_at!r}, samples={s.samples}, "
                f"path={str(self.path)!r})")  # fmt: skip


def load(path: PathLike) -> Snapshot:
    """A snapshot folder on disk (or its summary.json), written by any version of the sidecar
    (schema 1 to 5); an InputError names what is wrong with it."""
    from sidecar.store.summary_io import SUMMARY_NAME, read_summary

    where = Path(path)
    if not where.exists():
        raise InputError(f"{where} does not exist: give a snapshot folder (OUT/<host>/<time>/ "
                         "of `run`, or OUT/<time>/ of `snapshot`)")  # fmt: skip
    folder = where.parent if where.is_file() and where.name == SUMMARY_NAME else where
    return Snapshot(folder, read_summary(where))


def snapshots(
    out: PathLike,
    since: When = None,
    until: When = None,
    *,
    host: str | None = None,
    kind: str = "all",
) -> DataFrame:
    """A daemon's output folder (or one host folder in it) as a DataFrame, one row per
    snapshot in [since, until): the per-snapshot table `trend` reads (time, kind, deployment,
    `share.<role>.<phase>`, `main.<role>.<phase>`, the serving figures, KV bytes, GPU
    utilisation, the fingerprint), repaired from the summaries when it is out of step with
    the folders, as `trend` does, plus each folder's `path` for `load`. `since` and `until`:
    a duration back from now ("7d", "12h"), a UTC time ("2026-11-20T06:00"), a datetime, or
    None for no bound. `host` picks one of several hosts; `kind`: all, snapshot or baseline."""
    from sidecar.dataframes import store_frame
    from sidecar.trend.source import host_folder, load_table

    if kind not in ("all", "snapshot", "baseline"):
        raise ConfigError(f"kind={kind!r}: give 'all', 'snapshot' or 'baseline'")
    now = time.time()
    start, end = _when(since, "since", now), _when(until, "until", now)
    folder = host_folder(Path(out), host)
    table = load_table(folder, note=_note)
    return store_frame(table, start, end, kind, folder)


# ---------------------------------------------------------------------------------- helpers


def _config(given: dict[str, Any], path: PathLike | None) -> Config:
    """The arguments given (not None) on top of `config` and the environment, as `snapshot`
    builds its config from its flags."""
    from sidecar.config.load import load_config
    from sidecar.config.settings import SNAPSHOT_DEFAULTS
    from sidecar.doctor import check_rule_files

    if given["pid"] is not None and given["discover"]:
        raise ConfigError("give Profiler(pid=PID) or Profiler(discover=True), not both")
    flags = {ARGUMENTS[arg]: value for arg, value in given.items() if value is not None}
    if "target.pid" in flags or "target.pid_file" in flags:
        flags.setdefault("target.discover", False)  # a named target over the file's discovery
    config = load_config(Path(path) if path is not None else None, flags=flags,
                         defaults=SNAPSHOT_DEFAULTS, origin=_origin)  # fmt: skip
    check_rule_files(config)
    t = config.target
    if t.pid is None and t.pid_file is None and not t.discover:
        raise ConfigError(
            "name the vLLM server: Profiler(pid=PID), Profiler(pid_file=FILE) or "
            "Profiler(discover=True) (or target.pid, target.pid_file or target.discover in "
            "the config file)"
        )
    return config


def _origin(key: str) -> str:
    return f"argument Profiler({_ARGUMENT_OF.get(key, key)}=...)"


def _seconds(value: float | str) -> float:
    from sidecar.config import units

    try:
        seconds = float(units.SECONDS.parse(value))
    except units.Unfit as exc:
        raise ConfigError(f"snapshot({value!r}): the window {exc}; {units.SECONDS.hint}") from None
    if seconds <= 0:
        raise ConfigError(f"snapshot({value!r}): the window must be longer than 0 s")
    return seconds


def _when(value: When, name: str, now: float) -> datetime | None:
    from sidecar.config import units

    if value is None:
        return None
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if not isinstance(value, str):
        raise ConfigError(f"{name}={value!r}: give a duration back (7d), a UTC time "
                          "(2026-11-20T06:00), a datetime or None")  # fmt: skip
    try:
        return datetime.fromtimestamp(units.moment(value, now), tz=UTC)
    except units.Unfit as exc:
        raise ConfigError(f"{name}={value!r} {exc}") from None


BAR_WIDTH = 240  # pixels of a 100 % phase bar in the notebook view


def _phase_bars(s: SnapshotSummary) -> str:
    """One table per role (the report's role order, then any other), a row per phase with a
    non-zero share, largest first: its colour (the flame graph's), name, bar and share."""
    from sidecar.flame.svg import PHASE_COLOURS, UNKNOWN_PHASE_COLOUR
    from sidecar.tables import ROLE_COLUMNS, share_text

    if not s.by_role:
        return "<p>No stack samples in this snapshot.</p>"
    colours = {str(phase): colour for phase, colour in PHASE_COLOURS.items()}
    roles = [r for r in ROLE_COLUMNS if r in s.by_role]
    roles += sorted(r for r in s.by_role if r not in ROLE_COLUMNS)
    blocks = []
    for role in roles:
        rows = []
        for phase, share in sorted(s.by_role[role].items(), key=lambda pv: (-pv[1], pv[0])):
            if not share > 0:
                continue
            colour = colours.get(phase, UNKNOWN_PHASE_COLOUR)
            width = max(1, round(BAR_WIDTH * min(share, 1.0)))
            rows.append(
                f'<tr data-phase="{_e(phase)}"><td style="text-align:left">{_e(phase)}</td>'
                f'<td style="text-align:left"><span style="display:inline-block;width:{width}px;'
                f'height:0.9em;background:{colour};border:1px solid #999"></span></td>'
                f'<td style="text-align:right">{_e(share_text(share))}</td></tr>'
            )
        samples = s.role_samples.get(role)
        count = f" ({samples:,} samples)" if samples is not None else ""
        blocks.append(
            f'<table data-role="{_e(role)}"><caption style="text-align:left"><b>{_e(role)}</b>'
            f"{_e(count)}</caption>{''.join(rows)}</table>"
        )
    return "".join(blocks)


def _e(value: object) -> str:
    """`value` as HTML text or attribute value: control characters shown as escapes, then
    `& < > " '` escaped."""
    from sidecar.tables import printable

    return html.escape(printable(str(value)), quote=True)


def _note(line: str) -> None:
    """`load_table`'s notes: its warnings as warnings, the rest (a table rebuilt) as info."""
    if line.startswith("warning: "):
        log.warning("%s", line.removeprefix("warning: "))
    else:
        log.info("%s", line)
