"""Where the packaged configs are: the checkout's `configs/`, else the copies installed under
`<prefix>/share/vllm-sidecar/configs/` (setup.cfg's data_files: the Docker image, a system
install). One place, so that moving a module cannot silently send a lookup to `share/`."""

from __future__ import annotations

import sys
from pathlib import Path

# sidecar/config/packaged.py -> the checkout's root
CHECKOUT_CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def packaged_config(filename: str) -> Path:
    """The checkout's `configs/FILENAME`, else the copy installed under `share/`."""
    checkout = CHECKOUT_CONFIGS / filename
    if checkout.is_file():
        return checkout
    return Path(sys.prefix) / "share" / "vllm-sidecar" / "configs" / filename
