"""The server freezes what a session it opens or forks holds (issue 35; gc_policy.py)."""

from __future__ import annotations

import gc
import shutil
from collections.abc import Iterator
from pathlib import Path

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
