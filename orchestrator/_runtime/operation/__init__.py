"""The operation machine (``machines/operation.toml``) in one process.

Compactions, branch summaries and prunes. ``driver`` is the one driver both hosts share; ``run``
performs its I/O effects on anyio (the effects by phase in ``ask_effects`` and
``commit_effects``); ``runner`` starts operations; the rest is what they plan
(``jobs``), ask the models (``summarize``, ``retry``, ``routes``), tell the hooks
(``compact_hooks``) and run for a session pi owns (``hosted``).
"""
