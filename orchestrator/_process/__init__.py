"""What a long-running process (``serve``, ``worker``) sets up for itself, apart from sessions.

The garbage-collection policy of a process holding many sessions (:mod:`.gc_policy`), the
signals that stop it (:mod:`.signals`) and what it loads before its first request
(:mod:`.preload`). None of it is about a session or a machine, so none of it lives beside the
drivers in :mod:`orchestrator._runtime`.
"""
