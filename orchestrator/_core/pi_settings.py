"""pi's compaction settings (``settings.json``) read as :class:`CompactionSettings`.

Theory of operation. pi 1.6 keeps its settings in JSON files: the user's
(``~/.pi/agent/settings.json``, or ``$PI_CODING_AGENT_DIR/settings.json``) and the project's
(``.pi/settings.json`` under the working directory), the project's deep-merged over the user's
(``settings-manager.js``: nested objects merge key by key, anything else replaces). Compaction
reads four fields of the merged object, resolved for the model in use (``getCompactionSettings``):

* ``compaction.enabled``: ``enabled`` (default true);
* ``compaction.reserveTokens`` and ``compaction.keepRecentTokens``: each resolves on its own
  through ``compaction.modelOverrides["provider/modelId"]`` of the model in use, then the
  ordinary setting, then pi's default (16384 and 20000).

Branch summaries read one more field, with no per-model override (``getBranchSummarySettings``):
``branchSummary.reserveTokens`` (default 16384), the tokens kept free when pi sizes the abandoned
branch for its summary (``contextWindow - reserveTokens``).

pi checks a token value only when it reads it, and only the override of the model in use; an
override of another model may be anything. I check the same values pi checks, with pi's rule
(a "non-negative safe integer": a JSON number that is a whole number from 0 to 2^53 - 1), so a
file pi accepts is accepted here. Where pi reads a value of the wrong type without a word
(``"enabled": "false"``, which JavaScript counts as true; a ``compaction`` or
``modelOverrides`` that is not an object) I refuse it, naming the field, rather than guess what
the user meant: the published schema says what the type is.

Everything here is pure: bytes in, records out. Reading the files is
:mod:`orchestrator._store.pi_settings_files`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from orchestrator._core.errors import SessionError
from orchestrator._core.tokens import CompactionSettings

LARGEST_SAFE_INTEGER = 2**53 - 1
"""JavaScript's ``Number.MAX_SAFE_INTEGER``: the largest token value pi accepts."""

_DEFAULTS = CompactionSettings()
_BOM = "\ufeff"


def parse_pi_settings(data: bytes, source: str) -> dict[str, Any]:
    """A settings file's bytes as the object pi reads (an empty file is ``{}``, as in pi).

    Args:
        data: The file's bytes.
        source: What to name in an error (the file's path).

    Raises:
        SessionError: Not UTF-8, not JSON as JavaScript reads it, or not an object.
    """
    try:
        text = data.decode("utf-8").removeprefix(_BOM)  # pi strips a byte order mark
    except UnicodeDecodeError:
        raise SessionError(f"{source}: pi settings are not UTF-8 text") from None
    if not text:
        return {}
    try:
        settings = json.loads(text, parse_constant=_refuse_constant)
    except ValueError as exc:  # json.JSONDecodeError, and NaN/Infinity, which JSON.parse rejects
        raise SessionError(f"{source}: pi settings are not valid JSON ({exc})") from None
    if not isinstance(settings, dict):
        raise SessionError(f"{source}: pi settings must be a JSON object, not {_kind(settings)}")
    return settings


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def merge_pi_settings(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``overrides`` over ``base`` as pi's ``deepMergeObjects`` does: objects key by key."""
    merged = dict(base)
    for key, value in overrides.items():
        below = merged.get(key)
        if isinstance(below, dict) and isinstance(value, dict):
            merged[key] = merge_pi_settings(below, value)
        else:
            merged[key] = value
    return merged


def compaction_settings_of(
    settings: Mapping[str, Any], *, model: str | None = None, source: str = "pi settings"
) -> CompactionSettings:
    """The compaction settings pi resolves from ``settings`` for ``model``.

    Args:
        settings: A parsed (and possibly merged) settings object.
        model: The model in use as ``"provider/modelId"`` (pi's key for ``modelOverrides``);
            ``None``: no override applies.
        source: What to name in an error (the file's path).

    Returns:
        ``enabled``, ``reserve_tokens`` and ``keep_recent_tokens`` from the settings; every
        other field keeps its default.

    Raises:
        SessionError: A field pi would read has the wrong type or value; the message names the
            source and the field.
    """
    compaction = settings.get("compaction")
    if compaction is None:  # absent, or null: pi's settings.compaction?.field
        compaction = {}
    if not isinstance(compaction, dict):
        raise _wrong(source, "compaction", compaction, "an object")
    enabled = compaction.get("enabled")
    if enabled is None:  # pi: enabled ?? true
        enabled = True
    if not isinstance(enabled, bool):
        raise _wrong(source, "compaction.enabled", enabled, "true or false")
    override = _override(compaction, model, source)
    reserve = _token_setting("reserveTokens", compaction, override, model, source)
    keep = _token_setting("keepRecentTokens", compaction, override, model, source)
    return CompactionSettings(
        enabled=enabled,
        # 0 is a value pi accepts, so "not set" is None, never a falsy test.
        reserve_tokens=_DEFAULTS.reserve_tokens if reserve is None else reserve,
        keep_recent_tokens=_DEFAULTS.keep_recent_tokens if keep is None else keep,
    )


BRANCH_RESERVE_TOKENS = 16384
"""pi's ``branchSummary.reserveTokens`` default."""


def branch_reserve_tokens_of(settings: Mapping[str, Any], *, source: str = "pi settings") -> int:
    """The ``branchSummary.reserveTokens`` of pi ``settings``: what a branch summary keeps free.

    Raises:
        SessionError: ``branchSummary`` is not an object, or the value is not a whole number of
            tokens; the message names the source and the field.
    """
    branch = settings.get("branchSummary")
    if branch is None:  # pi: settings.branchSummary?.reserveTokens ?? 16384
        return BRANCH_RESERVE_TOKENS
    if not isinstance(branch, dict):
        raise _wrong(source, "branchSummary", branch, "an object")
    value = branch.get("reserveTokens")
    if value is None:
        return BRANCH_RESERVE_TOKENS
    return _token_value(value, source, "branchSummary.reserveTokens")


def _token_setting(
    field: str,
    compaction: dict[str, Any],
    override: dict[str, Any],
    model: str | None,
    source: str,
) -> int | None:
    """The model's override, else the ordinary value, else ``None`` (pi's default applies)."""
    # As pi: the ordinary value is checked even when the model's override replaces it.
    ordinary = None
    if field in compaction:
        ordinary = _token_value(compaction[field], source, f"compaction.{field}")
    if field in override:
        return _token_value(override[field], source, f"{_override_name(model)}.{field}")
    return ordinary


def _override(compaction: dict[str, Any], model: str | None, source: str) -> dict[str, Any]:
    overrides = compaction.get("modelOverrides")
    if overrides is None:
        overrides = {}
    if not isinstance(overrides, dict):
        raise _wrong(source, "compaction.modelOverrides", overrides, "an object")
    if model is None or model not in overrides:
        return {}
    override = overrides[model]
    if not isinstance(override, dict):
        raise _wrong(source, _override_name(model), override, "an object")
    return override


def _override_name(model: str | None) -> str:
    return f"compaction.modelOverrides[{json.dumps(model)}]"


def _token_value(value: object, source: str, name: str) -> int:
    # pi's Number.isSafeInteger(value) && value >= 0: a float such as 2e4 is the integer 20000.
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    if number is None or not 0 <= number <= LARGEST_SAFE_INTEGER:
        raise _wrong(source, name, value, "a whole number of tokens from 0 to 2^53 - 1")
    return number


def _wrong(source: str, field: str, value: object, expected: str) -> SessionError:
    shown = json.dumps(value)
    if len(shown) > 40:
        shown = _kind(value)
    return SessionError(f"{source}: {field} must be {expected}, not {shown}")


def _kind(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    return "a number" if not isinstance(value, bool) else "a boolean"
