"""`python -m edge_remat_agent` is `edge-remat-agent` (how the daemon restarts itself from source)."""

import sys

from .cli import main

sys.exit(main())
