"""How the offline summarizer honours a requested focus ("Additional focus: ...").

Theory of operation. A model reads the focus and weighs the whole summary by it. An extractive
summarizer cannot reweigh prose, but it can do the honest part: say what was asked, and quote
what the summarized messages say about it, so the focus is visible and backed by the record. I
take the focus's content words (and any path in it), find the sentences, calls and error lines
that mention them, and keep the few that mention the most of them, in conversation order; a
word that many messages share weighs less than a rare one, because it selects little. When
nothing mentions the focus, the summary says so instead of pretending.

These lines belong to one request: a later update drops them (``offline_summary`` reads them as
stale), because the next compaction may have another focus or none.
"""

from __future__ import annotations

import re

from orchestrator._models.offline_evidence import Evidence, sentences, short

FOCUS = "Requested focus: "
ON_FOCUS = "On the focus (verbatim): "
NOT_MENTIONED = " (nothing in the summarized messages mentions it)"
FOCUS_ITEMS = 4
"""At most this many quotations per focus."""

_STOP = frozenset(
    """
    about above after again all also and any are around before being below but can did does
    done each especially every everything for from had has have how into its just keep kept
    let like made make more most much must not now off only other our out over please preserve
    same should some such summary summarize than that the their them then there these they this
    those through too under very was were what when where which while who why will with would
    you your
    aspect aspects bit bits detail details important info information part parts particular
    point points stuff thing things work
    """.split()
)
_SUFFIX = re.compile(r"(?:ing|ed|es|s)$")


def _terms(focus: str) -> list[str]:
    terms: list[str] = []
    for token in re.findall(r"[\w./-]+", focus.lower()):
        token = token.strip("./-")
        if "/" in token or ("." in token and len(token) > 3):
            terms.append(token)  # a path or a file name: matched as it is
        elif len(token) >= 3 and token not in _STOP and not token.isdigit():
            stem = _SUFFIX.sub("", token) if len(token) > 5 else token
            terms.append(stem)
    return list(dict.fromkeys(terms))


def _matches(text: str, terms: list[str]) -> int:
    lowered = text.lower()
    found = 0
    for term in terms:
        if re.search(r"(?<![\w])" + re.escape(term), lowered):
            found += 1
    return found


def _matches_count(term: str, candidates: list[str]) -> int:
    return sum(1 for item in candidates if _matches(item, [term]))


def _same(one: str, other: str) -> bool:
    if one in other or other in one:
        return True
    a, b = set(re.findall(r"\w+", one.lower())), set(re.findall(r"\w+", other.lower()))
    return len(a & b) >= 0.8 * max(len(a), len(b), 1)


def _candidates(facts: Evidence) -> list[str]:
    said = [s for r in facts.requests for s in sentences(r.text)]
    said += [s for reply in facts.replies for s in sentences(reply)]
    said += [c.outcome() if not c.failed() else c.failure() for c in facts.calls if c.settled()]
    said += facts.errors
    return list(dict.fromkeys(short(s) for s in said))


def focus_lines(focus: str, facts: Evidence) -> list[str]:
    """The Critical Context lines for ``focus`` (see the module docstring)."""
    asked = FOCUS + short(focus)
    terms = _terms(focus)
    if not terms:
        return [asked]
    candidates = _candidates(facts)
    # A word the focus shares with many messages ("work", "tests") picks little out, so each
    # word weighs 1/(messages that mention it), and a quotation must score more than half the
    # best one: a rare word the focus names outweighs a common one.
    weights = {t: 1 / n for t in terms if (n := _matches_count(t, candidates))}
    scored = [
        (sum(w for t, w in weights.items() if _matches(item, [t])), index, item)
        for index, item in enumerate(candidates)
    ]
    top = max((s[0] for s in scored), default=0.0)
    best: list[tuple[float, int, str]] = []
    for found in sorted((s for s in scored if s[0] > top / 2), key=lambda s: (-s[0], s[1])):
        # A sentence quoted inside a call's line (or the other way round), or nearly the same
        # as one already quoted ("Checking module 1 ...", "Checking module 2 ..."), adds nothing.
        if len(best) < FOCUS_ITEMS and not any(_same(found[2], b[2]) for b in best):
            best.append(found)
    if not best:
        return [asked + NOT_MENTIONED]
    return [asked, *(ON_FOCUS + item for _, _, item in sorted(best, key=lambda s: s[1]))]
