"""Where the packaged configs are: the checkout's `configs/`, else the copies installed under
`<prefix>/share/vllm-sidecar/configs/` (setup.cfg's data_files: the Docker image, a system
install). One place, so that moving a module cannot silently send a lookup to `share/`."""

from __future__ import annotations

import sys
from pathlib import Path

from sidecar.errors import ConfigError

# sidecar/config/packaged.py -> the checkout's root
CHECKOUT_CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def packaged_config(filename: str) -> Path:
    """The checkout's `configs/FILENAME`, else the copy installed under `share/`."""
    checkout = CHECKOUT_CONFIGS / filename
    if checkout.is_file():
        return checkout
    return Path(sys.prefix) / "share" / "vllm-sidecar" / "configs" / filename


def read_config_text(path: Path, what: str, kind: str, fix: str) -> str:
    """The text of the config file `path` (rules, advice), or a ConfigError: unreadable
    (missing, no permission) naming `what` and `fix`, or not UTF-8 text, not `kind`."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}. {fix}") from exc
    except ValueError as exc:  # UnicodeDecodeError: not a text file
        raise ConfigError(f"{path} is not {kind} ({exc})") from None
