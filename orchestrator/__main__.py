"""``python -m orchestrator`` runs the command line."""

import sys

from orchestrator._cli.main import main

sys.exit(main())
