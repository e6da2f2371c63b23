"""A branch summary whose summarizer has no room left is refused, not a placeholder entry."""

from __future__ import annotations

import pytest

from orchestrator._core.errors import ModelError
from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator.testing import ScriptedModel
from tests.runtime_kit import summary
from tests.test_hook_results import conversation, navigation_kit

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_branch_summary_with_no_room_is_refused_not_a_placeholder() -> None:
    # A summarizer window of 8192 tokens with 16384 kept free left a budget of 1 token: every
    # message dropped, and "No content to summarize" committed for a branch full of content.
    kit = navigation_kit()
    ids = await conversation(kit)
    small = ScriptedModel([summary()], context_window=8192)
    kit.runtime.summarizer = SummaryRoutes(candidates=(small,))
    before = list(kit.session.tree.entries)
    with pytest.raises(ModelError, match="Summarization refused: .* \\(8192 tokens\\)") as caught:
        await kit.runtime.navigate(ids["a1"], summarize=True)
    assert caught.value.kind == "fatal"
    assert small.requests == []
    assert kit.session.tree.entries == before
    assert kit.session.leaf_id == ids["a2"]
