"""The turn machine on Temporal.

``flow`` steps the table inside the session workflow; ``activities`` runs the agent and appends
its messages on a worker.
"""
