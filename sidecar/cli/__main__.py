"""`python -m sidecar.cli`: the console script without its installed entry point."""

import sys

from sidecar.cli import main

sys.exit(main())
