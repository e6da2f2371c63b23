"""The server freezes what a session it opens or forks holds (issue 35; gc_policy.py)."""

from __future__ import annotations

import gc
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest

from orchestrator._process.gc_policy import POLICY
from orchestrator._rpc.hub import RuntimeOptions, SessionHub
from tests.cli_kit import EXAMPLE

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[SessionHub]:
    shutil.copy(EXAMPLE, tmp_path / "example.jsonl")
    gc.collect()
    POLICY.install()
    hub = SessionHub(RuntimeOptions(root=tmp_path))
    try:
        yield hub
    finally:
        hub.close_all()
        POLICY.uninstall()


async def test_an_opened_and_a_forked_session_are_frozen_without_a_collection(
    hub: SessionHub,
) -> None:
    collections: list[int] = []

    def counted(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(counted)
    try:
        before = POLICY.freezes
        opened = await hub.host.open("example.jsonl", create=False, peer=None)
        assert POLICY.freezes == before + 1
        runtime = hub.host.slot(opened.described.session_id).runtime
        user = next(
            entry["id"]
            for entry in reversed(runtime.session.path())
            if entry.get("message", {}).get("role") == "user"
        )
        await hub.host.fork(opened.described.session_id, user, "forked.jsonl")
        assert POLICY.freezes == before + 2
        assert 2 not in collections  # frozen as they are, never by a full collection
    finally:
        gc.callbacks.remove(counted)


def full_collections() -> tuple[list[int], Callable[[str, dict[str, int]], None]]:
    """A list the generation of every collection that starts is added to, and its callback."""
    started: list[int] = []

    def counted(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            started.append(2)

    return started, counted


async def test_a_closed_session_freed_at_once_leaves_the_others_frozen(hub: SessionHub) -> None:
    # Unfreezing sends every open session to the next full collection (0.65 s with 200,000
    # entries): a session freed when closed is not worth that.
    await hub.host.open("example.jsonl", create=False, peer=None)
    second = await hub.host.open("other.jsonl", create=True, peer=None)
    started, counted = full_collections()
    gc.callbacks.append(counted)
    try:
        await hub.host.close(second.described.session_id)
        await anyio.sleep(0)  # the close request's own references end
        assert gc.get_freeze_count() > 0  # the first session's objects stay frozen
        await hub.host.open("third.jsonl", create=True, peer=None)  # looks again: freed
        assert gc.get_freeze_count() > 0
        assert started == []
    finally:
        gc.callbacks.remove(counted)


async def test_a_closed_session_still_held_later_is_collected(hub: SessionHub) -> None:
    first = await hub.host.open("example.jsonl", create=False, peer=None)
    held = hub.host.slot(first.described.session_id).runtime  # as a cycle would hold it
    await hub.host.close(first.described.session_id)
    started, counted = full_collections()
    gc.callbacks.append(counted)
    try:
        await hub.host.open("other.jsonl", create=True, peer=None)
        assert started == [2]  # unfrozen, collected, frozen again
        assert gc.get_freeze_count() > 0
    finally:
        gc.callbacks.remove(counted)
    assert held.session is not None
