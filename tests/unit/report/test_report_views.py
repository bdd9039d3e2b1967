"""The report's views (sidecar/report/views.py, built by sidecar/report/build.py): the JSON keeps
the keys and their order, and a key some branches leave out stays out rather than turning null."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from sidecar.advice.findings import evaluate
from sidecar.advice.findings import to_json as findings_json
from sidecar.records.readings import ServingFigures
from sidecar.report.build import memory_view, report_view, stages_view
from sidecar.report.text import report_data
from sidecar.report.views import (
    INLINE,
    OMIT_NONE,
    Device,
    GpuMemory,
    HostOnlyMemory,
    NotMeasured,
    OneGpuMemory,
    ThreadsView,
    to_jsonable,
)
from tests.unit.report.test_report import summary

TOP = ["snapshot", "schema", "header", "memory", "computation", "throughput", "findings", "custom",
       "software", "phases", "stages", "processes", "threads", "caveats"]  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Part:
    b: int
    c: str | None


@dataclass(frozen=True, slots=True)
class _Whole:
    a: int
    part: _Part | NotMeasured = field(metadata=INLINE)
    d: tuple[int, ...]
    e: str | None = field(default=None, metadata=OMIT_NONE)
    f: str | None = None


def test_inline_splices_the_variants_keys_in_place_and_omit_none_leaves_the_key_out() -> None:
    whole = _Whole(1, _Part(2, None), (3,))
    assert list(to_jsonable(whole).items()) == [
        ("a", 1), ("b", 2), ("c", None), ("d", [3]), ("f", None)
    ]  # fmt: skip
    other = to_jsonable(_Whole(1, NotMeasured("why"), (), e="said"))
    assert list(other) == ["a", "missing", "d", "e", "f"] and other["e"] == "said"


def test_enums_by_value_and_mapping_keys_as_text() -> None:
    assert to_jsonable({Device.GPU: (Device.HOST,)}) == {"gpu": ["host"]}


def test_report_data_is_the_views_json_in_the_old_order() -> None:
    s = summary(gpu=True, metrics=True)
    data = report_data(s)
    assert list(data) == TOP
    assert data == to_jsonable(report_view(s, evaluate(s)))
    # the findings' JSON is the advice module's own, key for key
    assert data["findings"] == to_jsonable(findings_json(evaluate(s)))


def test_the_hosts_one_gpu_carries_its_utilisation_on_the_gpu_line() -> None:
    m = memory_view(summary(gpu=True, metrics=True))
    assert m.device is Device.GPU and isinstance(m.reading, OneGpuMemory)
    assert m.kv_cache is not None and m.kv_cache_missing is None
    data = to_jsonable(m)
    assert list(data) == ["device", "used_bytes", "total_bytes", "devices", "util", "gpus",
                          "kv_cache"]  # fmt: skip


def test_several_gpus_of_unknown_use_say_so_without_a_util_key() -> None:
    s = summary(gpu=True, metrics=True)
    s = replace(s, gpu=replace(s.gpu, target=None, devices=s.gpu.devices * 2))
    m = memory_view(s)
    assert isinstance(m.reading, GpuMemory) and m.reading.devices == 2
    assert m.gpu_lines == ("all of this host's GPUs: which ones the target uses is unknown",)
    assert "util" not in to_jsonable(m)


def test_a_cpu_host_shows_the_hosts_memory_with_a_note() -> None:
    m = memory_view(summary(gpu=False, metrics=False))
    assert m.device is Device.HOST and isinstance(m.reading, HostOnlyMemory)
    assert m.gpu_lines == () and m.kv_cache is None
    data = to_jsonable(m)
    assert list(data) == ["device", "used_bytes", "total_bytes", "note", "kv_cache",
                          "kv_cache_missing"]  # fmt: skip
    assert data["kv_cache"] is None  # null, not absent: the key was always there


def test_no_memory_reading_at_all_is_not_measured() -> None:
    s = summary(gpu=False, metrics=False)
    s = replace(s, resources=replace(s.resources, host_memory=None))
    data = to_jsonable(memory_view(s))
    assert data["missing"] == "no memory readings in this snapshot"
    assert "used_bytes" not in data and "note" not in data


@pytest.mark.parametrize("metrics", [True, False])
def test_unmeasured_sections_hold_only_why(metrics: bool) -> None:
    s = summary(gpu=False, metrics=metrics)
    s = replace(s, fingerprint=None, threads=(), serving=ServingFigures(reason="scrape failed"))
    data = report_data(s)
    assert data["throughput"] == {"missing": "scrape failed"}
    assert data["software"] == {"deployment": None,
                                "missing": "not recorded (written before schema 3)"}  # fmt: skip
    assert list(data["threads"]) == ["missing"]
    assert data["computation"]["missing"] == "scrape failed"
    assert list(data["computation"]) == ["missing", "model_steps"]


def test_threads_and_stages_keep_their_keys() -> None:
    s = summary(gpu=False, metrics=True)
    v = report_view(s, evaluate(s))
    if isinstance(v.threads, ThreadsView):
        assert list(to_jsonable(v.threads)) == ["counts", "flagged", "how"]
    assert list(to_jsonable(stages_view(replace(s, stages={"prefill": 1, "decode": 1})))) == [
        "samples"
    ]
