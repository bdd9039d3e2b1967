"""The installed size of the core package and of each extra, as the README's install section
states them: a wheel built from this checkout, installed into fresh venvs (pip's byte-compiling
included, as an operator's pip does), each measured against a bare venv.

    python -m devtools.install_sizes [--json-out FILE]

It takes about a minute with pip's cache warm (pip fetches from the index otherwise)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sidecar.extras import EXTRAS

ROOT = Path(__file__).resolve().parents[1]


def tree_bytes(folder: Path) -> int:
    total = 0
    for base, _, files in os.walk(folder):
        for name in files:
            path = Path(base, name)
            if not path.is_symlink():
                total += path.stat().st_size
    return total


def installed(wheel: Path, spec: str, work: Path) -> tuple[int, float]:
    """The venv's size in bytes with SPEC installed, and pip's wall time."""
    venv = work / ("venv" + spec.replace("[", "_").replace("]", "").replace(",", "_"))
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    started = time.monotonic()
    target = str(wheel) + spec
    done = subprocess.run([str(venv / "bin/pip"), "install", "-q", "--disable-pip-version-check",
                           target], capture_output=True, text=True)  # fmt: skip
    if done.returncode:
        raise SystemExit(f"pip install {target} failed:\n{done.stderr}")
    return tree_bytes(venv), time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="install-sizes-") as tmp:
        work = Path(tmp)
        subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(work / "dist"),
                        str(ROOT)], check=True, capture_output=True)  # fmt: skip
        (wheel,) = (work / "dist").glob("*.whl")
        subprocess.run([sys.executable, "-m", "venv", str(work / "bare")], check=True)
        bare = tree_bytes(work / "bare")
        specs = ["", *(f"[{e.name}]" for e in EXTRAS), f"[{','.join(e.name for e in EXTRAS)}]"]
        rows = {}
        for spec in specs:
            size, took = installed(wheel, spec, work)
            rows[spec or "core"] = {"mb": round((size - bare) / 1e6, 1), "pip_s": round(took, 1)}
            print(f"{'vllm-sidecar' + spec:45} {rows[spec or 'core']['mb']:8.1f} MB "
                  f"(pip install {took:.1f} s)", flush=True)  # fmt: skip
    core = rows["core"]["mb"]
    for name, row in rows.items():
        if name != "core":
            row["added_mb"] = round(row["mb"] - core, 1)
    if args.json_out:
        args.json_out.write_text(json.dumps({"python": sys.version.split()[0], "sizes": rows},
                                            indent=2) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
