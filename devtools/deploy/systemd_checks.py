"""The systemd scenario's checks, in the order they run (devtools/deploy/systemd_scenario.py says
what each proves). Each records pass/fail with a one-line reason, its figures and the journal
lines that show it; a step that cannot go on raises BoxError and the checks after it are not run
(they count as failed)."""

from __future__ import annotations

import json
import re
import time
from typing import Any

from devtools.deploy.systemd_box import IMAGE, Box, BoxError

CHECKS = ("boot", "install", "vllm_unit", "ready", "snapshot", "vllm_profiled", "reload_good",
          "reload_bad", "watchdog", "stop", "journal_priorities", "cleanup")  # fmt: skip
UNIT = "vllm-sidecar.service"
CONFIG = "/etc/vllm-sidecar/sidecar.yaml"
OUT = "/var/lib/vllm-sidecar/sdbox"  # OUT/<host>/, the container's hostname
# Short windows so that each step sees a snapshot within seconds: (window_s, interval_s).
WINDOWS = (12, 24)
RELOADED = (5, 15)
# The reload also adds a custom metric, which tells which config a snapshot ran under (a window's
# sampled length does not: on 2 busy cores 5 s windows sampled 7.1 to 9.6 s).
CUSTOM = "tokens_out"
CUSTOM_METRICS = f"custom_metrics:\n  - name: {CUSTOM}\n    metric: vllm:generation_tokens\n"
VLLM_HEALTH_TIMEOUT_S = 300.0
DROP_IN = "/etc/systemd/system/vllm-sidecar.service.d/vllm-group.conf"
CAP_SYS_PTRACE = 1 << 19
SPAN_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}
# The documented install (docs/deploy.md, "systemd"), steps 1, 3 and 4; step 2 (the venv) is in
# the image. `install -D`: Debian 12's systemd package does not create /etc/sysusers.d.
INSTALL = """set -e
install -D -m 0644 /src/systemd/sysusers.d-vllm-sidecar.conf /etc/sysusers.d/vllm-sidecar.conf
systemd-sysusers
install -d -m 0755 /etc/vllm-sidecar
/opt/vllm-sidecar/bin/vllm-sidecar config example -o /etc/vllm-sidecar/sidecar.yaml
install -m 0644 /src/systemd/vllm-sidecar.service /etc/systemd/system/
install -D -m 0644 /src/test/vllm-sidecar.service.d/vllm-group.conf \
    /etc/systemd/system/vllm-sidecar.service.d/vllm-group.conf
install -m 0644 /src/test/vllm.service /etc/systemd/system/
systemctl daemon-reload
"""
LOAD = ("while :; do curl -s -o /dev/null -H 'Content-Type: application/json' -d "
        "'{\"model\": \"tiny\", \"prompt\": \"the quick brown fox jumps over\", "
        "\"max_tokens\": 48}' http://127.0.0.1:8000/v1/completions; sleep 0.2; done")  # fmt: skip
# SIGSTOP, and the moment it was sent on the journal's clock.
FREEZE = ("python3 -c 'import os, signal, time; os.kill({pid}, signal.SIGSTOP); "
          "print(time.monotonic_ns() // 1000)'")  # fmt: skip
PROPS = ("ActiveState", "SubState", "Result", "MainPID", "StatusText", "NRestarts",
         "ExecMainStartTimestampMonotonic", "ActiveEnterTimestampMonotonic", "ExecMainCode",
         "ExecMainStatus", "WatchdogUSec", "RestartUSec", "TimeoutStopUSec")  # fmt: skip


class Checks:
    def __init__(self, box: Box, lines: list[str]) -> None:
        self.box, self.lines = box, lines
        self.t0 = time.monotonic()
        self.figures: dict[str, Any] = {}
        self.results: dict[str, dict[str, Any]] = {}
        self.journal: dict[str, list[str]] = {}
        self.facts: dict[str, Any] = {"image": IMAGE}
        self.vllm_pid = 0
        self.unit: dict[str, str] = {}

    # ------------------------------------------------------------------ bookkeeping

    def say(self, message: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} +{time.monotonic() - self.t0:6.1f}s {message}"
        print(line, flush=True)
        self.lines.append(line)

    def check(self, name: str, passed: bool, detail: str) -> None:
        self.results[name] = {"passed": bool(passed), "detail": detail}
        self.say(f"{'PASS' if passed else 'FAIL'} {name}: {detail}")

    def figure(self, name: str, seconds: float) -> float:
        self.figures[name] = round(seconds, 2)
        return seconds

    def keep(self, name: str, entries: list[dict[str, str]], pattern: str = "") -> None:
        """The journal lines of a check, `PRIORITY identifier: message`, kept in the record."""
        found = [f"<{e.get('PRIORITY', '?')}> {e.get('SYSLOG_IDENTIFIER', '?')}: {e['MESSAGE']}"
                 for e in entries if isinstance(e.get("MESSAGE"), str)
                 and re.search(pattern, e["MESSAGE"])]  # fmt: skip
        self.journal.setdefault(name, []).extend(found)
        for line in found:
            self.lines.append(f"    | {line}")

    def record(self) -> dict[str, Any]:
        return {"facts": self.facts, "unit": self.unit, "figures": self.figures,
                "checks": self.results, "journal": self.journal}  # fmt: skip

    def state(self) -> dict[str, str]:
        return self.box.show(UNIT, *PROPS)

    # ------------------------------------------------------------------ the run

    def run_all(self) -> None:
        for step in (self.boot, self.install, self.vllm_unit, self.without_drop_in, self.ready,
                     self.snapshot,
                     self.reload_good, self.reload_bad, self.watchdog, self.stop,
                     self.journal_priorities):  # fmt: skip
            step()

    def boot(self) -> None:
        started = time.monotonic()
        self.box.start()
        deadline = started + 120
        while True:  # until PID 1's private bus socket exists, systemctl cannot ask
            _, out = self.box.try_sh("systemctl is-system-running --wait", timeout_s=120)
            if "Failed to connect" not in out or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self.figure("boot_s", time.monotonic() - started)
        self.facts["systemd"] = self.box.sh("systemctl --version").splitlines()[0]
        self.facts["startup"] = self.box.sh("systemd-analyze || true").splitlines()[0]
        self.facts["pid1"] = self.box.sh("cat /proc/1/comm").strip()
        self.facts["run_args"] = self.box.run_args()[4:]
        failed = self.box.sh("systemctl --failed --no-legend --plain | cut -d' ' -f1").split()
        self.check("boot", out.strip() == "running" and self.facts["pid1"] == "systemd",
                   f"PID 1 {self.facts['pid1']}, {self.facts['systemd']}: {out.strip()} in "
                   f"{self.figures['boot_s']:.1f} s; failed units: {failed or 'none'}")  # fmt: skip

    def install(self) -> None:
        # The documented one-liner as written first: what it does on Debian 12 is recorded.
        code, out = self.box.try_sh("install -m 0644 /src/systemd/sysusers.d-vllm-sidecar.conf "
                                    "/etc/sysusers.d/vllm-sidecar.conf")  # fmt: skip
        self.facts["docs_sysusers_install"] = f"exit {code}: {out.strip() or 'ok'}"
        self.box.sh(INSTALL)
        self.box.write(CONFIG, configured(self.box.sh(f"cat {CONFIG}"), *WINDOWS))
        user = self.box.sh("getent passwd vllm-sidecar").strip()
        verify = self.box.sh(f"systemd-analyze verify {UNIT} 2>&1 || true").strip()
        self.facts["user"] = user
        self.unit = self.box.show(UNIT, "FragmentPath", "DropInPaths")
        self.check("install", user.startswith("vllm-sidecar:") and not verify,
                   f"user {user}; systemd-analyze verify: {verify or 'silent'}; drop-in "
                   f"{self.unit.get('DropInPaths')}")  # fmt: skip

    def vllm_unit(self) -> None:
        started = time.monotonic()
        self.box.sh("systemctl start vllm.service")
        deadline = started + VLLM_HEALTH_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.box.try_sh("curl -sf http://127.0.0.1:8000/health")[0] == 0:
                break
            if self.box.try_sh("systemctl is-failed -q vllm.service")[0] == 0:
                break
            time.sleep(2)
        self.figure("vllm_health_s", time.monotonic() - started)
        self.vllm_pid = int(self.box.show("vllm.service", "MainPID")["MainPID"])
        tree = self.box.sh("ps -eo user=,pid=,args= | grep -E '[V]LLM|[a]pi_server'").strip()
        healthy = self.box.try_sh("curl -sf http://127.0.0.1:8000/health")[0] == 0
        if healthy:  # requests all along, so that the windows see prefill and decode
            self.box.sh(f"systemd-run --quiet --unit=vllm-load sh -c {_quote(LOAD)}")
        self.check("vllm_unit", healthy and self.vllm_pid > 0,
                   f"vllm.service (user vllm) pid {self.vllm_pid}, /health OK after "
                   f"{self.figures['vllm_health_s']:.1f} s; processes: "
                   f"{' | '.join(tree.splitlines())[:300]}")  # fmt: skip
        if not healthy:
            self.keep("vllm_unit", self.box.journal("vllm.service")[-30:])
            raise BoxError("vLLM did not become healthy")

    def without_drop_in(self) -> None:
        """Not a check, a fact for the docs: the sidecar without the SupplementaryGroups=vllm
        drop-in, against a vLLM whose Python lives under a home it may not enter."""
        self.box.sh(f"mv {DROP_IN} {DROP_IN}.off && systemctl daemon-reload")
        after = self.box.monotonic_us()
        self.box.sh(f"systemctl start --no-block {UNIT}")
        deadline = time.monotonic() + WINDOWS[1] * 2  # the first window's outcome
        while time.monotonic() < deadline:
            s = self.state()
            entries = self.box.journal(UNIT, after)
            if (
                s["ActiveState"] == "failed"
                or s["SubState"] == "auto-restart"
                or any("snapshot written" in str(e.get("MESSAGE")) for e in entries)
            ):
                break
            time.sleep(1)
        self.box.sh(f"systemctl stop {UNIT}; systemctl reset-failed {UNIT}; "
                    f"mv {DROP_IN}.off {DROP_IN} && systemctl daemon-reload")  # fmt: skip
        lines = [f"<{e['PRIORITY']}> {e['MESSAGE']}" for e in entries if _notable(e)]
        self.facts["without_drop_in"] = {
            "state": {k: s[k] for k in ("ActiveState", "SubState", "Result", "ExecMainStatus",
                                        "StatusText")},
            "journal": lines[:8],
        }  # fmt: skip
        self.say(
            f"without the drop-in: {s['ActiveState']}/{s['SubState']}, exit status "
            f"{s['ExecMainStatus']}; {lines[:2]}"
        )

    def ready(self) -> None:
        after = self.box.monotonic_us()
        started = time.monotonic()
        self.box.sh("systemctl enable --now vllm-sidecar", timeout_s=240)
        self.figure("systemctl_start_s", time.monotonic() - started)
        s = self.state()
        # The running unit's: an inactive one shows WatchdogUSec=infinity on systemd 252.
        self.unit.update({k: s[k] for k in ("WatchdogUSec", "RestartUSec", "TimeoutStopUSec")})
        ready_s = self.figure("ready_s", _usec_s(s, "ActiveEnterTimestampMonotonic")
                              - _usec_s(s, "ExecMainStartTimestampMonotonic"))  # fmt: skip
        status = self.box.sh(f"grep -E '^(Uid|Groups|CapEff|CapAmb|CapBnd|NoNewPrivs)' "
                             f"/proc/{s['MainPID']}/status")  # fmt: skip
        caps = dict(re.findall(r"^(\w+):\s*(.*)$", status, flags=re.MULTILINE))
        self.facts["sidecar_process"] = caps
        only_ptrace = all(int(caps.get(k, "0"), 16) == CAP_SYS_PTRACE
                          for k in ("CapEff", "CapAmb", "CapBnd"))  # fmt: skip
        entries = self.box.journal(UNIT, after)
        starting, started_ = _first(entries, "Starting "), _first(entries, "Started ")
        if starting is not None and started_ is not None:  # the job's start, on the journal
            self.figure("starting_to_started_s", (started_ - starting) / 1e6)
        self.keep("ready", entries, "Start|Started|profiling|target|READY")
        self.check("ready", s["ActiveState"] == "active" and s["SubState"] == "running"
                   and s["StatusText"] == f"profiling vLLM pid {self.vllm_pid}"
                   and only_ptrace and caps.get("NoNewPrivs") == "1",
                   f"{s['ActiveState']}/{s['SubState']}, STATUS={s['StatusText']!r}; READY=1 "
                   f"{ready_s:.2f} s after exec (systemctl start returned in "
                   f"{self.figures['systemctl_start_s']:.2f} s); CapEff/CapAmb/CapBnd "
                   f"{caps.get('CapEff')}/{caps.get('CapAmb')}/{caps.get('CapBnd')}, "
                   f"NoNewPrivs {caps.get('NoNewPrivs')}, groups {caps.get('Groups')}")  # fmt: skip

    def snapshot(self) -> None:
        started = time.monotonic()
        name, summary = self.next_snapshot(WINDOWS[1] * 3)
        self.figure("first_snapshot_s", time.monotonic() - started)
        modes = self.box.sh(f"stat -c '%U:%G %a' {OUT}/{name} {OUT}/{name}/summary.json")
        want = "vllm-sidecar:vllm-sidecar 750\nvllm-sidecar:vllm-sidecar 640"
        self.check(
            "snapshot",
            modes.strip() == want,
            f"{name} after {self.figures['first_snapshot_s']:.1f} s; folder and summary.json: "
            f"{' / '.join(modes.strip().splitlines())}",
        )
        self.profiled(name, summary)

    def profiled(self, name: str, summary: dict[str, Any]) -> None:
        roles = sorted({p["role"] for p in summary["target"]["processes"]})
        phases = {k: v["share"] for k, v in summary["phases"].items() if v["share"] > 0}
        busy = {k: v for k, v in phases.items() if k not in ("idle", "other")}
        self.facts["first_snapshot"] = {
            "name": name, "root_pid": summary["target"]["root_pid"], "roles": roles,
            "samples": summary["sampling"]["samples"], "errors": summary["sampling"]["errors"],
            "duration_s": summary["sampling"]["duration_s"], "phases": phases,
            "requests_per_s": summary["serving"].get("requests_per_s"),
            "fingerprint": {k: summary["fingerprint"].get(k) for k in ("vllm", "torch", "python")},
        }  # fmt: skip
        self.check("vllm_profiled", summary["target"]["root_pid"] == self.vllm_pid
                   and {"api_server", "engine_core", "worker"} <= set(roles)
                   and summary["sampling"]["samples"] > 0 and bool(busy),
                   f"root pid {summary['target']['root_pid']}, roles {roles}, "
                   f"{summary['sampling']['samples']} samples, phases "
                   f"{ {k: round(v, 3) for k, v in phases.items()} }")  # fmt: skip

    def reload_good(self) -> None:
        before = self.state()["MainPID"]
        self.box.write(CONFIG, configured(self.box.sh(f"cat {CONFIG}"), *RELOADED, custom=True))
        after, started = self.box.monotonic_us(), time.monotonic()
        self.box.sh(f"systemctl reload {UNIT}")
        self.figure("systemctl_reload_s", time.monotonic() - started)
        entry = self.wait_journal(after, "configuration reloaded from|reload failed", 60)
        self.figure("reload_applied_s", (int(entry["__MONOTONIC_TIMESTAMP"]) - after) / 1e6)
        name, summary = self.next_snapshot(RELOADED[1] * 4, reloaded_only=True)
        duration = summary["sampling"]["duration_s"]
        s = self.state()
        self.keep("reload_good", self.box.journal(UNIT, after), "eload")
        self.check(
            "reload_good",
            "configuration reloaded" in entry["MESSAGE"]
            and s["MainPID"] == before
            and s["ActiveState"] == "active"
            and reloaded(summary),
            f"window_s {WINDOWS[0]} -> {RELOADED[0]} and custom metric {CUSTOM} added: applied "
            f"{self.figures['reload_applied_s']:.1f} s after `systemctl reload`, pid "
            f"{before} -> {s['MainPID']}; the first snapshot under it, {name}, has {CUSTOM} "
            f"(sampled {duration} s)",
        )

    def reload_bad(self) -> None:
        before = self.state()["MainPID"]
        good = self.box.sh(f"cat {CONFIG}")
        # Broken, and without the custom metric: were any of it applied, snapshots would lose it.
        broken = good.replace(f"window_s: {RELOADED[0]} ", f"window_s: {RELOADED[0]} parsecs ", 1)
        self.box.write(CONFIG, broken.replace(CUSTOM_METRICS, "custom_metrics: []\n"))
        after = self.box.monotonic_us()
        self.box.sh(f"systemctl reload {UNIT}")
        entry = self.wait_journal(after, "configuration reloaded from|reload failed", 60)
        name, summary = self.next_snapshot(RELOADED[1] * 4)
        duration = summary["sampling"]["duration_s"]
        s = self.state()
        self.keep("reload_bad", self.box.journal(UNIT, after), "eload")
        self.box.write(CONFIG, good)  # a restart (the watchdog's, next) must find a good file
        self.check("reload_bad", "reload failed" in entry["MESSAGE"]
                   and entry.get("PRIORITY") == "3" and s["MainPID"] == before
                   and s["ActiveState"] == "active" and reloaded(summary),
                   f"priority {entry.get('PRIORITY')}: {entry['MESSAGE'][:200]}; pid {before} "
                   f"-> {s['MainPID']}, {s['ActiveState']}; next snapshot {name} still has "
                   f"{CUSTOM}: {reloaded(summary)} (sampled {duration} s)")  # fmt: skip

    def watchdog(self) -> None:
        s = self.state()
        pid, watchdog_s = s["MainPID"], _usec_s(s, "WatchdogUSec")
        restart_s = _usec_s(s, "RestartUSec")
        frozen = int(self.box.sh(FREEZE.format(pid=pid)))
        self.say(
            f"pid {pid} frozen (SIGSTOP); WatchdogSec {watchdog_s:g}, RestartSec {restart_s:g}"
        )
        deadline = time.monotonic() + watchdog_s + restart_s + 120
        while time.monotonic() < deadline:
            s = self.state()
            if s["MainPID"] not in (pid, "0") and s["ActiveState"] == "active":
                break
            time.sleep(1)
        entries = self.box.journal(UNIT, frozen)
        fired, died = _first(entries, "Watchdog timeout"), _first(entries, "Main process exited")
        start_s = _usec_s(s, "ExecMainStartTimestampMonotonic")
        if fired is not None and died is not None:
            self.figure("frozen_to_watchdog_s", (fired - frozen) / 1e6)
            self.figure("watchdog_to_exit_s", (died - fired) / 1e6)
            self.figure("exit_to_restart_s", start_s - died / 1e6)
        back = self.figure("frozen_to_ready_again_s",
                           _usec_s(s, "ActiveEnterTimestampMonotonic") - frozen / 1e6)  # fmt: skip
        self.keep("watchdog", entries, "Watchdog|Main process|Killing|Failed|Scheduled|Start|prof")
        f = self.figures
        self.check("watchdog", fired is not None and (fired - frozen) / 1e6 <= watchdog_s + 1.0
                   and died is not None and s["MainPID"] != pid
                   and s["ActiveState"] == "active" and int(s["NRestarts"]) >= 1,
                   f"pid {pid} frozen; watchdog fired after {f.get('frozen_to_watchdog_s')} s "
                   f"(WatchdogSec {watchdog_s:g}), exit {f.get('watchdog_to_exit_s')} s later, "
                   f"started again {f.get('exit_to_restart_s')} s after (RestartSec "
                   f"{restart_s:g}); READY again as pid {s['MainPID']} {back:.1f} s after the "
                   f"freeze; NRestarts {s['NRestarts']}")  # fmt: skip

    def stop(self) -> None:
        self.next_snapshot(RELOADED[1] * 4)  # the restarted sidecar writes snapshots
        deadline = time.monotonic() + RELOADED[1] * 2  # stop in the middle of a window
        while time.monotonic() < deadline and self.box.try_sh("pgrep -u vllm-sidecar py-spy")[0]:
            time.sleep(0.5)
        time.sleep(1.0)
        known = set(self.snapshots())
        after, started = self.box.monotonic_us(), time.monotonic()
        self.box.sh(f"systemctl stop {UNIT}", timeout_s=60)
        self.figure("systemctl_stop_s", time.monotonic() - started)
        s = self.state()
        written = sorted(set(self.snapshots()) - known)
        left = self.box.sh("pgrep -u vllm-sidecar -a || true").strip()
        self.keep("stop", self.box.journal(UNIT, after))
        self.check("stop", s["Result"] == "success" and s["ExecMainStatus"] == "0"
                   and s["ActiveState"] == "inactive" and not left and bool(written)
                   and self.figures["systemctl_stop_s"] < _usec_s(s, "TimeoutStopUSec"),
                   f"{s['ActiveState']}, Result={s['Result']}, exit status "
                   f"{s['ExecMainStatus']} in {self.figures['systemctl_stop_s']:.2f} s; the "
                   f"window cut short written: {written or 'none'}; processes left: "
                   f"{left or 'none'}")  # fmt: skip
        started = time.monotonic()
        self.box.sh("systemctl stop vllm-load.service vllm.service", timeout_s=90)
        self.figure("vllm_stop_s", time.monotonic() - started)

    def journal_priorities(self) -> None:
        entries = self.box.journal(UNIT)
        levels = {"DEBUG": "7", "INFO": "6", "WARNING": "4", "ERROR": "3", "CRITICAL": "2"}
        counts: dict[str, int] = {}
        wrong = []
        for e in entries:
            message = e.get("MESSAGE")
            if e.get("SYSLOG_IDENTIFIER") != "vllm-sidecar" or not isinstance(message, str):
                continue
            level = "ERROR" if message.startswith("vllm-sidecar: error:") else message.split()[0]
            if level in levels:  # the log's lines, and the error that ends a run (cli.main)
                counts[level] = counts.get(level, 0) + 1
                if e.get("PRIORITY") != levels[level]:
                    wrong.append(f"<{e.get('PRIORITY')}> {message}")
        self.figures["sidecar_journal_lines"] = counts
        by_systemd: dict[str, int] = {}  # systemd's own lines about the unit (the watchdog's: 3)
        for e in entries:
            if e.get("SYSLOG_IDENTIFIER") == "systemd":
                by_systemd[e["PRIORITY"]] = by_systemd.get(e["PRIORITY"], 0) + 1
        self.figures["systemd_journal_lines_by_priority"] = dict(sorted(by_systemd.items()))
        errors = self.box.sh(f"journalctl -u {UNIT} -p err -o cat --no-pager").strip()
        self.journal["journalctl_p_err"] = errors.splitlines()
        self.lines.extend(f"    | -p err: {line}" for line in errors.splitlines())
        start_error = any(line.startswith("vllm-sidecar: error:") for line in errors.splitlines())
        self.check("journal_priorities", not wrong and {"INFO", "ERROR"} <= counts.keys()
                   and start_error,
                   f"sidecar lines by level {counts}; priority differing from the level: "
                   f"{wrong[:3] or 'none'}; `journalctl -p err` shows "
                   f"{len(errors.splitlines())} lines, the start refused without the drop-in "
                   f"among them: {start_error}")  # fmt: skip

    # ------------------------------------------------------------------ helpers

    def snapshots(self) -> list[str]:
        out = self.box.sh(f"ls {OUT} 2>/dev/null || true")
        return re.findall(r"^\d{8}T\d{6}Z(?:-baseline)?$", out, flags=re.MULTILINE)

    def next_snapshot(self, timeout_s: float, reloaded_only: bool = False
                      ) -> tuple[str, dict[str, Any]]:  # fmt: skip
        """The first snapshot not seen before, with its summary; `reloaded_only`: the first
        that ran under the reloaded config (a window under way at the reload keeps the old)."""
        skip = set(self.snapshots())
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name in sorted(set(self.snapshots()) - skip):
                code, text = self.box.try_sh(f"cat {OUT}/{name}/summary.json")
                if code != 0:
                    continue  # still being written
                skip.add(name)
                summary = json.loads(text)
                duration = summary["sampling"]["duration_s"]
                if not reloaded_only or reloaded(summary):
                    return name, summary
                self.say(f"snapshot {name} sampled {duration} s: the config before the reload")
            time.sleep(1)
        raise BoxError(f"no new snapshot under {OUT} within {timeout_s:g} s")

    def wait_journal(self, after: int, pattern: str, timeout_s: float) -> dict[str, str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for entry in self.box.journal(UNIT, after):
                if isinstance(entry.get("MESSAGE"), str) and re.search(pattern, entry["MESSAGE"]):
                    return entry
            time.sleep(1)
        raise BoxError(f"no journal line /{pattern}/ within {timeout_s:g} s")


def reloaded(summary: dict[str, Any]) -> bool:
    """A snapshot of a window that ran under the reloaded config: it has the custom metric."""
    return any(c.get("name") == CUSTOM for c in summary.get("custom") or [])


def configured(text: str, window_s: int, interval_s: int, custom: bool = False) -> str:
    """The example config in windows mode with these window and interval lengths (and the
    custom metric)."""
    if custom:
        text, count = re.subn(r"^custom_metrics: \[\]\n", CUSTOM_METRICS, text, flags=re.MULTILINE)
        if count != 1:
            raise ValueError("the example config has no line `custom_metrics: []`")
    for pattern, value in ((r"^(  mode: )\w+", "windows"),
                           (r"^(  window_s: )\S+", str(window_s)),
                           (r"^(  interval_s: )\S+", f"{interval_s}s")):  # fmt: skip
        text, count = re.subn(pattern, rf"\g<1>{value}", text, count=1, flags=re.MULTILINE)
        if count != 1:
            raise ValueError(f"the example config has no line /{pattern}/")
    return text


def _usec_s(props: dict[str, str], key: str) -> float:
    """A property in seconds: *Monotonic are µs; *USec systemctl prints as spans (`1min 30s`)."""
    value = props.get(key) or "0"
    if value.isdigit():
        return int(value) / 1e6
    spans = re.findall(r"(\d+(?:\.\d+)?)\s*(us|ms|s|min|h)\b", value)
    if not spans:
        raise ValueError(f"{key}={value!r} is not a time span")
    return sum(float(n) * SPAN_S[unit] for n, unit in spans)


def _notable(entry: dict[str, str]) -> bool:
    """A warning or worse, an error line, or a snapshot written."""
    message = entry.get("MESSAGE")
    return isinstance(message, str) and (entry.get("PRIORITY", "6") < "5" or "error" in message
                                         or "snapshot written" in message)  # fmt: skip


def _first(entries: list[dict[str, str]], text: str) -> int | None:
    for e in entries:
        if isinstance(e.get("MESSAGE"), str) and text in e["MESSAGE"]:
            return int(e["__MONOTONIC_TIMESTAMP"])
    return None


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
