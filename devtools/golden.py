"""Golden outputs of the CLI: record what `report`, `diff`, `trend`, `aggregate`, `classify`
(plain and `--explain`), `rules suggest` and `flamegraph` print and write for the recorded
fixtures of one checkout, so that a restructure of the package can be shown to change none of
them (byte for byte, paths aside).

Record a checkout, then compare two recordings:

    .venv/bin/python devtools/golden.py --checkout /tmp/wt-before --out /tmp/golden-before
    .venv/bin/python devtools/golden.py --checkout . --out /tmp/golden-after
    .venv/bin/python devtools/golden.py --compare /tmp/golden-before /tmp/golden-after

Each case runs `[sys.executable, "-m", "sidecar.cli", ...]` as a child process with
`PYTHONPATH=<checkout>` and the checkout as its working folder, so the checkout's own `sidecar`
package runs (checked before the first case), under a pinned environment: `TZ=UTC`,
`LC_ALL=C.UTF-8`, `PYTHONHASHSEED=0`, `COLUMNS=100`, `MPLBACKEND=Agg`, no `VLLM_SIDECAR_*`
variables, and `PYTHONDONTWRITEBYTECODE=1` so that nothing is written into the checkout.
Fixtures are named relative to the checkout (`tests/fixtures/...`). A case that writes files, or
that reads an output folder (`trend`, `aggregate` and `report --format html` save the trend
table into it), runs on copies in a case folder of its own under a temporary folder; what it
writes is copied into OUT.

What OUT holds, per case NAME: `NAME.txt` or `NAME.json` (stdout), `NAME.<file>` for each file
the case wrote (flame graphs, speedscope profiles, HTML pages, the trend plot), and one
`cases.json` with every case's arguments, exit code, stderr and file names.

Normalised, so that two checkouts at different paths, recorded at different times, give
identical files:

- paths: the checkout's by `<CHECKOUT>`, the temporary folder's by `<TMP>` (a case folder is
  `<TMP>/NAME`), the Python prefix's by `<PREFIX>`;
- wall time, the only "now"-dependent figures in these outputs: the duration in the trend
  table's note on stderr (`rebuilt the table from N summaries in <SECONDS> s`, `brought the
  table up to date: ..., in <SECONDS> s`) and `aggregate --format json`'s `"took_s"`;
- Matplotlib's one-off `Matplotlib is building the font cache` line on stderr.

Every time range is given explicitly (`--since`/`--until`, `PATH@SINCE..UNTIL` or `PATH@..`), so
no output depends on the date it is recorded. Not normalised: the `vllm-sidecar` version from
the installed package's metadata (the flame graph's speedscope `exporter`, the HTML page's
generator), which comes from the venv, not from the checkout.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FIX = "tests/fixtures"  # relative to the checkout, the children's working folder
CASES_FILE = "cases.json"
FORMAT = 1
TIMEOUT_S = 600

Setup = Callable[[Path, Path], None]  # (checkout, case folder): lay out the case's inputs


@dataclass(frozen=True)
class Case:
    """One CLI run. `{work}` in the arguments is the case's own folder (absolute); files the
    run writes under `{work}/o/` are kept."""

    name: str
    args: tuple[str, ...]
    ext: str = "txt"  # stdout's file: NAME.txt or NAME.json
    setup: Setup | None = None
    prep: tuple[tuple[str, ...], ...] = ()  # CLI runs before the case (kept: exit codes only)


# ---------------------------------------------------------------------------------- fixtures

SCHEMA1 = f"{FIX}/schema1/20261201T112537Z"
SCHEMA2 = f"{FIX}/trend/schema2/20261201T133909Z"
SCHEMA3 = f"{FIX}/trend/schema3/20261201T140758Z"
SCHEMA4 = f"{FIX}/schema4/20261201T210833Z"
STEADY_DIR = f"{FIX}/diff/steady-mixed"
PREFILL_DIR = f"{FIX}/diff/prefill-heavy"
SEQS1_DIR = f"{FIX}/diff/max-num-seqs-1"
STEADY = (
    "20261201T144454Z",
    "20261201T144549Z",
    "20261201T144649Z",
    "20261201T144742Z",
    "20261201T144853Z",
    "20261201T144935Z",
    "20261201T144955Z",
    "20261201T145042Z",
    "20261201T145128Z",
    "20261201T145212Z",
)
PREFILL = ("20261201T145307Z", "20261201T145342Z", "20261201T145418Z")
SEQS1 = ("20261201T145549Z", "20261201T145702Z", "20261201T145757Z")
FLAME_PREFILL = f"{FIX}/flame/prefill-heavy"  # snapshot 20261201T141054Z
FLAME_DECODE = f"{FIX}/flame/decode-heavy"  # snapshot 20261201T141110Z
RECORDED = f"{FIX}/recorded/v0.32.0-cpu"
FRAGMENTS = f"{FIX}/fragments"
OTHER_PORT = "tiny@8001"  # tests/fleet_layout.py: the prefill windows as a deployment of their own


def _copy(checkout: Path, src: str, dst: Path, deployment: str | None = None) -> None:
    """A fixture folder copied to DST; with DEPLOYMENT, its summary's deployment rewritten (the
    same server's windows presented as another deployment, as tests/fleet_layout.py does)."""
    shutil.copytree(checkout / src, dst)
    if deployment is not None:
        doc = json.loads((dst / "summary.json").read_text())
        doc["deployment"] = deployment
        (dst / "summary.json").write_text(json.dumps(doc))


def _recorded_host(checkout: Path, work: Path) -> None:
    """`work/out/vm`: every window under tests/fixtures/diff, under its own name."""
    host = work / "out" / "vm"
    for folder, names in ((STEADY_DIR, STEADY), (PREFILL_DIR, PREFILL), (SEQS1_DIR, SEQS1)):
        for name in names:
            _copy(checkout, f"{folder}/{name}", host / name)


def _baseline_host(checkout: Path, work: Path) -> None:
    """`work/out/vm`: the steady windows (the 1st and 6th as hourly baselines), then the
    max-num-seqs-1 ones: the latest baseline is steady, the latest snapshot is not."""
    host = work / "out" / "vm"
    for i, name in enumerate(STEADY):
        suffix = "-baseline" if i in (0, 5) else ""
        _copy(checkout, f"{STEADY_DIR}/{name}", host / (name + suffix))
    for name in SEQS1:
        _copy(checkout, f"{SEQS1_DIR}/{name}", host / name)


def _schemas_host(checkout: Path, work: Path) -> None:
    """`work/out/vm`: one real snapshot of each schema (1 to 4) and the two flame windows."""
    host = work / "out" / "vm"
    for src in (SCHEMA1, SCHEMA2, SCHEMA3, SCHEMA4):
        _copy(checkout, src, host / Path(src).name)
    _copy(checkout, FLAME_PREFILL, host / "20261201T141054Z")
    _copy(checkout, FLAME_DECODE, host / "20261201T141110Z")


def _synthetic_host(checkout: Path, work: Path) -> None:
    """`work/out/vm` as tests/unit/trend/test_trend_cli.py lays it out: the schema-1 summary (no
    fingerprint), then the schema-3 one with vLLM 0.31.0, then 0.32.0, 20 each, every 30 minutes
    from 2026-05-28T20:26:40Z, every 4th folder a baseline."""
    schema1 = json.loads((checkout / SCHEMA1 / "summary.json").read_text())
    schema3 = json.loads((checkout / SCHEMA3 / "summary.json").read_text())
    stretches: list[tuple[dict[str, Any], str | None]] = [
        (schema1, None),
        (schema3, "0.31.0"),
        (schema3, "0.32.0"),
    ]
    host = work / "out" / "vm"
    i = 0
    for doc, vllm in stretches:
        for _ in range(20):
            when = datetime.fromtimestamp(1_780_000_000.0 + 1800.0 * i, tz=UTC)
            kind = "baseline" if i % 4 == 0 else "snapshot"
            name = when.strftime("%Y%m%dT%H%M%SZ")
            folder = host / (name + ("-baseline" if kind == "baseline" else ""))
            folder.mkdir(parents=True)
            summary = dict(doc, name=name, created_at=when.isoformat(timespec="seconds"), kind=kind)
            if vllm is not None:
                summary["fingerprint"] = {
                    "vllm": vllm,
                    "model": "tiny",
                    "serving": {"max_num_seqs": "256"},
                    "notes": {},
                }
            (folder / "summary.json").write_text(json.dumps(summary))
            i += 1


def _two_hosts(prefill: bool = True, seqs1: bool = False, flame: bool = False) -> Setup:
    """tests/fleet_layout.py's two_hosts: `work/out-a/host-a` holds the even steady windows,
    `work/out-b/host-b` the odd ones and, as a deployment of their own, the prefill-heavy ones;
    SEQS1: the max-num-seqs-1 windows in host-a as `tiny@9001`; FLAME: the decode-heavy flame
    window (with stacks) in host-a."""

    def setup(checkout: Path, work: Path) -> None:
        a, b = work / "out-a" / "host-a", work / "out-b" / "host-b"
        for i, name in enumerate(STEADY):
            _copy(checkout, f"{STEADY_DIR}/{name}", (a if i % 2 == 0 else b) / name)
        if prefill:
            for name in PREFILL:
                _copy(checkout, f"{PREFILL_DIR}/{name}", b / name, OTHER_PORT)
        if seqs1:
            for name in SEQS1:
                _copy(checkout, f"{SEQS1_DIR}/{name}", a / name, "tiny@9001")
        if flame:
            _copy(checkout, FLAME_DECODE, a / "20261201T141110Z")

    return setup


def _snapshot_copy(src: str, name: str) -> Setup:
    def setup(checkout: Path, work: Path) -> None:
        _copy(checkout, src, work / name)

    return setup


def _empty(checkout: Path, work: Path) -> None:
    (work / "empty").mkdir()


# ---------------------------------------------------------------------------------- cases


def _both(
    name: str, *args: str, setup: Setup | None = None, prep: tuple[tuple[str, ...], ...] = ()
) -> list[Case]:
    """The case as text and as JSON (`--format json`)."""
    return [
        Case(f"{name}-text", args, "txt", setup, prep),
        Case(f"{name}-json", (*args, "--format", "json"), "json", setup, prep),
    ]


def cases() -> list[Case]:
    out: list[Case] = []

    # report: one snapshot of each schema and of each recorded workload
    for key, folder in (
        ("schema1", SCHEMA1),
        ("schema2", SCHEMA2),
        ("schema3", SCHEMA3),
        ("schema4", SCHEMA4),
        ("steady", f"{STEADY_DIR}/{STEADY[0]}"),
        ("prefill", f"{PREFILL_DIR}/{PREFILL[0]}"),
        ("seqs1", f"{SEQS1_DIR}/{SEQS1[0]}"),
        ("flame-decode", FLAME_DECODE),
    ):
        out += _both(f"report-{key}", "report", folder)
    out += [
        Case(
            "report-flame-prefill-html",
            ("report", "{work}/prefill-heavy", "--format", "html", "--out", "{work}/o/page.html"),
            setup=_snapshot_copy(FLAME_PREFILL, "prefill-heavy"),
        ),
        Case(
            "report-out-html",
            ("report", "{work}/out", "--format", "html", "--out", "{work}/o/page.html"),
            setup=_baseline_host,
        ),
        Case("report-no-summary", ("report", "{work}/empty"), setup=_empty),
    ]

    # diff: single windows, time ranges of recorded folders, the gate, --baseline
    first, last = f"{STEADY_DIR}/{STEADY[0]}", f"{STEADY_DIR}/{STEADY[-1]}"
    out += _both("diff-steady-pair", "diff", first, f"{STEADY_DIR}/{STEADY[1]}")
    out += _both("diff-steady-vs-prefill", "diff", last, f"{PREFILL_DIR}/{PREFILL[0]}")
    out += _both(
        "diff-steady-vs-seqs1-gate", "diff", last, f"{SEQS1_DIR}/{SEQS1[0]}", "--fail-on", "10%"
    )
    out += _both("diff-ranges-steady-vs-prefill", "diff", f"{STEADY_DIR}@..", f"{PREFILL_DIR}@..")
    out += _both(
        "diff-ranges-steady-vs-seqs1-gate",
        "diff",
        f"{STEADY_DIR}@..",
        f"{SEQS1_DIR}@..",
        "--fail-on",
        "10%",
    )
    mid = "2026-12-01T14:49:35"  # the 6th steady window: five windows a side
    out += _both(
        "diff-steady-halves-gate",
        "diff",
        f"{STEADY_DIR}@..{mid}",
        f"{STEADY_DIR}@{mid}..",
        "--fail-on",
        "10%",
    )
    out += _both(
        "diff-since-until",
        "diff",
        STEADY_DIR,
        SEQS1_DIR,
        "--since",
        "2026-12-01T14:45",
        "--until",
        "2026-12-01T15:00",
    )
    out += _both("diff-schema1-self", "diff", SCHEMA1, SCHEMA1)
    out += _both("diff-baseline", "diff", "--baseline", "{work}/out/vm", setup=_baseline_host)
    out += [Case("diff-one-side", ("diff", "only-one"))]

    # trend: output folders made of the recorded summaries
    synthetic = ("{work}/out", "--since", "2026-05-01", "--until", "2026-06-30")
    out += _both("trend-synthetic", "trend", *synthetic, setup=_synthetic_host)
    out += _both(
        "trend-synthetic-series",
        "trend",
        *synthetic,
        "--kind",
        "snapshot",
        "--series",
        "share.worker.*",
        "--series",
        "ttft_p95_s",
        setup=_synthetic_host,
    )
    out += _both(
        "trend-synthetic-baselines",
        "trend",
        *synthetic,
        "--kind",
        "baseline",
        setup=_synthetic_host,
    )
    out += [
        Case(
            "trend-synthetic-plot",
            ("trend", *synthetic, "--plot", "{work}/o/trend.png"),
            setup=_synthetic_host,
        ),
    ]
    recorded = ("{work}/out", "--since", "2026-11-30", "--until", "2026-12-02")
    out += _both("trend-recorded", "trend", *recorded, setup=_recorded_host)
    out += _both("trend-schemas", "trend", *recorded, setup=_schemas_host)
    out += _both(
        "trend-baseline-host",
        "trend",
        "{work}/out",
        "--host",
        "vm",
        "--since",
        "1d",
        "--until",
        "2026-12-01T15:00",
        setup=_baseline_host,
    )

    # aggregate: the fleet layouts of tests/fleet_layout.py
    two = ("{work}/out-a", "{work}/out-b")
    out += _both("aggregate-two-hosts", "aggregate", *two, setup=_two_hosts())
    out += _both(
        "aggregate-two-hosts-saved-table",
        "aggregate",
        *two,
        setup=_two_hosts(),
        prep=(("trend", "{work}/out-a", "--since", "2026-11-30", "--until", "2026-12-02"),),
    )
    out += _both("aggregate-steady-only", "aggregate", *two, setup=_two_hosts(prefill=False))
    out += _both(
        "aggregate-seqs1-alone", "aggregate", *two, setup=_two_hosts(prefill=False, seqs1=True)
    )
    out += _both(
        "aggregate-with-stacks", "aggregate", *two, setup=_two_hosts(prefill=False, flame=True)
    )
    out += _both(
        "aggregate-until", "aggregate", *two, "--until", "2026-12-01T14:53", setup=_two_hosts()
    )
    out += _both(
        "aggregate-host-folder-since",
        "aggregate",
        "{work}/out-b/host-b",
        "--since",
        "2026-12-01T14:46",
        "--until",
        "2026-12-02",
        setup=_two_hosts(),
    )
    out += [
        Case(
            "aggregate-bad-range",
            ("aggregate", *two, "--since", "2026-12-02", "--until", "2026-12-01"),
            setup=_two_hosts(),
        ),
    ]

    # classify --explain: recorded py-spy output, snapshot folders, a public fragment
    for key, inputs in (
        ("record-decode", (f"{RECORDED}-record-decode-heavy.raw.txt",)),
        ("record-prefill", (f"{RECORDED}-record-prefill-heavy.raw.txt",)),
        ("record-mixed-all", (f"{RECORDED}-record-mixed.raw.txt", "--limit", "0")),
        ("worker-dump", (f"{RECORDED}-worker-dump.txt",)),
        ("worker-dump-native", (f"{RECORDED}-worker-dump-native.txt",)),
        ("enginecore-dump-json", (f"{RECORDED}-enginecore-dump.json",)),
        (
            "three-dumps",
            tuple(f"{RECORDED}-{p}-dump.txt" for p in ("apiserver", "enginecore", "worker")),
        ),
        ("flame-prefill", (FLAME_PREFILL,)),
        ("schema1-limit3", (SCHEMA1, "--limit", "3")),
        ("fragment", (f"{FRAGMENTS}/ascend_6784_traceback.txt",)),
    ):
        out += _both(f"explain-{key}", "classify", "--explain", *inputs)
    out += [Case("explain-missing", ("classify", "--explain", f"{FIX}/no-such-file.txt"))]

    # classify without --explain, and rules suggest
    for key, inputs in (
        ("record-mixed", (f"{RECORDED}-record-mixed.raw.txt",)),
        (
            "dumps",
            tuple(
                f"{RECORDED}-{p}"
                for p in ("apiserver-dump.txt", "enginecore-dump.txt", "worker-dump.json")
            ),
        ),
        (
            "fragments",
            tuple(
                f"{FRAGMENTS}/{f}"
                for f in (
                    "ascend_3717_traceback_cut.txt",
                    "ascend_6784_traceback.txt",
                    "vllm_42897_native_cut.txt",
                )
            ),
        ),
        ("faulthandler", (f"{FIX}/parsers/faulthandler_segfault.txt",)),
    ):
        out += _both(f"classify-{key}", "classify", *inputs)
    out += _both(
        "rules-suggest-flame-prefill", "rules", "suggest", "--no-idle-waits", FLAME_PREFILL
    )
    out += _both(
        "rules-suggest-record-decode", "rules", "suggest", f"{RECORDED}-record-decode-heavy.raw.txt"
    )
    out += _both(
        "rules-suggest-record-prefill-top3",
        "rules",
        "suggest",
        "--top",
        "3",
        f"{RECORDED}-record-prefill-heavy.raw.txt",
    )

    # flamegraph: the SVG and the speedscope profile it writes
    out += [
        Case("flamegraph-schema1", ("flamegraph", SCHEMA1, "-o", "{work}/o/")),
        Case("flamegraph-prefill", ("flamegraph", FLAME_PREFILL, "-o", "{work}/o/flame")),
        Case(
            "flamegraph-decode-min-width-0",
            ("flamegraph", FLAME_DECODE, "--min-width", "0", "-o", "{work}/o/flame"),
        ),
        Case(
            "flamegraph-decode-min-width-5",
            ("flamegraph", FLAME_DECODE, "--min-width", "5", "-o", "{work}/o/flame"),
        ),
        Case(
            "flamegraph-diff-prefill-decode",
            ("flamegraph", FLAME_PREFILL, "--diff", FLAME_DECODE, "-o", "{work}/o/flame"),
        ),
        Case(
            "flamegraph-diff-schema1-prefill",
            ("flamegraph", SCHEMA1, "--diff", FLAME_PREFILL, "-o", "{work}/o/"),
        ),
        Case("flamegraph-missing", ("flamegraph", "{work}/nothing", "-o", "{work}/o/")),
    ]
    return out


# ---------------------------------------------------------------------------------- running

# Wall time: the trend table's notes and the fleet report's took_s.
TIMINGS = (
    (
        re.compile(r"^(rebuilt the table from \d+ summaries in )\d+(?:\.\d+)? s$", re.M),
        r"\1<SECONDS> s",
    ),
    (
        re.compile(r"^(brought the table up to date: .*, in )\d+(?:\.\d+)? s$", re.M),
        r"\1<SECONDS> s",
    ),
    (re.compile(r'("took_s": )-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?'), r'\1"<SECONDS>"'),
)
NOISE = re.compile(r"^Matplotlib is building the font cache; this may take a moment\.\n", re.M)


class Normaliser:
    """Paths by placeholders (the longest first, so a folder inside another is named as
    itself), then wall times."""

    def __init__(self, places: Iterable[tuple[Path, str]]) -> None:
        subs: dict[str, str] = {}
        for path, placeholder in places:
            for form in (str(path), os.path.realpath(path)):
                subs.setdefault(form, placeholder)
        self.subs = sorted(subs.items(), key=lambda kv: len(kv[0]), reverse=True)

    def text(self, text: str) -> str:
        for path, placeholder in self.subs:
            text = text.replace(path, placeholder)
        for pattern, repl in TIMINGS:
            text = pattern.sub(repl, text)
        return NOISE.sub("", text)

    def data(self, raw: bytes) -> bytes:
        """Text files normalised; anything that is not UTF-8 (the PNG) kept as it is."""
        try:
            decoded = raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw
        return self.text(decoded).encode("utf-8")


def child_env(checkout: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("VLLM_SIDECAR_")
        and k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONSAFEPATH")
    }
    env.update(
        PYTHONPATH=str(checkout),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONHASHSEED="0",
        PYTHONIOENCODING="utf-8",
        TZ="UTC",
        LC_ALL="C.UTF-8",
        LANG="C.UTF-8",
        COLUMNS="100",
        LINES="50",
        MPLBACKEND="Agg",
        NO_COLOR="1",
    )
    return env


def _cli(
    args: Iterable[str], checkout: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar.cli", *args],
        cwd=checkout,
        env=env,
        capture_output=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def check_package(checkout: Path, env: dict[str, str]) -> None:
    """The children must import the checkout's `sidecar`, not an installed one."""
    got = subprocess.run(
        [sys.executable, "-c", "import sidecar; print(sidecar.__file__)"],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(got).resolve().is_relative_to(checkout.resolve()):
        sys.exit(f"golden: the children import {got}, not the checkout's sidecar ({checkout})")


def run_case(
    case: Case, checkout: Path, tmp: Path, out: Path, env: dict[str, str], norm: Normaliser
) -> dict[str, Any]:
    work = tmp / case.name
    (work / "o").mkdir(parents=True)
    if case.setup is not None:
        case.setup(checkout, work)

    def expand(args: Iterable[str]) -> list[str]:
        return [a.replace("{work}", str(work)) for a in args]

    prep = []
    for args in case.prep:
        done = _cli(expand(args), checkout, env)
        prep.append({"argv": [norm.text(a) for a in expand(args)], "exit_code": done.returncode})
    argv = expand(case.args)
    done = _cli(argv, checkout, env)
    stdout_name = f"{case.name}.{case.ext}"
    (out / stdout_name).write_bytes(norm.data(done.stdout))
    files = []
    for written in sorted((work / "o").rglob("*")):
        if written.is_file():
            name = f"{case.name}.{written.relative_to(work / 'o').as_posix().replace('/', '--')}"
            (out / name).write_bytes(norm.data(written.read_bytes()))
            files.append(name)
    record: dict[str, Any] = {
        "argv": [norm.text(a) for a in argv],
        "exit_code": done.returncode,
        "stderr": norm.text(done.stderr.decode("utf-8", errors="backslashreplace")),
        "stdout": stdout_name,
        "files": files,
    }
    if prep:
        record["prep"] = prep
    return record


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


def record(checkout: Path, out: Path, jobs: int, only: re.Pattern[str] | None) -> int:
    checkout = checkout.absolute()
    cli = checkout / "sidecar" / "cli"  # a package since issue 21, a module before
    if not (cli.with_suffix(".py").is_file() or (cli / "__init__.py").is_file()):
        sys.exit(f"golden: no sidecar.cli in {checkout}")
    if out.exists() and any(out.iterdir()):
        if not (out / CASES_FILE).is_file():
            sys.exit(f"golden: {out} is not empty and holds no {CASES_FILE}: not overwriting it")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    env = child_env(checkout)
    check_package(checkout, env)
    todo = [c for c in cases() if only is None or only.search(c.name)]
    fixtures = checkout / FIX
    before = _tree(fixtures)
    with tempfile.TemporaryDirectory(prefix="golden-") as tmp_name:
        tmp = Path(tmp_name)
        norm = Normaliser(
            [(tmp, "<TMP>"), (checkout, "<CHECKOUT>"), (Path(sys.prefix), "<PREFIX>")]
        )
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            records = list(pool.map(lambda c: run_case(c, checkout, tmp, out, env, norm), todo))
    results = dict(zip((c.name for c in todo), records, strict=True))
    doc = {"format": FORMAT, "checkout": "<CHECKOUT>", "cases": results}
    (out / CASES_FILE).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    codes: dict[int, list[str]] = {}
    for name, rec in results.items():
        codes.setdefault(rec["exit_code"], []).append(name)
    print(f"recorded {len(results)} cases into {out}")
    for code, names in sorted(codes.items()):
        shown = ", ".join(names) if code != 0 else f"{len(names)} cases"
        print(f"  exit {code}: {shown}")
    after = _tree(fixtures)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    if changed:
        print(
            f"warning: {len(changed)} files under {fixtures} changed during the run: "
            f"{', '.join(changed[:10])}",
            file=sys.stderr,
        )
    return 0


# ---------------------------------------------------------------------------------- comparing


def _owner(file_name: str) -> str:
    return file_name.split(".", 1)[0]


def compare(a: Path, b: Path, shown_lines: int) -> int:
    """Every case of A and B, its record and files byte for byte; non-zero when any differs."""
    docs = [json.loads((side / CASES_FILE).read_text()) for side in (a, b)]
    ca, cb = (d["cases"] for d in docs)
    reasons: dict[str, list[str]] = {}
    for name in sorted(ca.keys() | cb.keys()):
        if name not in ca or name not in cb:
            reasons.setdefault(name, []).append(f"only in {a if name in ca else b}")
            continue
        for key in sorted(ca[name].keys() | cb[name].keys()):
            if ca[name].get(key) != cb[name].get(key):
                reasons.setdefault(name, []).append(
                    f"{key}: {ca[name].get(key)!r} != {cb[name].get(key)!r}"[:2000]
                )
    files_a = {p.name for p in a.iterdir() if p.is_file() and p.name != CASES_FILE}
    files_b = {p.name for p in b.iterdir() if p.is_file() and p.name != CASES_FILE}
    for name in sorted(files_a | files_b):
        case = _owner(name)
        if name not in files_a or name not in files_b:
            reasons.setdefault(case, []).append(f"{name} only in {a if name in files_a else b}")
            continue
        raw_a, raw_b = (a / name).read_bytes(), (b / name).read_bytes()
        if raw_a == raw_b:
            continue
        try:
            lines_a = raw_a.decode("utf-8").splitlines(keepends=True)
            lines_b = raw_b.decode("utf-8").splitlines(keepends=True)
        except UnicodeDecodeError:
            reasons.setdefault(case, []).append(
                f"{name} differs ({len(raw_a)} / {len(raw_b)} bytes, binary)"
            )
            continue
        delta = list(difflib.unified_diff(lines_a, lines_b, f"{a}/{name}", f"{b}/{name}", n=1))
        text = "".join(delta[:shown_lines]) + ("...\n" if len(delta) > shown_lines else "")
        reasons.setdefault(case, []).append(f"{name} differs:\n{text}")
    if not reasons:
        print(f"identical: {len(ca)} cases, {len(files_a)} files")
        return 0
    for case, why in reasons.items():
        print(f"== {case}")
        for line in why:
            print(f"  {line}")
    print(f"{len(reasons)} of {len(ca.keys() | cb.keys())} cases differ: {', '.join(reasons)}")
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--checkout",
        type=Path,
        default=REPO,
        help="the source tree whose sidecar package runs (default: this repo)",
    )
    parser.add_argument("--out", type=Path, help="the folder to record into (replaced)")
    parser.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        metavar=("DIR_A", "DIR_B"),
        help="compare two recordings instead; exit 1 naming differing cases",
    )
    parser.add_argument(
        "--jobs", type=int, default=min(8, os.cpu_count() or 1), help="cases run at once"
    )
    parser.add_argument("--only", type=re.compile, help="record only cases matching this regex")
    parser.add_argument(
        "--diff-lines",
        type=int,
        default=40,
        help="--compare: lines of unified diff shown per differing file",
    )
    args = parser.parse_args(argv)
    if args.compare is not None:
        return compare(args.compare[0], args.compare[1], args.diff_lines)
    if args.out is None:
        parser.error("--out DIR (or --compare DIR_A DIR_B) is required")
    return record(args.checkout, args.out, args.jobs, args.only)


if __name__ == "__main__":
    sys.exit(main())
