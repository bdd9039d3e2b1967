"""`make schema`: write configs/summary.schema.json from the typed records (the published
contract of summary.json). tests/unit/records/test_summary_contract.py fails when it is stale."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sidecar.store.summary_io import summary_json_schema

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "configs" / "summary.schema.json"


def render() -> str:
    return json.dumps(summary_json_schema(), indent=2, sort_keys=True) + "\n"


def main() -> int:
    SCHEMA_PATH.write_text(render())
    print(f"wrote {SCHEMA_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
