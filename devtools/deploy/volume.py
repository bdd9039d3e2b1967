"""What the sidecar left on its volume, read from the host (the engine's volume folder)."""

from __future__ import annotations

import json
import re
import stat
from collections import Counter
from pathlib import Path
from typing import Any

from sidecar.store.layout import INDEX_NAME, SUMMARY_NAME, SnapshotFolder, snapshot_folder

# The store's temporary names (sidecar/store/atomic.py): `.<name>.tmp-<pid>`, `.<name>.del-<pid>`
TEMPORARY = re.compile(r"^\..+\.(tmp|del)-\d+$")


def snapshots(root: Path) -> list[SnapshotFolder]:
    """Every complete snapshot folder under ROOT (any host or deployment folder), oldest first."""
    found = [snapshot_folder(s.parent) for s in root.rglob(SUMMARY_NAME)] if root.is_dir() else []
    return sorted((f for f in found if f is not None), key=lambda f: (f.started, f.seq))


def summary(folder: SnapshotFolder) -> dict[str, Any]:
    return dict(json.loads((folder.path / SUMMARY_NAME).read_text()))


def index(root: Path) -> dict[str, Any]:
    """The index.json of the host folder under ROOT that has one (the first found)."""
    for path in sorted(root.rglob(INDEX_NAME)):
        return dict(json.loads(path.read_text()))
    return {}


def temporary(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*") if TEMPORARY.match(p.name))


def modes(root: Path) -> dict[str, dict[str, int]]:
    """How many folders and files under ROOT have each permission mode (`0640`: 12, ...)."""
    count: dict[str, Counter[str]] = {"folders": Counter(), "files": Counter(), "other": Counter()}
    for path in root.rglob("*"):
        st = path.lstat()
        kind = ("folders" if stat.S_ISDIR(st.st_mode)
                else "files" if stat.S_ISREG(st.st_mode) else "other")  # fmt: skip
        count[kind][f"{stat.S_IMODE(st.st_mode):04o}"] += 1
    return {kind: dict(sorted(c.items())) for kind, c in count.items()}
