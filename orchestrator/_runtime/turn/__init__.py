"""The turn machine (``machines/turn.toml``) in one process.

``core`` is what both hosts share (counters, facts, payloads, the binding of every effect);
``driver`` runs it on anyio, with the agent's side (``agent_side``) and the compaction side
(``compaction_side``) of its effects; ``replies`` says what a reply means to the table.
"""
