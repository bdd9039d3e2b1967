"""systemd for real (issue 24, item 4): the units under Debian's systemd as PID 1, in a container.

The units of systemd/ are installed as docs/deploy.md says (sysusers, the venv from a wheel of
the checkout, the example config, the unit) in a container whose PID 1 is systemd 252, beside a
real vLLM (the tiny CPU server) run as its own unit, vllm.service, by its own user. Then, with
systemctl and journalctl through `docker exec`:

- boot: systemd reaches `running`;
- install: the documented steps work, `systemd-analyze verify` on the live system is silent;
- vllm_unit: vllm.service answers /health;
- ready: `systemctl enable --now vllm-sidecar` returns once the sidecar sent READY=1, with its
  STATUS= naming vLLM's PID, running as vllm-sidecar with CAP_SYS_PTRACE only;
- snapshot, vllm_profiled: a snapshot of vLLM's three processes, with serving phases, owned by
  vllm-sidecar (0750/0640);
- reload_good: `systemctl reload` with a new window length: logged, same PID, the next snapshot
  has the new length; reload_bad: a broken value: an error in the journal, same PID, windows go
  on at the running length;
- watchdog: the sidecar frozen with SIGSTOP is killed by the watchdog (WatchdogSec) and started
  again after RestartSec;
- stop: `systemctl stop` cuts the window short and exits 0 (Result=success), nothing left;
- journal_priorities: the sidecar's lines carry their level's syslog priority;
- cleanup: the container, its cgroups and mounts are gone (always attempted, pass or fail).

    .venv/bin/python -m devtools.deploy.systemd_scenario

Writes tests/fixtures/deploy/systemd.json (checked by
tests/unit/project/test_deploy_systemd_record.py) and systemd.log; exits 0 only when every check
passed. Holds the live lock (/tmp/vllm-sidecar-live.lock) while it runs, about 5 minutes.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from types import FrameType
from typing import Any

from devtools.deploy.systemd_box import ROOT, TEST_DIR, Box, BoxError, build_image, digests, scratch
from devtools.deploy.systemd_checks import CHECKS, Checks
from devtools.matrix import live_lock

RECORD = ROOT / "tests" / "fixtures" / "deploy" / "systemd.json"
LOG = RECORD.with_suffix(".log")


def main() -> int:
    started = time.monotonic()
    lines: list[str] = []
    record: dict[str, Any] = {
        "recorded_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": _git("rev-parse", "HEAD"),
        "worktree_changes": bool(_git("status", "--porcelain")),
        "files": digests(sorted([*(ROOT / "systemd").iterdir(),
                                 *(p for p in TEST_DIR.rglob("*") if p.is_file())])),
    }  # fmt: skip
    box = Box(f"vllm-sidecar-systemd-{int(time.time())}")
    checks = Checks(box, lines)
    work = scratch()
    _on_signals(lambda signum: _interrupted(signum))
    try:
        waiting = time.monotonic()
        with live_lock():
            record["live_lock_wait_s"] = round(time.monotonic() - waiting, 1)
            checks.say(f"live lock taken (waited {record['live_lock_wait_s']} s)")
            record["image_build_s"] = round(build_image(work, lines), 1)
            checks.say(f"image built ({record['image_build_s']} s)")
            checks.run_all()
    except Exception as exc:  # recorded: the checks not reached count as failed
        checks.say(f"stopped: {type(exc).__name__}: {exc}")
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc(limit=6)
    finally:
        _on_signals(lambda signum: None)  # the removal must not be cut short
        shutdown = time.monotonic()
        left = box.remove()
        checks.figures["container_stop_and_remove_s"] = round(time.monotonic() - shutdown, 1)
        checks.check("cleanup", not left, f"left behind: {left or 'nothing'}")
        shutil.rmtree(work, ignore_errors=True)
    record.update(checks.record())
    record["total_s"] = round(time.monotonic() - started, 1)  # with the wait for the lock
    record["run_s"] = round(record["total_s"] - record.get("live_lock_wait_s", 0.0), 1)
    record["passed"] = all(record["checks"].get(name, {}).get("passed") for name in CHECKS)
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    RECORD.write_text(json.dumps(record, indent=2) + "\n")
    LOG.write_text("\n".join(lines) + "\n")
    failed = [n for n in CHECKS if not record["checks"].get(n, {}).get("passed")]
    print(f"systemd scenario: {'passed' if not failed else 'FAILED: ' + ', '.join(failed)} "
          f"in {record['run_s']} s; {RECORD.relative_to(ROOT)}")  # fmt: skip
    return 0 if not failed else 1


def _on_signals(handler: Callable[[int], None]) -> None:
    def on_signal(signum: int, frame: FrameType | None) -> None:
        handler(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)


def _interrupted(signum: int) -> None:
    # Unwinds to main()'s finally, which removes the container (ignoring further signals).
    raise BoxError(f"interrupted by {signal.Signals(signum).name}")


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
