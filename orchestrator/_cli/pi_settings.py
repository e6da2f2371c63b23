"""``--pi-settings FILE``: compaction settings from pi's ``settings.json``, options first.

The commands that take compaction settings (``compact``, ``plan``, ``serve``, ``worker``,
``tui``) read ``compaction.enabled``, ``compaction.reserveTokens``, ``compaction.keepRecentTokens``
and the ``compaction.modelOverrides`` entry of the model in use from the files named, merged
in order as pi merges its user and project files; those that summarize branches (``navigate``,
``tui``, ``serve``, ``worker``) also read ``branchSummary.reserveTokens``. An option given on the
command line wins over the files; the files win over the options' defaults. To tell the two
apart, the options record that they were given (:class:`Explicit`), since argparse cannot say
whether a value is its default or was typed.

``--pi-settings`` always takes a path. With an optional path, ``compact --pi-settings S``
would read the session as the settings file; pi's own locations are one option each away
(``--pi-settings ~/.pi/agent/settings.json --pi-settings .pi/settings.json``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator._core.context import ContextBuilder, ModelRef
from orchestrator._core.entries import Entry
from orchestrator._core.tokens import CompactionSettings

EXPLICIT = "explicit_options"
"""The namespace attribute listing the ``dest`` of each option given on the command line."""

# The options a settings file fills in when they are not given (each dest is also the name of
# the CompactionSettings field it sets).
_FILLED = ("reserve_tokens", "keep_recent_tokens")


class Explicit(argparse.Action):
    """``store``, and note in :data:`EXPLICIT` that the option was given."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        """Store ``values`` and record the option's ``dest``."""
        setattr(namespace, self.dest, values)
        setattr(namespace, EXPLICIT, {*getattr(namespace, EXPLICIT, ()), self.dest})


def add_pi_settings_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--pi-settings FILE`` (repeatable; later files merge over earlier ones)."""
    parser.add_argument(
        "--pi-settings",
        action="append",
        metavar="FILE",
        help="read compaction settings from pi's settings.json (repeat to merge the user's "
        "file, then the project's, as pi does); options given here win",
    )


def given(args: argparse.Namespace, dest: str) -> bool:
    """Whether the option stored in ``dest`` was given on the command line."""
    return dest in getattr(args, EXPLICIT, ())


def pi_compaction(args: argparse.Namespace, model: str | None) -> CompactionSettings | None:
    """The compaction settings of ``--pi-settings`` for ``model``; ``None`` without the option.

    Raises:
        SessionError: A file cannot be read or holds a field of the wrong type (exit 1).
    """
    paths = getattr(args, "pi_settings", None)
    if not paths:
        return None
    from orchestrator._store.pi_settings_files import pi_settings

    return pi_settings(*paths, model=model)


def with_pi_settings(args: argparse.Namespace, model: str | None) -> argparse.Namespace:
    """``args`` with the compaction options not given taken from ``--pi-settings``.

    Without ``--pi-settings``, ``args`` itself. Otherwise a copy in which ``reserve_tokens``
    and ``keep_recent_tokens`` come from the files unless given, and ``compaction_enabled`` is
    ``compaction.enabled``. Only for commands whose ``--reserve-tokens`` is the compaction's
    (``tui``'s is the branch summary's: it uses :func:`pi_compaction`).

    Raises:
        SessionError: A file cannot be read or holds a field of the wrong type (exit 1).
    """
    settings = pi_compaction(args, model)
    if settings is None:
        return args
    values = vars(args).copy()
    for dest in _FILLED:
        if dest in values and not given(args, dest):
            values[dest] = getattr(settings, dest)
    values["compaction_enabled"] = settings.enabled
    values["branch_reserve_tokens"] = pi_branch_reserve(args)
    return argparse.Namespace(**values)


def pi_branch_reserve(args: argparse.Namespace) -> int | None:
    """``branchSummary.reserveTokens`` of ``--pi-settings``; ``None`` without the option.

    Raises:
        SessionError: A file cannot be read or holds a field of the wrong type (exit 1).
    """
    paths = getattr(args, "pi_settings", None)
    if not paths:
        return None
    from orchestrator._store.pi_settings_files import pi_branch_reserve_tokens

    return pi_branch_reserve_tokens(*paths)


def branch_reserve(args: argparse.Namespace) -> int:
    """The branch summary's reserve of a command whose ``--reserve-tokens`` is the branch's.

    The option when given, else ``branchSummary.reserveTokens`` of ``--pi-settings``, else the
    option's default.

    Raises:
        SessionError: A settings file cannot be read or holds a field of the wrong type (exit 1).
    """
    if given(args, "reserve_tokens"):
        return int(args.reserve_tokens)
    from_file = pi_branch_reserve(args)
    return int(args.reserve_tokens) if from_file is None else from_file


def compaction_enabled(args: argparse.Namespace) -> bool:
    """``compaction.enabled`` from ``--pi-settings`` (true without one)."""
    return bool(getattr(args, "compaction_enabled", CompactionSettings().enabled))


def session_model(path: Sequence[Entry]) -> str | None:
    """The ``provider/modelId`` of the model a session's path selects (pi's overrides key).

    The path's last ``model_change`` or assistant message, as pi resolves ``modelOverrides``
    for the session's model.
    """
    return model_key(ContextBuilder(path).context().model)


def model_key(model: ModelRef | None) -> str | None:
    """A model as ``modelOverrides`` names it (``provider/modelId``)."""
    return f"{model.provider}/{model.model_id}" if model else None


def model_in_use(args: argparse.Namespace, session_path: str) -> str | None:
    """The model whose ``modelOverrides`` apply to a command that compacts ``session_path``.

    The first ``--model`` (it summarizes); without one, the session's own model, as pi compacts
    with the session's model. The file is read for it only when ``--pi-settings`` is given.

    Raises:
        SessionError: The session cannot be read.
    """
    model = first_model(args)
    if model is not None or not getattr(args, "pi_settings", None):
        return model
    if not Path(session_path).is_file():
        return None  # the command refuses the path itself, with its usual message
    from orchestrator._store.session import Session

    session = Session.open(Path(session_path))
    leaf = session.leaf_id
    return session_model(session.path(leaf) if leaf else [])


def first_model(args: argparse.Namespace) -> str | None:
    """The model in use for ``modelOverrides``: the first ``--model``, if any."""
    models = getattr(args, "model", None)
    return models[0] if models else None
