"""Which daemon `vllm-sidecar run` starts: one server's (loop.py) or every server's
(multi_target.py). Issue 23, item 5: `run --discover` on a host of two servers waited for ever.

`targets:` in the config file starts the fleet daemon, as always; `--pid` or `--pid-file` the
single one. `run --discover` (the default target) looks at the host once, at start:

- several vLLM servers (those discovery chooses between: `discovery.servers_found`) start the
  fleet daemon over `targets: [{discover: true}]`: every server its own deployment,
  OUT/<host>/<model@port>/, in the windows mode, taken in turn; a server that starts later is
  profiled too, one that stops is marked down (multi_target.py);
- one server, or none yet, starts the single daemon, exactly as before: OUT/<host>/, its
  sampling mode, its exporter series. When its wait at start ends on several servers at once
  (the sidecar started first), it hands over to the fleet (`SeveralServers`).

The output folder speaks first, because the readers take OUT/<host>/ either as one host folder
or as a folder of deployment folders, never both (store/layout.py: deployment folders beside a
host folder's own snapshots are not listed, and are read as that host's):

- OUT/<host>/ holds deployment folders (a fleet wrote it): the fleet, whatever the count, so
  that a restart while one of two servers is down goes on writing where it wrote;
- OUT/<host>/ holds one server's snapshots (a single daemon wrote it): the single daemon,
  whatever the count. Several servers are then `discovery_ambiguous` as before, and the message
  says how to profile them all (`one_server_hint`: move those snapshots into the folder of the
  server they are of, which is where the fleet continues them).

A daemon never switches while it runs: once one server is attached, a server that appears
beside it is said in the log (after two windows, so that a redeploy's overlap is not), not
profiled.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

from sidecar.config.settings import Config
from sidecar.config.targets import TargetSpec
from sidecar.daemon.host_folder import DISCOVER_ALL, Layout, layout_of, one_server_hint
from sidecar.daemon.loop import Daemon, Discovered, SeveralServers
from sidecar.daemon.multi_target import MultiTargetDaemon
from sidecar.errors import ConfigError
from sidecar.records.window import SamplingMode
from sidecar.store.layout import OutputTree
from sidecar.target.discovery import Deployment, describe_server, servers_found
from sidecar.target.procfs import ProcFs

log = logging.getLogger("vllm_sidecar")
EVERY_SERVER = (TargetSpec(discover=True),)  # `targets: [{discover: true}]`


class Kind(Enum):
    SINGLE = "single"  # loop.Daemon
    FLEET = "fleet"  # multi_target.MultiTargetDaemon


@dataclass(frozen=True, slots=True)
class Choice:
    """The daemon to start, over which config, and why (for the log)."""

    kind: Kind
    config: Config
    why: str = ""
    hand_over: bool = False  # the single daemon: several servers at its start start the fleet


def discovery_names_the_target(config: Config) -> bool:
    """`run --discover`: no `targets:`, no PID or pid file, discovery on."""
    t = config.target
    return not config.targets and t.pid is None and t.pid_file is None and t.discover


def host_dir(config: Config) -> Path:
    return Path(config.output.dir) / socket.gethostname()


def choose(config: Config, procfs: ProcFs | None = None, folder: Path | None = None) -> Choice:
    """The daemon `run` starts for `config`, from the servers under its /proc root (`procfs`)
    and what its output folder (`folder`, OUT/<host>/) holds."""
    if config.targets:
        return Choice(Kind.FLEET, config, "targets: in the config file")
    if not discovery_names_the_target(config):
        return Choice(Kind.SINGLE, config)
    folder = host_dir(config) if folder is None else folder
    layout = layout_of(folder)
    if layout is Layout.DEPLOYMENTS:
        names = ", ".join(OutputTree(folder).deployments())
        return _fleet(config, f"{folder} holds a folder per vLLM server ({names})")
    if layout is Layout.ONE_SERVER:
        return Choice(Kind.SINGLE, config, f"{folder} holds one server's snapshots")
    servers = servers_found(procfs or ProcFs(config.target.proc_root))
    if len(servers) > 1:
        return _fleet(config, f"found {len(servers)} vLLM servers: {_listing(servers)}")
    return Choice(Kind.SINGLE, config, hand_over=True)


def fleet_config(config: Config, why: str) -> Config:
    """`config` with `targets: [{discover: true}]`; a --metrics-url, which names one server's
    /metrics, is refused (exit 2) with the fix."""
    if config.metrics.url is not None:
        raise ConfigError(
            f"{why}, and --metrics-url (metrics.url, {config.origin('metrics.url')}) names one "
            "server's /metrics: leave it out to profile them all (each server's URL comes from "
            "its --port), or pick one server with --pid PID"
        )
    return replace(config, targets=EVERY_SERVER)


def _fleet(config: Config, why: str) -> Choice:
    return Choice(Kind.FLEET, fleet_config(config, why), why)


def _listing(servers: list[Deployment]) -> str:
    return "; ".join(describe_server(d) for d in servers)


def start_daemon(
    config: Config, config_path: Path | None, flags: Mapping[str, Any], procfs: ProcFs | None = None
) -> int:
    """Start the daemon `choose` picks, as a process (signals, exporter, until stopped)."""
    choice = choose(config, procfs)
    if choice.kind is Kind.FLEET and config.targets:
        return MultiTargetDaemon(config, config_path=config_path, flags=flags).run()
    if choice.kind is Kind.FLEET:
        return _every_server(choice, config_path, flags)
    if not discovery_names_the_target(config):
        return Daemon(config, config_path=config_path, flags=flags).run()
    folder = host_dir(config)
    discovered = Discovered(choice.hand_over, lambda name: one_server_hint(folder, name))
    try:
        return Daemon(config, config_path=config_path, flags=flags, discovered=discovered).run()
    except SeveralServers as exc:  # at its start: nothing written, nothing attached
        why = str(exc)
        return _every_server(_fleet(config, why), config_path, flags)


def _every_server(choice: Choice, config_path: Path | None, flags: Mapping[str, Any]) -> int:
    """`run --discover` as the fleet daemon over `targets: [{discover: true}]`."""
    c = choice.config
    mode = ""
    if c.sampling.mode == SamplingMode.CONTINUOUS:
        mode = " (the windows mode: continuous sampling follows one server)"
    log.info("%s: profiling every vLLM server, each as its own deployment in OUT/<host>/"
             "<model@port>/, as %s does; a %g s window of each every %g s, taken in turn%s",
             choice.why, DISCOVER_ALL, c.schedule.window_s, c.schedule.interval_s,
             mode)  # fmt: skip
    # A reload (SIGHUP) reads the file again: the fleet's targets are its defaults, so that it
    # stays the fleet it is (a `targets:` the file gains replaces them, as in any fleet).
    defaults = replace(Config(), targets=c.targets)
    return MultiTargetDaemon(c, config_path=config_path, flags=flags, defaults=defaults).run()
