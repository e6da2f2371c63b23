"""``python -m orchestrator`` runs the command line."""

from orchestrator._cli.main import run

run()
