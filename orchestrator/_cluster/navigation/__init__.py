"""The navigation machine on Temporal.

``flow`` steps the table inside the session workflow; ``activities`` (the tree's reads and
writes, and forks) run on a worker.
"""
