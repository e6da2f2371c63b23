"""Regenerate ``example-session.jsonl``: a realistic pi session for the README and tests.

A coding task with tool calls (read, edit, write, bash), a thinking-level and a model change, an
earlier compaction, an abandoned branch with its branch summary, and labels. Deterministic: run
``python tests/data/make_example_session.py`` and the file comes out byte-identical.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

START_MS = 1_764_669_600_000  # 2025-12-02T10:00:00Z
OUT = Path(__file__).with_name("example-session.jsonl")


class Writer:
    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.n = 0
        self.leaf: str | None = None
        self.calls = 0

    def _iso(self, ms: int) -> str:
        from datetime import UTC, datetime

        d = datetime.fromtimestamp(ms / 1000, tz=UTC)
        return d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{d.microsecond // 1000:03d}Z"

    def entry(self, kind: str, **fields: Any) -> str:
        self.n += 1
        eid = f"{(self.n * 2654435761) % 2**32:08x}"
        ms = START_MS + self.n * 7000
        line = {"type": kind, "id": eid, "parentId": self.leaf, "timestamp": self._iso(ms)}
        line.update(fields)
        self.lines.append(line)
        self.leaf = eid
        return eid

    def ms(self) -> int:
        return START_MS + (self.n + 1) * 7000

    def user(self, text: str) -> str:
        return self.entry(
            "message",
            message={
                "role": "user",
                "content": [{"type": "text", "text": text}],
                "timestamp": self.ms(),
            },
        )

    def assistant(
        self,
        text: str,
        calls: Sequence[tuple[str, dict[str, Any]]] = (),
        total: int = 0,
        stop: str | None = None,
        model: str = "claude-sonnet-4-5",
    ) -> tuple[str, list[str]]:
        content: list[dict[str, Any]] = []
        if text:
            content.append({"type": "text", "text": text})
        ids = []
        for name, args in calls:
            self.calls += 1
            call_id = f"toolu_{self.calls:04d}"
            ids.append(call_id)
            content.append({"type": "toolCall", "id": call_id, "name": name, "arguments": args})
        message = {
            "role": "assistant",
            "content": content,
            "api": "anthropic-messages",
            "provider": "anthropic",
            "model": model,
            "usage": {
                "input": total - 400 if total else 0,
                "output": 400 if total else 0,
                "cacheRead": 0,
                "cacheWrite": 0,
                "totalTokens": total,
                "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0},
            },
            "stopReason": stop or ("toolUse" if calls else "stop"),
            "timestamp": self.ms(),
        }
        return self.entry("message", message=message), ids

    def result(self, call_id: str, name: str, text: str, error: bool = False) -> str:
        return self.entry(
            "message",
            message={
                "role": "toolResult",
                "toolCallId": call_id,
                "toolName": name,
                "content": [{"type": "text", "text": text}],
                "isError": error,
                "timestamp": self.ms(),
            },
        )


def source(name: str, lines: int) -> str:
    body = [
        f'"""{name}: part of the invoice service."""',
        "",
        "from decimal import Decimal, ROUND_HALF_UP",
        "",
    ]
    for i in range(lines):
        body.append(f"def helper_{i}(amount: Decimal, rate: Decimal) -> Decimal:")
        body.append(
            f'    """Apply adjustment {i} to an amount (kept for backwards compatibility)."""'
        )
        body.append(
            f"    return (amount * rate + Decimal('{i}.{i % 10}'))"
            ".quantize(Decimal('0.01'), rounding=ROUND_HALF_UP)"
        )
        body.append("")
    return "\n".join(body)


def build() -> list[dict[str, Any]]:
    w = Writer()
    header = {
        "type": "session",
        "version": 3,
        "id": "7f3c2a9e-5b1d-4c8e-9a2f-1e6d0b4c8a77",
        "timestamp": w._iso(START_MS),
        "cwd": "/home/dev/invoice-service",
    }
    w.entry("model_change", provider="anthropic", modelId="claude-sonnet-4-5")
    w.entry("thinking_level_change", thinkingLevel="medium")
    w.user(
        "The invoice totals are off by a cent on some orders. Find the rounding bug in "
        "invoice/totals.py and fix it. Constraints: we must keep Python 3.9 support, never "
        "change the public function signatures, and always run the test suite before saying "
        "you are done."
    )
    a, ids = w.assistant(
        "I'll start by reading the totals module and its tests.",
        [("read", {"path": "invoice/totals.py"}), ("read", {"path": "tests/test_totals.py"})],
        6200,
    )
    w.result(ids[0], "read", source("invoice/totals.py", 60))
    w.result(ids[1], "read", source("tests/test_totals.py", 30))
    a, ids = w.assistant(
        "The line totals are rounded before summing. Let me run the tests to see the failure.",
        [("bash", {"command": "python -m pytest tests/test_totals.py -q"})],
        14800,
    )
    w.result(
        ids[0],
        "bash",
        "F..\n=== FAILURES ===\nAssertionError: assert Decimal('10.01') == Decimal('10.02')\n"
        "tests/test_totals.py:41: AssertionError\n1 failed, 2 passed in 0.12s",
        error=True,
    )
    a, ids = w.assistant(
        "Confirmed: `assert Decimal('10.01') == Decimal('10.02')`. I'll make the total sum the "
        "unrounded line amounts and round once at the end.",
        [("edit", {"path": "invoice/totals.py", "oldText": "round(line)", "newText": "line"})],
        15900,
    )
    w.result(ids[0], "edit", "Successfully replaced text in invoice/totals.py.")
    checkpoint = w.user(
        "Good. Now also look at invoice/tax.py, I think the VAT calculation has the same problem."
    )
    w.entry("label", targetId=checkpoint, label="tax investigation")
    a, ids = w.assistant("Reading the tax module.", [("read", {"path": "invoice/tax.py"})], 17000)
    w.result(ids[0], "read", source("invoice/tax.py", 80))
    a, ids = w.assistant(
        "Same pattern in `vat_for_lines`. Fixing it and running the full suite.",
        [
            (
                "edit",
                {"path": "invoice/tax.py", "oldText": "sum(round(x)", "newText": "round(sum(x)"},
            ),
            ("bash", {"command": "python -m pytest -q"}),
        ],
        28500,
    )
    w.result(ids[0], "edit", "Successfully replaced text in invoice/tax.py.")
    w.result(
        ids[1], "bash", "....................................................\n52 passed in 1.48s"
    )
    before_compaction, _ = w.assistant(
        "Both fixes are in and the full suite passes (52 tests).", total=29100
    )
    # An earlier compaction: it summarized the first turn and kept from the tax request on.
    w.entry(
        "compaction",
        summary=textwrap.dedent("""\
        ## Goal
        Fix the one-cent rounding bug in invoice totals (invoice/totals.py).

        ## Constraints & Preferences
        - Keep Python 3.9 support
        - Never change public function signatures
        - Always run the test suite before saying done

        ## Progress
        ### Done
        - [x] Found the bug: line totals were rounded before summing (`assert Decimal('10.01') == Decimal('10.02')`)
        - [x] Changed invoice/totals.py to round once at the end

        ### In Progress
        - [ ] Check invoice/tax.py for the same problem

        ## Key Decisions
        - **Round once at the end**: summing rounded lines loses cents

        ## Next Steps
        1. Fix tax.py the same way and run the full suite

        ## Critical Context
        - Failing test: tests/test_totals.py:41

        <read-files>
        tests/test_totals.py
        </read-files>

        <modified-files>
        invoice/totals.py
        </modified-files>"""),  # noqa: E501 (a verbatim summary line)
        firstKeptEntryId=checkpoint,
        tokensBefore=29100,
        details={"readFiles": ["tests/test_totals.py"], "modifiedFiles": ["invoice/totals.py"]},
    )
    after_compaction = w.leaf
    w.user(
        "Now add a regression test for the VAT rounding, "
        "with an order of three lines at 3.335 each."
    )
    a, ids = w.assistant(
        "Adding the regression test.",
        [
            (
                "write",
                {
                    "path": "tests/test_tax_rounding.py",
                    "content": source("tests/test_tax_rounding.py", 8),
                },
            )
        ],
        21000,
    )
    w.result(ids[0], "write", "Wrote 1204 bytes to tests/test_tax_rounding.py.")
    a, ids = w.assistant(
        "Running it.",
        [("bash", {"command": "python -m pytest tests/test_tax_rounding.py -q"})],
        23800,
    )
    w.result(
        ids[0],
        "bash",
        "F\nAssertionError: assert Decimal('10.00') == Decimal('10.01')\n1 failed in 0.05s",
        error=True,
    )
    a, ids = w.assistant(
        "The expectation in my test was wrong: 3 x 3.335 = 10.005, which rounds half-up to 10.01. "
        "I'll try switching the whole module to integer cents instead.",
        [("edit", {"path": "invoice/tax.py", "oldText": "Decimal", "newText": "int"})],
        24500,
    )
    abandoned_leaf = w.result(ids[0], "edit", "Successfully replaced text in invoice/tax.py.")
    # The user went back to just after the compaction and took another route; the abandoned
    # branch (integer cents) was summarized at the new position.
    w.leaf = after_compaction
    w.entry(
        "branch_summary",
        fromId=abandoned_leaf,
        summary=textwrap.dedent("""\
        The user explored a different direction before returning here. Summary of that exploration:

        ## Goal
        Add a VAT rounding regression test.

        ## Progress
        ### Done
        - [x] Wrote tests/test_tax_rounding.py
        ### Blocked
        - Switching invoice/tax.py to integer cents broke the Decimal API

        ## Key Decisions
        - **Abandoned integer cents**: it would change public signatures

        <modified-files>
        invoice/tax.py
        tests/test_tax_rounding.py
        </modified-files>"""),
        details={
            "readFiles": [],
            "modifiedFiles": ["invoice/tax.py", "tests/test_tax_rounding.py"],
        },
    )
    w.entry("model_change", provider="anthropic", modelId="claude-opus-4-1")
    w.user(
        "Keep Decimal. Write the regression test expecting 10.01 "
        "and make sure the whole suite passes. "
        "Please use pytest parametrize for the cases."
    )
    a, ids = w.assistant(
        "Writing a parametrized regression test that expects Decimal('10.01').",
        [
            (
                "write",
                {
                    "path": "tests/test_tax_rounding.py",
                    "content": source("tests/test_tax_rounding.py", 10),
                },
            )
        ],
        26000,
        model="claude-opus-4-1",
    )
    w.result(ids[0], "write", "Wrote 1377 bytes to tests/test_tax_rounding.py.")
    for round_no in range(4):
        a, ids = w.assistant(
            f"Checking module {round_no} of the reporting package for the same rounding pattern.",
            [("read", {"path": f"invoice/reports/report_{round_no}.py"})],
            30000 + round_no * 9000,
            model="claude-opus-4-1",
        )
        w.result(ids[0], "read", source(f"invoice/reports/report_{round_no}.py", 70))
    a, ids = w.assistant(
        "None of the report modules round per line. Running the full suite.",
        [("bash", {"command": "python -m pytest -q"})],
        66000,
        model="claude-opus-4-1",
    )
    w.result(
        ids[0], "bash", "......................................................\n54 passed in 1.52s"
    )
    done, _ = w.assistant(
        "Done: totals and VAT round once at the end, a parametrized regression test covers "
        "3 x 3.335 = 10.01, and all 54 tests pass.",
        total=66900,
        model="claude-opus-4-1",
    )
    w.entry("label", targetId=done, label="fix complete")
    return [header] + w.lines


def main() -> None:
    lines = build()
    OUT.write_text(
        "".join(
            json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n" for line in lines
        )
    )
    print(f"wrote {OUT} ({len(lines)} lines)")


if __name__ == "__main__":
    main()
