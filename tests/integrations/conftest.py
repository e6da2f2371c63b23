"""Keep the opt-in pi extension tests out of the default run (see test_pi_extension.py).

Without ``ORCHESTRATOR_PI_E2E=1`` the module is not even collected, so the default run shows no
skips for it; the module's own ``skipif`` covers running the file by path.
"""

from __future__ import annotations

import os

collect_ignore_glob = [] if os.environ.get("ORCHESTRATOR_PI_E2E") == "1" else ["test_*.py"]
