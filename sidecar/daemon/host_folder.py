"""What a daemon's host folder, OUT/<host>/, holds, as `run` chooses its daemon (choice.py).

The readers take OUT/<host>/ either as one host folder (a single-target daemon's snapshots,
index and trend table in it) or as a folder of deployment folders (a fleet daemon's,
OUT/<host>/<model@port>/), never both: once it holds an index.json or a snapshot of its own,
they list none of the deployment folders in it and read their snapshots as that host's
(store/layout.py, `OutputTree`). So a daemon keeps the layout it finds.
"""

from __future__ import annotations

import json
import logging
from enum import Enum
from pathlib import Path

from sidecar.store.layout import (
    INDEX_NAME,
    TABLE_NAME,
    OutputTree,
    snapshot_names,
    summary_deployment,
)

log = logging.getLogger("vllm_sidecar")
DISCOVER_ALL = "`targets: [{discover: true}]`"


class Layout(Enum):
    """What OUT/<host>/ holds."""

    NOTHING = "nothing"  # nothing a daemon wrote there (an index listing nothing counts so)
    ONE_SERVER = "one server"  # a single-target daemon's snapshots: a host folder
    DEPLOYMENTS = "deployments"  # a fleet's folders, one per server


def layout_of(folder: Path) -> Layout:
    """What `folder` (OUT/<host>/) holds: its own snapshots, deployment folders, or nothing."""
    if not folder.is_dir():
        return Layout.NOTHING
    if snapshot_names(folder) or (folder / TABLE_NAME).is_file() or not empty_index(folder):
        return Layout.ONE_SERVER
    return Layout.DEPLOYMENTS if OutputTree(folder).deployments() else Layout.NOTHING


def empty_index(folder: Path) -> bool:
    """Whether `folder`'s index.json, if any, is a host's that lists no folder and no gap:
    what a single daemon leaves that waited at start and found no server (or handed over).
    Unreadable is not empty: the store says what is wrong with it."""
    try:
        doc = json.loads((folder / INDEX_NAME).read_text())
    except FileNotFoundError:
        return True
    except (OSError, ValueError):
        return False
    return (
        isinstance(doc, dict)
        and not doc.get("deployment")
        and not any(doc.get(key) for key in ("folders", "gaps", "latest", "latest_baseline"))
    )


def take_for_deployments(folder: Path) -> None:
    """Before a fleet daemon writes its deployment folders in `folder`: an index there that
    lists nothing is removed (it would hide them from the readers); one server's snapshots
    there are said, with what to do (the readers would not list the deployments)."""
    if layout_of(folder) is not Layout.ONE_SERVER:
        if (folder / INDEX_NAME).is_file() and empty_index(folder):
            (folder / INDEX_NAME).unlink(missing_ok=True)
        return
    log.warning("%s holds a single-target daemon's snapshots: the readers take it as one host "
                "and list none of the deployment folders this daemon writes in it (point them "
                "at %s/<model@port>/); move those snapshots into the folder of the server they "
                "are of to read them all", folder, folder)  # fmt: skip


def one_server_hint(folder: Path, profiled: str | None = None) -> str:
    """What the single daemon of `run --discover` says of several servers: `folder` holds one
    server's snapshots (`profiled`'s; None: the newest snapshot's), which keep it to one, and
    how to profile them all."""
    name = profiled or _latest_deployment(folder) or "<model@port>"
    return (
        f"{folder} holds one server's snapshots ({name}), so this daemon profiles one server. "
        f"To profile every server, each in a folder of its own ({folder}/<model@port>/, as "
        f"{DISCOVER_ALL} does): stop it, move everything in {folder} into {folder}/{name}/ "
        "(where that server's snapshots go on) or give another --out, and start it again. "
        "Or pick one with --pid PID"
    )


def _latest_deployment(folder: Path) -> str | None:
    latest = OutputTree(folder).latest() if folder.is_dir() else None
    return summary_deployment(latest.path) if latest is not None else None
