"""Read pi's ``settings.json`` files into :class:`CompactionSettings` (``--pi-settings``).

The parsing and pi's rules are :mod:`orchestrator._core.pi_settings`; this module only reads
the files and says where pi keeps them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator._core.errors import SessionError
from orchestrator._core.pi_settings import (
    branch_reserve_tokens_of,
    compaction_settings_of,
    merge_pi_settings,
    parse_pi_settings,
)
from orchestrator._core.tokens import CompactionSettings


def pi_settings(*paths: str | os.PathLike[str], model: str | None = None) -> CompactionSettings:
    """The compaction settings of pi's ``settings.json`` files, resolved for ``model``.

    Later files are deep-merged over earlier ones, as pi merges the project's file over the
    user's: pass ``~/.pi/agent/settings.json`` first, then the project's ``.pi/settings.json``
    (:func:`pi_settings_paths` names both). Only the compaction fields are read:
    ``compaction.enabled``, ``compaction.reserveTokens``, ``compaction.keepRecentTokens`` and
    ``compaction.modelOverrides[model]``, each token value resolved as pi does (the model's
    override, then the ordinary value, then pi's default).

    Args:
        *paths: The settings files, in merge order. Every one must exist.
        model: The model in use, ``"provider/modelId"`` as pi keys ``modelOverrides`` (the
            same string as a litellm model name such as ``"anthropic/claude-sonnet-4-5"``).

    Returns:
        ``CompactionSettings`` with ``enabled``, ``reserve_tokens`` and ``keep_recent_tokens``
        from the files; every other field keeps its default.

    Raises:
        SessionError: A file cannot be read, is not a JSON object, or a field pi would read has
            the wrong type; one line naming the file and the field.
    """
    merged: dict[str, Any] = {}
    for path in paths:
        settings = _read(Path(path))
        # Checked file by file, so that the error names the file the bad value is in.
        compaction_settings_of(settings, model=model, source=str(path))
        merged = merge_pi_settings(merged, settings)
    return compaction_settings_of(merged, model=model, source=" + ".join(map(str, paths)))


def pi_branch_reserve_tokens(*paths: str | os.PathLike[str]) -> int:
    """The ``branchSummary.reserveTokens`` of pi's ``settings.json`` files, merged as pi merges.

    The tokens a branch summary keeps free (the abandoned branch is sized to the summarizer's
    window minus these); pi's default, 16384, when no file sets it.

    Args:
        *paths: The settings files, in merge order. Every one must exist.

    Returns:
        The reserve, for ``RuntimeSettings(branch_reserve_tokens=...)``.

    Raises:
        SessionError: A file cannot be read, is not a JSON object, or the field has the wrong
            type; one line naming the file and the field.
    """
    merged: dict[str, Any] = {}
    for path in paths:
        settings = _read(Path(path))
        branch_reserve_tokens_of(settings, source=str(path))
        merged = merge_pi_settings(merged, settings)
    return branch_reserve_tokens_of(merged, source=" + ".join(map(str, paths)))


def pi_settings_paths(
    cwd: str | os.PathLike[str] = ".", environ: Mapping[str, str] | None = None
) -> tuple[Path, Path]:
    """Where pi 1.6 reads its settings: the user's file, then the project's.

    The user's is ``settings.json`` in pi's agent directory (``$PI_CODING_AGENT_DIR``, else
    ``~/.pi/agent``); the project's is ``.pi/settings.json`` under ``cwd``. pi reads the
    project's only once the project is trusted; this function does not know about trust.
    Either file may be missing (pi then reads ``{}``): pass only those that exist.
    """
    env = os.environ if environ is None else environ
    agent_dir = env.get("PI_CODING_AGENT_DIR")
    user = Path(agent_dir).expanduser() if agent_dir else Path.home() / ".pi" / "agent"
    return user / "settings.json", Path(cwd) / ".pi" / "settings.json"


def _read(path: Path) -> dict[str, Any]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise SessionError(f"{path}: cannot read pi settings: {reason}") from None
    return parse_pi_settings(data, str(path))
