"""The operation machine on Temporal.

``flow`` steps the table inside the session workflow; ``activities`` performs its effects on a
worker (and gathers every activity a worker offers).
"""
