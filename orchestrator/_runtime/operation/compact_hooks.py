"""What pi's compaction hooks are told: ``reason``, ``willRetry`` and how a compaction failed.

Pure functions both hosts share (the one-process operation driver and the Temporal workflow), so
that ``session_before_compact``, ``session_compact`` and ``session_compact_failed`` carry the same
fields on each. The fields are pi 1.x's (docs/extensions.md, and ``_runAutoCompaction`` /
``compact`` in agent-session.js):

* ``reason``: ``manual``, ``threshold`` or ``overflow``, the operation's own.
* ``willRetry``: the interrupted turn is retried after this compaction. Here an automatic
  compaction for an overflow always is (the turn table's ``start_overflow_compaction``, D18), so
  it follows from the reason; a threshold or manual compaction never is.
* ``session_compact_failed``: ``{reason, errorMessage?, aborted, willRetry, fromExtension}``.
  Pi's code passes ``willRetry: false`` on every failure (its docs say "whether the aborted turn
  would have retried"); I follow the code, which is what an extension receives. ``errorMessage``
  is absent for an abort, and worded by the reason as pi words it.

Which ending this is, is the operation table's decision (its final state); these only word it.
"""

from __future__ import annotations

from typing import Any

from orchestrator._lifecycle.names import OperationState
from orchestrator._runtime.turn.replies import OVERFLOW_FAILED

_FAILED = {
    "manual": "Compaction failed",
    "overflow": "Context overflow recovery failed",
    "threshold": "Auto-compaction failed",
}


def retries_after(reason: str) -> bool:
    """Whether the turn is retried after a compaction for ``reason`` (pi's ``willRetry``)."""
    return reason == "overflow"


def compact_failed(
    *,
    reason: str,
    status: str,
    error: str | None,
    skipped: str | None,
    from_extension: bool,
) -> dict[str, Any] | None:
    """The ``session_compact_failed`` payload for a compaction that ended in ``status``.

    Args:
        reason: ``manual``, ``threshold`` or ``overflow``.
        status: The operation's final state.
        error: Its failure, as one line (``failed``, ``conflict``).
        skipped: Why there was nothing to compact (``skipped``).
        from_extension: A ``session_before_compact`` hook had supplied the compaction.

    Returns:
        The payload (without ``type``), or ``None`` when pi emits none: a committed compaction,
        and an automatic one with nothing to compact (pi returns before starting it; a manual
        one throws "Nothing to compact ...", which pi reports as a failure).
    """
    payload: dict[str, Any] = {"reason": reason}
    if status in (OperationState.FAILED, OperationState.CONFLICT):
        payload["errorMessage"] = f"{_FAILED.get(reason, 'Compaction failed')}: {error or status}"
        aborted = False
    elif status == OperationState.CANCELLED:
        aborted = True
    elif status == OperationState.SKIPPED and reason == "manual":
        payload["errorMessage"] = f"Compaction failed: {skipped or 'Nothing to compact'}"
        aborted = False
    else:
        return None
    payload.update(aborted=aborted, willRetry=False, fromExtension=from_extension)
    return payload


def overflow_failed_payload() -> dict[str, Any]:
    """``session_compact_failed`` when overflow recovery gives up after its one attempt (D18).

    No compaction ran: pi reports the turn's second overflow to its extensions this way.
    """
    return {
        "reason": "overflow",
        "errorMessage": OVERFLOW_FAILED,
        "aborted": False,
        "willRetry": False,
        "fromExtension": False,
    }
