"""Prompt templates: Markdown files under ``prompts/`` with ``string.Template`` placeholders.

Theory of operation. Every prompt and context wrapper the library sends lives in a plain file so
that it can be reviewed and diffed like code (decision D13). The code declares, in
:data:`PLACEHOLDERS`, which keys it fills for each template. Loading checks each file against that
table and refuses a file with a placeholder the code never fills (it would fail at the first real
call) or without one the code fills (the value would be silently dropped). Rendering uses
``substitute()``, so a key missing at call time fails loudly too.

Files end with a newline by convention; I strip trailing newlines so that the text is exactly
what the file shows. Lines with trailing spaces are refused: in Markdown two trailing spaces are a
hard line break, an invisible difference no reviewer should have to spot.
"""

from __future__ import annotations

import functools
import string
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from orchestrator._core.errors import DefinitionError
from orchestrator._core.resources import data_dir

PLACEHOLDERS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "summarizer_system": frozenset(),
        "compaction_summary": frozenset(),
        "compaction_update": frozenset(),
        "turn_prefix": frozenset(),
        "short_summary": frozenset(),
        "branch_summary": frozenset(),
        "branch_preamble": frozenset(),
        "auto_continue": frozenset(),
        "compaction_context": frozenset({"summary"}),
        "branch_context": frozenset({"summary"}),
    }
)
"""For each template name, the keys the code fills when it renders it."""


class PromptSet:
    """A loaded, checked set of templates.

    Args:
        directory: Folder holding ``<name>.md`` for every name in ``placeholders``.
        placeholders: The keys the code fills, per template name.

    Raises:
        DefinitionError: a file is missing or unreadable, has an invalid placeholder, a
            placeholder the code does not fill, lacks one the code fills, or has trailing
            whitespace on a line.
    """

    def __init__(
        self, directory: Path, placeholders: Mapping[str, frozenset[str]] = PLACEHOLDERS
    ) -> None:
        self._templates: dict[str, string.Template] = {}
        for name, keys in placeholders.items():
            self._templates[name] = _load(directory / f"{name}.md", keys)

    @property
    def names(self) -> frozenset[str]:
        """The names of the loaded templates."""
        return frozenset(self._templates)

    def render(self, name: str, /, **values: str) -> str:
        """Fill template ``name`` with ``values``.

        Returns:
            The rendered text.

        Raises:
            KeyError: ``name`` is not a known template, or a placeholder has no value.
        """
        return self._templates[name].substitute(values)


def _load(path: Path, keys: frozenset[str]) -> string.Template:
    try:
        text = path.read_text(encoding="utf-8").rstrip("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise DefinitionError(f"prompt {path.name}: cannot read it ({exc})") from exc
    for number, line in enumerate(text.split("\n"), start=1):
        if line != line.rstrip():
            raise DefinitionError(f"prompt {path.name}: line {number} ends with whitespace")
    template = string.Template(text)
    if not template.is_valid():
        raise DefinitionError(f"prompt {path.name}: invalid placeholder (write $$ for a dollar)")
    found = frozenset(template.get_identifiers())
    if extra := sorted(found - keys):
        raise DefinitionError(f"prompt {path.name}: placeholders never filled: {extra}")
    if missing := sorted(keys - found):
        raise DefinitionError(f"prompt {path.name}: missing placeholders: {missing}")
    return template


@functools.cache
def default_prompts() -> PromptSet:
    """The shipped prompts, loaded and checked once.

    Raises:
        DefinitionError: a shipped prompt file is broken.
    """
    return PromptSet(data_dir("prompts"))


def render(name: str, /, **values: str) -> str:
    """Render a shipped template (see :meth:`PromptSet.render`)."""
    return default_prompts().render(name, **values)
