"""`vllm-sidecar doctor`: check each thing the daemon needs, and say what to fix."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from importlib.metadata import packages_distributions
from pathlib import Path
from typing import TypeVar

from sidecar.advice.rules import load_advice
from sidecar.classify.rules import load_rules
from sidecar.config.settings import Config, load_named
from sidecar.config.targets import TargetSpec
from sidecar.errors import SidecarError
from sidecar.extras import EXTRAS, Extra, missing_modules, pip_line
from sidecar.sampling.pyspy import PTRACE_HELP, SubprocessPySpy, explain_failure
from sidecar.target.discovery import (
    Deployment,
    configured_target,
    deployment_id,
    find_all,
    servers_found,
)
from sidecar.target.procfs import ProcFs
from sidecar.vllm_metrics import HttpMetricsSource, MetricsScrape, take_scrape
from sidecar.vllm_metrics.custom import probe
from sidecar.window.readers import metrics_source_for, open_gpu_reader

CAP_SYS_PTRACE = 19
_T = TypeVar("_T")


def check_rule_files(config: Config) -> None:
    """The rules and advice files `config` names, loaded once at start, so that a broken one
    fails there (exit 2) rather than in a window; the daemon's parts load them the same way
    (`load_named`) on a reload. The built-in files are tested with the package, not re-read."""
    if config.rules is not None:
        load_named(config, "rules", load_rules)
    if config.advice is not None:
        load_named(config, "advice", load_advice)


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "FAIL"


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""


def run_checks(config: Config) -> list[Check]:
    # The config itself was checked when it was loaded, the rules and advice files by the CLI
    # (check_rule_files);
    # say which they are.
    rules = str(config.rules) if config.rules else "built-in"
    advice = str(config.advice) if config.advice else "built-in"
    checks = [Check("config", Status.OK, f"{config.source}; rules: {rules}; advice: {advice}")]
    spy = _guard(checks, "py-spy", lambda: _py_spy(config))
    config = _every_server(config, checks)
    if config.targets:
        target = _fleet(config, spy, checks)
        checks.append(_nvml(config))
    else:
        target = _guard(checks, "target", lambda: _target(config))
        checks.append(_ptrace(spy, target))
        checks.append(_nvml(config))
        if target is not None:
            checks.append(_metrics(config, target))
    checks += _custom(config, target)
    checks.append(_output(config))
    checks.extend(sampler_checks(config))
    if config.upload.url is not None:
        checks.append(_upload(config))
    checks.append(install_check(packages_distributions()))
    checks.append(extras_check(missing_modules))
    return checks


# The PyPI package `sidecar` (the JupyterLab sidecar widget) installs the same top-level
# import name: in one environment, the second install overwrites the first one's files.
OWN_DISTRIBUTION = "vllm-sidecar"


def install_check(distributions: Mapping[str, Sequence[str]]) -> Check:
    """Whether another distribution installs the import name `sidecar` beside this one;
    DISTRIBUTIONS: importlib.metadata.packages_distributions(), import name -> distributions."""
    others = sorted({d for d in distributions.get("sidecar", ()) if d.lower() != OWN_DISTRIBUTION})
    if not others:
        return Check("install", Status.OK, f"the import name `sidecar` is {OWN_DISTRIBUTION}'s")
    names = ", ".join(others)
    return Check(
        "install", Status.FAIL,
        f"{names} is installed here too and uses the same import name, `sidecar` (the PyPI "
        "package `sidecar` is the JupyterLab sidecar widget): whichever was installed last "
        "overwrote the other's files",
        f"install vllm-sidecar in an environment of its own (python3 -m venv /opt/vllm-sidecar "
        f"&& /opt/vllm-sidecar/bin/pip install vllm-sidecar), or `pip uninstall {others[0]}` "
        "then `pip install --force-reinstall vllm-sidecar`",
    )  # fmt: skip


def extras_check(missing: Callable[[Extra], tuple[str, ...]]) -> Check:
    """Which extras are installed; a missing one is not a fault (the daemon needs none), so
    it is said with the command that needs it and the `pip install` that brings it."""
    absent = [e for e in EXTRAS if missing(e)]
    have = [e.name for e in EXTRAS if e not in absent]
    detail = f"installed: {', '.join(have) or 'none'}"
    if not absent:
        return Check("extras", Status.OK, detail)
    wanted = "; ".join(f"[{e.name}] for {e.used_by}" for e in absent)
    fix = "; ".join(pip_line(e) for e in absent)
    return Check("extras", Status.OK, f"{detail}; not installed: {wanted}", f"if needed: {fix}")


def sampler_checks(config: Config) -> list[Check]:
    """The sampler's own efficiency, from the newest snapshot a daemon wrote under output.dir
    (one per host or deployment folder): per process the rate asked of py-spy against the rate
    achieved, py-spy's errors and lateness, and the sidecar's CPU (py-spy's and its own)
    against its budget."""
    from sidecar.store.summary_io import read_summary

    by_store: dict[Path, list[Path]] = {}
    for summary in sorted(Path(config.output.dir).glob("*/**/2*/summary.json")):
        if "incidents" not in summary.parts:
            by_store.setdefault(summary.parent.parent, []).append(summary.parent)
    out = []
    for where, folders in sorted(by_store.items()):
        try:  # the newest scheduled one: a triggered snapshot samples at its own fixed rate
            read = (read_summary(f) for f in reversed(folders[-20:]))
            s = next((x for x in read if x.cause is None), None) or read_summary(folders[-1])
        except SidecarError as exc:
            out.append(Check(f"sampler {where.name}", Status.WARN, str(exc)))
            continue
        folder = where / s.name
        sp = s.sampling
        wall = sp.duration_s or 1.0
        own = sp.self_cpu_s
        share = (sp.sampler_cpu_s + (own or 0.0)) / wall
        mode = sp.mode or "windows"
        budget = (config.sampling.continuous_budget if mode == "continuous"
                  else config.sampling.cpu_budget)  # fmt: skip
        rates = "; ".join(
            f"{p.role.value} {p.pid}: asked {p.requested_hz:.2f}/s, got "
            + (f"{p.achieved_hz:.2f}/s" if p.achieved_hz is not None else "none")
            + (f", {p.errors} errors" if p.errors else "")
            + (f", {p.behind_s:.1f} s behind" if p.behind_s >= 1 else "")
            for p in sp.processes
        )  # fmt: skip
        detail = (f"{folder.name} ({mode}): the sidecar used {100 * share:.2f}% of a core "
                  + ("(py-spy's and its own)" if own is not None else "(py-spy's alone: "
                     "written before schema 6)")
                  + (f", budget {100 * budget:g}%" if budget else "")
                  + (f"; {rates}" if rates else ""))  # fmt: skip
        slow = [p for p in sp.processes
                if p.achieved_hz is not None and p.achieved_hz < 0.5 * p.requested_hz]  # fmt: skip
        over = budget is not None and own is not None and share > 1.5 * budget
        status = Status.WARN if slow or over or sp.behind_s >= 1 else Status.OK
        fix = ""
        if slow or sp.behind_s >= 1:
            fix = ("py-spy got fewer samples than asked (a host short of CPU): raise the sidecar's "
                   "CPU weight (systemd: CPUWeight=) or lower the rate")  # fmt: skip
        elif over:
            fix = ("the sidecar spent over its budget: the README's \"A budget that counts "
                   "everything\" says where it goes")  # fmt: skip
        out.append(Check(f"sampler {where.name}", status, detail, fix))
    return out


def _guard(checks: list[Check], name: str, fn: Callable[[], tuple[Check, _T]]) -> _T | None:
    try:
        check, value = fn()
    except SidecarError as exc:
        checks.append(Check(name, Status.FAIL, str(exc)))
        return None
    checks.append(check)
    return value


def _py_spy(config: Config) -> tuple[Check, SubprocessPySpy]:
    spy = SubprocessPySpy.find(config.sampling.py_spy)
    version = spy.version()
    return Check("py-spy", Status.OK, f"{spy.binary} ({version or 'version unknown'})"), spy


def _target(config: Config) -> tuple[Check, Deployment]:
    target = configured_target(ProcFs(config.target.proc_root), config.target)
    roles = ", ".join(f"{p.pid} {p.role.value}" for p in target.processes)
    return Check("target", Status.OK, f"vLLM deployment {target.root.pid}: {roles}"), target


def _every_server(config: Config, checks: list[Check]) -> Config:
    """`doctor --discover` (no PID, no `targets:`) on a host of several vLLM servers checks
    each, as `run --discover` profiles each there (`targets: [{discover: true}]`)."""
    t = config.target
    if config.targets or t.pid is not None or t.pid_file is not None or not t.discover:
        return config
    try:
        servers = servers_found(ProcFs(t.proc_root))
    except SidecarError:
        return config  # the single target's check says what is wrong
    if len(servers) < 2:
        return config
    every = "`run --discover` profiles each, as `targets: [{discover: true}]` does"
    checks.append(Check("targets", Status.OK, f"{len(servers)} vLLM servers found: {every}"))
    return replace(config, targets=(TargetSpec(discover=True),))


def _fleet(config: Config, spy: SubprocessPySpy | None, checks: list[Check]) -> Deployment | None:
    """With `targets:`: each server found, as its deployment (target, ptrace, metrics); an
    entry that finds none is a WARN (the daemon waits for it), finding none at all a FAIL."""
    found, missing = find_all(ProcFs(config.target.proc_root), config.targets,
                              config.target.any_python)  # fmt: skip
    for line in missing:
        checks.append(Check("target", Status.WARN, line, "start it, or fix its entry in targets:"))
    if not found:
        checks.append(
            Check(
                "target",
                Status.FAIL,
                "no vLLM server of targets: found",
                "start vLLM, or fix targets: (the daemon waits start_timeout_s)",
            )
        )
        checks.append(_ptrace(spy, None))
        return None
    for target, spec in found:
        name = deployment_id(target).name
        roles = ", ".join(f"{p.pid} {p.role.value}" for p in target.processes)
        checks.append(Check(f"target {name}", Status.OK, f"vLLM {target.root.pid}: {roles}"))
        checks.append(_ptrace(spy, target))
        url = spec.metrics_url or config.metrics.url
        checks.append(_metrics(replace(config, metrics=replace(config.metrics, url=url)), target))
    return found[0][0]


def _ptrace(spy: SubprocessPySpy | None, target: Deployment | None) -> Check:
    scope = _read("/proc/sys/kernel/yama/ptrace_scope")
    has_cap = _has_cap(CAP_SYS_PTRACE)
    detail = f"CAP_SYS_PTRACE {'present' if has_cap else 'absent'}, ptrace_scope {scope or 'n/a'}"
    if spy is None or target is None:
        status = Status.OK if has_cap else Status.WARN
        fix = "" if has_cap else PTRACE_HELP.format(pid="<vLLM>")
        return Check("ptrace", status, detail + " (not tried: no target or py-spy)", fix)
    # --nonblocking: the check must not pause the server it is checking.
    code, output = spy.dump(target.root.pid)
    if code == 0:
        return Check("ptrace", Status.OK, detail + f"; py-spy dump of {target.root.pid} works")
    why = explain_failure(target.root.pid, output)
    return Check("ptrace", Status.FAIL, detail, str(why))


def _nvml(config: Config) -> Check:
    reader = open_gpu_reader(config.gpu)
    if reader is None:
        return Check("nvml", Status.OK, "GPU readings disabled (gpu: false)")
    try:
        reading = reader.read()
    finally:
        reader.close()
    if not reading.available:
        return Check("nvml", Status.OK, reading.reason or "no NVIDIA GPU: CPU mode")
    names = ", ".join(f"{d.label} {d.name}" for d in reading.devices)
    unsupported = f"; unsupported: {', '.join(reading.unsupported)}" if reading.unsupported else ""
    return Check("nvml", Status.OK, names + unsupported)


def _metrics(config: Config, target: Deployment) -> Check:
    source = metrics_source_for(target, config.metrics.url, config.metrics.timeout_s)
    scrape = take_scrape(source)
    if scrape.ok and any(name.startswith("vllm:") for name in scrape.samples):
        return Check("metrics", Status.OK, f"{source.url}: {len(scrape.samples)} series")
    return Check("metrics", Status.WARN, f"{source.url}: {scrape.error or 'no vllm: metrics'}",
                 "set metrics.url / --metrics-url to vLLM's OpenAI server /metrics")  # fmt: skip


def _custom(config: Config, target: Deployment | None) -> list[Check]:
    """Each custom metric found in one scrape of its URL (a WARN: a window still runs)."""
    vllm_url = None
    if target is not None and any(s.url is None for s in config.custom_metrics):
        try:
            vllm_url = metrics_source_for(target, config.metrics.url, 1.0).url
        except SidecarError:
            vllm_url = None  # the metrics check says why
    scrapes: dict[str, MetricsScrape] = {}
    checks = []
    for spec in config.custom_metrics:
        url = spec.url or vllm_url
        if url is None:
            why = "on vLLM's /metrics, which has no target to be read from"
            checks.append(Check(f"custom {spec.name}", Status.WARN, why))
            continue
        if url not in scrapes:
            source = HttpMetricsSource(url, config.metrics.timeout_s, vllm=url == vllm_url)
            scrapes[url] = take_scrape(source, vllm=False)
        found, detail = probe(spec, scrapes[url])
        fix = "" if found else "correct custom_metrics' url, metric or labels (see the detail)"
        checks.append(Check(f"custom {spec.name}", Status.OK if found else Status.WARN, detail,
                            fix))  # fmt: skip
    return checks


def _output(config: Config) -> Check:
    """Whether the output folder can be written, without writing or creating anything: a
    folder that is missing is judged by its nearest existing parent, and named as what the
    daemon would create."""
    folder = Path(config.output.dir)
    fix = ("give the sidecar's user write access (systemd: StateDirectory=; Docker: a writable "
           "volume), or set output.dir / --out")  # fmt: skip
    existing = _nearest_existing(folder)
    if existing is None:
        return Check("output", Status.FAIL, f"{folder}: no existing parent folder", fix)
    if not existing.is_dir():
        return Check("output", Status.FAIL, f"{folder}: {existing} is not a folder", fix)
    if not os.access(existing, os.W_OK | os.X_OK):
        return Check("output", Status.FAIL, f"{folder}: {existing} is not writable", fix)
    created = "" if existing == folder else f" (would create {folder} under {existing})"
    free = shutil.disk_usage(existing).free
    need = config.output.min_free_mb * 2**20
    status = Status.OK if free >= need else Status.WARN
    fix = "" if status is Status.OK else "free disk space or lower output.min_free_mb"
    detail = f"{folder}: writable{created}, {free / 2**30:.1f} GiB free"
    return Check("output", status, detail, fix)


def _nearest_existing(folder: Path) -> Path | None:
    """`folder` itself when it exists, else its nearest ancestor that does."""
    for candidate in (folder, *folder.absolute().parents):
        if candidate.exists():
            return candidate
    return None


def _upload(config: Config) -> Check:
    """Credentials in the AWS chain, and the bucket listed (sidecar/store/objectstore.py)."""
    from sidecar.store.objectstore import probe

    found = probe(config.upload)
    return Check("upload", Status.OK if found.ok else Status.FAIL, found.detail, found.fix)


def _has_cap(bit: int) -> bool:
    for line in (_read("/proc/self/status") or "").splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> bit & 1)
    return os.geteuid() == 0


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None
