"""``session.fork`` writes only to a free name (a dangling link was followed and written)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from orchestrator._rpc.errors import INVALID_PARAMS, RpcError
from orchestrator._rpc.hub import RuntimeOptions, SessionHub
from tests.cli_kit import EXAMPLE
from tests.runtime_kit import HubClient as Client

pytestmark = pytest.mark.anyio

USER_MESSAGE = "daa66d13"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_fork_onto_a_link_or_an_empty_path_is_refused(tmp_path: Path) -> None:
    shutil.copy(EXAMPLE, tmp_path / "a.jsonl")
    (tmp_path / "dangling.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    client = Client(SessionHub(RuntimeOptions(root=tmp_path)))
    opened = await client.call("session.open", path="a.jsonl")
    fork = {"session_id": opened["session_id"], "entry_id": USER_MESSAGE}
    error = await client.error("session.fork", **fork, path="dangling.jsonl")
    assert (error["code"], error["message"]) == (INVALID_PARAMS, "dangling.jsonl: already exists")
    assert not (tmp_path / "nowhere.jsonl").exists()  # nothing created through the link
    error = await client.error("session.fork", **fork, path="")
    assert error["code"] == INVALID_PARAMS
    assert "'path' is empty" in error["message"]
    await client.call("session.close", session_id=opened["session_id"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "dangling.jsonl"]


async def test_two_forks_at_once_take_two_default_names(tmp_path: Path) -> None:
    # Both chose s.fork1.jsonl; the second was refused as "being changed by" the server itself.
    shutil.copy(EXAMPLE, tmp_path / "a.jsonl")
    client = Client(SessionHub(RuntimeOptions(root=tmp_path)))
    opened = await client.call("session.open", path="a.jsonl")
    fork = {"session_id": opened["session_id"], "entry_id": USER_MESSAGE}
    answers = await client.dispatcher.handle(
        [
            {"jsonrpc": "2.0", "id": 1, "method": "session.fork", "params": fork},
            {"jsonrpc": "2.0", "id": 2, "method": "session.fork", "params": fork},
        ]
    )
    assert isinstance(answers, list)
    paths = sorted(Path(answer["result"]["path"]).name for answer in answers)
    assert paths == ["a.fork1.jsonl", "a.fork2.jsonl"]


async def test_session_open_says_what_a_name_is_as_the_command_line_does(tmp_path: Path) -> None:
    # A folder, a pipe, a dangling link and a link loop were all "no such session file" (the
    # loop: "Symlink loop from '...'").
    import os

    (tmp_path / "dir.jsonl").mkdir()
    os.mkfifo(tmp_path / "p.jsonl")
    (tmp_path / "dangling.jsonl").symlink_to("nowhere.jsonl")
    (tmp_path / "loop.jsonl").symlink_to("loop2.jsonl")
    (tmp_path / "loop2.jsonl").symlink_to("loop.jsonl")
    client = Client(SessionHub(RuntimeOptions(root=tmp_path)))
    expected = {
        "dir.jsonl": "dir.jsonl: is a directory, not a session file",
        "p.jsonl": "p.jsonl: not a regular file; a session is a file of JSON lines",
        "dangling.jsonl": "dangling.jsonl: symbolic link to nowhere.jsonl, which does not exist",
        "loop.jsonl": "loop.jsonl: symbolic link loop (following its links never reaches a file)",
        "missing.jsonl": "missing.jsonl: no such session file",
    }
    for path, message in expected.items():
        error = await client.error("session.open", path=path)
        assert (error["code"], error["message"]) == (INVALID_PARAMS, message)


async def test_a_name_ending_in_a_slash_names_a_folder_and_is_refused(tmp_path: Path) -> None:
    # Path("s.jsonl/") is Path("s.jsonl"): session.open opened s.jsonl, with create made
    # new.jsonl, and session.fork wrote f.jsonl.
    shutil.copy(EXAMPLE, tmp_path / "s.jsonl")
    (tmp_path / "dir.jsonl").mkdir()
    client = Client(SessionHub(RuntimeOptions(root=tmp_path)))
    folder = "a name ending in '/' names a folder, not a session file"
    refused = {
        ("s.jsonl/", False): f"s.jsonl/: {folder}",
        ("s.jsonl/", True): f"s.jsonl/: {folder}",
        ("new.jsonl/", True): f"new.jsonl/: {folder}",
        ("dir.jsonl/", False): "dir.jsonl/: is a directory, not a session file",
    }
    for (path, create), message in refused.items():
        error = await client.error("session.open", path=path, create=create)
        assert (error["code"], error["message"]) == (INVALID_PARAMS, message)
    assert (await client.call("session.list"))["sessions"] == []
    opened = await client.call("session.open", path="s.jsonl")
    fork = {"session_id": opened["session_id"], "entry_id": USER_MESSAGE}
    error = await client.error("session.fork", **fork, path="f.jsonl/")
    assert (error["code"], error["message"]) == (INVALID_PARAMS, f"f.jsonl/: {folder}")
    await client.call("session.close", session_id=opened["session_id"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.jsonl", "s.jsonl"]


def test_a_link_loop_is_told_by_the_error_type_not_its_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It was found by "loop" in the message, which another error could contain and another
    # Python could word differently: 3.11 and 3.12 raise RuntimeError, 3.13 OSError(ELOOP).
    import errno
    import os

    from orchestrator._rpc import paths

    loop = "a.jsonl: symbolic link loop (following its links never reaches a file)"
    raised: list[BaseException] = [
        RuntimeError("Symlink loop from 'a.jsonl'"),
        OSError(errno.ELOOP, os.strerror(errno.ELOOP)),
        OSError(errno.ENAMETOOLONG, "File name too long (a loop of words)"),
    ]
    answers = []
    for error in raised:

        def fail(self: Path, strict: bool = False, error: BaseException = error) -> Path:
            raise error

        monkeypatch.setattr(Path, "resolve", fail)
        with pytest.raises(RpcError) as caught:
            paths.resolve("a.jsonl", tmp_path)
        answers.append((caught.value.code, str(caught.value)))
    assert answers == [
        (INVALID_PARAMS, loop),
        (INVALID_PARAMS, loop),
        (INVALID_PARAMS, "a.jsonl: [Errno 36] File name too long (a loop of words)"),
    ]


def test_an_unknown_home_folder_is_the_callers_path_not_a_loop(tmp_path: Path) -> None:
    from orchestrator._rpc import paths

    with pytest.raises(RpcError) as caught:
        paths.resolve("~no-such-user-here/s.jsonl", tmp_path)
    assert caught.value.code == INVALID_PARAMS
    assert str(caught.value).startswith("~no-such-user-here/s.jsonl: ")
    assert "loop" not in str(caught.value)
