"""The recorded discover check (devtools/discover_check.py, `make discover-check`) holds what
issue 23, item 5 asks: on a host of two real vLLM CPU servers, `vllm-sidecar run --discover`
(no --pid, no `targets:`) writes snapshots of both within two intervals of its start, each
server in its own folder (OUT/<host>/<model@port>/, as `targets: [{discover: true}]` does),
which the readers list; and with one server the same command writes OUT/<host>/ as before."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

RECORD = Path(__file__).resolve().parents[2] / "fixtures" / "discover" / "discover-check.json"
SNAPSHOT = r"\d{8}T\d{6}Z(-baseline)?(-\d+)?"


def record() -> dict[str, Any]:
    return json.loads(RECORD.read_text())  # type: ignore[no-any-return]


def test_the_record_is_of_this_code_on_a_quiet_host() -> None:
    r = record()
    assert re.fullmatch(r"[0-9a-f]{7,40}( \+ uncommitted changes)?", r["commit"]), r["commit"]
    assert r["vllm"] and r["other_vllm_servers_on_the_host"] == []


def test_both_servers_snapshots_came_within_two_intervals() -> None:
    two = record()["two_servers"]
    assert two["command"][:3] == ["vllm-sidecar", "run", "--discover"]
    assert not {"--pid", "--pid-file", "--config"} & set(two["command"])
    assert two["limit_s"] == 2 * two["interval_s"] and two["window_s"] < two["interval_s"]
    assert len(two["servers"]) == 2
    firsts = [s["first_snapshot_after_s"] for s in two["servers"]]
    assert None not in firsts and two["both_after_s"] == max(firsts) <= two["limit_s"]
    # Windows in turn: the second server's first window waits for the first one's.
    assert max(firsts) - min(firsts) >= 0.9 * two["window_s"]


def test_each_server_has_a_folder_of_its_own_that_the_readers_list() -> None:
    two = record()["two_servers"]
    names = sorted(s["deployment"] for s in two["servers"])
    assert all(re.fullmatch(r"tiny@\d+", n) for n in names) and names[0] != names[1]
    for s in two["servers"]:
        assert s["snapshots"] >= 1 and s["summaries_of_this_server"] and s["index_names_it"]
        assert s["target_up"] == 1.0
    [host] = {f.split("/")[0] for f in two["folders"]}
    assert {f.split("/")[1] for f in two["folders"]} == set(names)
    assert all(re.fullmatch(rf"[^/]+/tiny@\d+/{SNAPSHOT}", f) for f in two["folders"])
    assert not two["host_folder_has_its_own_index"]  # it would hide the deployment folders
    assert sorted(two["readers_list"]) == [f"{host}/{n}" for n in names]
    assert two["exit_code_after_sigterm"] == 0


def test_the_log_says_why_it_profiles_every_server() -> None:
    log = "\n".join(record()["two_servers"]["log"])
    assert re.search(r"found 2 vLLM servers: pid \d+ \(model tiny, port \d+\); pid \d+ "
                     r"\(model tiny, port \d+\): profiling every vLLM server", log)  # fmt: skip
    assert "`targets: [{discover: true}]`" in log
    assert "Pick one with --pid" not in log and "discovery_ambiguous" not in log
    assert len(re.findall(r"deployment tiny@\d+: attached to vLLM", log)) == 2


def test_one_server_keeps_the_single_daemon_and_its_folder() -> None:
    one = record()["one_server"]
    assert one["command"][:3] == ["vllm-sidecar", "run", "--discover"]
    assert one["first_snapshot_after_s"] is not None and one["snapshots_in_the_host_folder"] >= 1
    assert one["summaries_of_this_server"]
    [host] = one["readers_list"]
    assert "/" not in host  # OUT/<host>/ itself, no deployment folder
    assert all(re.fullmatch(rf"{re.escape(host)}/{SNAPSHOT}", f) for f in one["folders"])
    assert one["sampling_modes"] == ["continuous"]  # the single daemon's default, as before
    assert not any("profiling every vLLM server" in line for line in one["log"])
    assert one["exit_code_after_sigterm"] == 0
