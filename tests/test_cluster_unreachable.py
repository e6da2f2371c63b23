"""What the cluster cannot reach is one clear line, never a hang or a traceback (issue 10).

``orchestrator worker`` checks its ``--database`` and ``--temporal`` before it takes any work
and refuses in one line, exit 2. ``serve --temporal`` answers a request whose Temporal server
cannot be reached with ``-32008``, within the bound its client is configured with (a server
that was never there fails at once; one that went away after the first request fails once the
client's retries give up), and the session is unchanged.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

pytest.importorskip("temporalio", reason="the cluster tests need the 'cluster' extra")

from orchestrator._cli.main import main  # noqa: E402
from orchestrator._cluster.client import ClusterClient, connect_temporal  # noqa: E402
from orchestrator._cluster.operation.activities import SessionActivities  # noqa: E402
from orchestrator._cluster.worker import build_worker  # noqa: E402
from orchestrator._rpc.cluster_hub import ClusterHub  # noqa: E402
from orchestrator._rpc.errors import UNAVAILABLE
from orchestrator._rpc.protocol import Dispatcher
from orchestrator._runtime.operation.routes import RouteSettings, build_summarizer  # noqa: E402
from tests.cluster_kit import (  # noqa: E402
    Database,
    connected,
    queue_name,
    sans_operation_id,
    temporal_address,
)
from tests.services import database_base_url  # noqa: E402
from tests.test_cluster_hub import SETTINGS, call  # noqa: E402

NOBODY = "127.0.0.1:1"
"""A loopback port nothing listens on: every connection is refused at once."""


def refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The worker's one line for ``argv``, after checking it exits 2 with no traceback."""
    assert main(["worker", *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def with_parts(url: str, *, password: str | None = None, database: str | None = None) -> str:
    """``url`` with another password or database name."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if password is not None:
        user = parts.username or "orchestrator"
        netloc = f"{user}:{password}@{parts.hostname}:{parts.port or 5432}"
    path = f"/{database}" if database is not None else parts.path
    return urlunsplit((parts.scheme, netloc, path, parts.query, parts.fragment))


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"password": "not-the-password"}, "password authentication failed"),
        ({"database": "no_such_database_here"}, 'database "no_such_database_here" does not exist'),
    ],
)
def test_a_worker_with_a_database_it_cannot_log_into_says_so_in_one_line(
    capsys: pytest.CaptureFixture[str], change: dict[str, str], reason: str
) -> None:
    url = with_parts(database_base_url(), **change)
    line = refusal(capsys, "--temporal", NOBODY, "--database", url)
    assert line.startswith("orchestrator worker: --database: postgresql://")
    assert "cannot connect" in line
    assert reason in line
    assert "not-the-password" not in line


@pytest.mark.parametrize(
    ("database", "reason"),
    [
        ("postgresql://u:secret@127.0.0.1:1/db", "cannot connect"),
        ("postgresql://h/db?nonsense=1", "not a valid PostgreSQL URL"),
        ("mysql://h/db", "not a directory (nor a postgresql://USER@HOST/DATABASE URL)"),
    ],
)
def test_a_worker_with_a_database_it_cannot_use_says_so_in_one_line(
    capsys: pytest.CaptureFixture[str], database: str, reason: str
) -> None:
    pytest.importorskip("psycopg", reason="the database store needs the 'cluster' extra")
    line = refusal(capsys, "--temporal", NOBODY, "--database", database)
    assert line.startswith("orchestrator worker: --database: ")
    assert reason in line
    assert "secret" not in line


def test_a_worker_with_a_missing_directory_or_no_temporal_says_so_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere"
    line = refusal(capsys, "--temporal", NOBODY, "--database", str(missing))
    assert line == f"orchestrator worker: --database: {missing}: not a directory" + (
        " (nor a postgresql://USER@HOST/DATABASE URL)"
    )
    line = refusal(capsys, "--temporal", NOBODY, "--database", str(tmp_path))
    assert line == (
        "orchestrator worker: --temporal: the Temporal server at 127.0.0.1:1 cannot be "
        "reached (Connection refused)"
    )


def test_a_cluster_server_with_a_store_it_cannot_use_says_so_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere"
    assert main(["serve", "--temporal", NOBODY, "--database", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"orchestrator serve: --database: {missing}: not a directory"
        " (nor a postgresql://USER@HOST/DATABASE URL)\n"
    )


Stored = tuple[Database, str, list[dict[str, Any]]]


@pytest.fixture
def stored(tmp_path: Path) -> Stored:
    """A directory store holding the example session: the store, its id, its entries."""
    database = Database(str(tmp_path / "db"))
    session_id = database.add_example()
    return database, session_id, database.entries(session_id)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_server_whose_temporal_is_not_there_answers_unavailable(stored: Stored) -> None:
    database, session_id, before = stored
    rpc = Dispatcher(ClusterHub(NOBODY, database.location).methods())
    opened = (await call(rpc, "session.open", path=session_id))["result"]
    assert (opened["state"], opened["busy"]) == ("unknown", False)  # read from the store
    for method in ("session.compress", "session.abort", "session.prompt"):
        params = {"text": "hi"} if method == "session.prompt" else {}
        error = (await call(rpc, method, session_id=session_id, **params))["error"]
        operation = {"operationId": "<id>"} if method == "session.compress" else {}
        assert sans_operation_id(error) == {
            "code": UNAVAILABLE,
            "message": "the Temporal server at 127.0.0.1:1 cannot be reached (Connection refused)",
            "data": {"kind": "unavailable", **operation},
        }
    assert database.entries(session_id) == before


class Proxy:
    """A TCP relay to the Temporal server that can be cut: the server "goes away"."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> str:
        """Listen (again on the same port, once started); returns ``HOST:PORT``."""
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{self.port}"

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers += [writer, up_writer]

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except OSError:
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> None:
        """Stop listening and drop every relayed connection at once."""
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()


@asynccontextmanager
async def relayed() -> AsyncIterator[tuple[Proxy, str]]:
    proxy = Proxy(temporal_address())
    address = await proxy.start()
    try:
        yield proxy, address
    finally:
        proxy.cut()


@pytest.mark.anyio
async def test_a_temporal_server_that_goes_away_mid_request_is_unavailable_not_a_hang(
    stored: Stored, capfd: pytest.CaptureFixture[str]
) -> None:
    database, session_id, before = stored
    queue = queue_name()  # no worker polls it: the compaction waits to be accepted
    async with relayed() as (proxy, address), connected() as direct:
        client = await ClusterClient.connect(
            address, give_up_after=timedelta(seconds=3), task_queue=queue
        )
        rpc = Dispatcher(ClusterHub(address, database.location, client=client).methods())
        assert "result" in await call(rpc, "session.open", path=session_id)
        pending = asyncio.ensure_future(call(rpc, "session.compress", session_id=session_id))
        # In flight: the workflow was started and the update waits for a worker.
        while not await _running(direct, session_id):
            await asyncio.sleep(0.05)
        proxy.cut()
        error = (await pending)["error"]
        assert error["code"] == UNAVAILABLE
        assert sans_operation_id(error)["data"] == {"kind": "unavailable", "operationId": "<id>"}
        assert error["message"].startswith(f"the Temporal server at {address} cannot be reached")
        assert error["message"].endswith("; tried for 3 s")
        for method in ("session.compress", "session.abort"):
            again = (await call(rpc, method, session_id=session_id))["error"]
            assert again["code"] == UNAVAILABLE
        await direct.get_workflow_handle(session_id).terminate("test over")
    assert database.entries(session_id) == before
    # The SDK's retry warnings went to Python's logging, not to standard output (serve's
    # JSON-RPC channel), where its core writes them by default.
    assert capfd.readouterr().out == ""


@pytest.mark.anyio
async def test_a_worker_whose_temporal_goes_away_works_again_when_it_is_back(
    stored: Stored,
) -> None:
    database, session_id, _ = stored
    queue = queue_name()
    async with relayed() as (proxy, address), connected() as direct:
        acts = SessionActivities(database.location, build_summarizer(RouteSettings()), SETTINGS)
        worker_client = await connect_temporal(address)
        async with build_worker(worker_client, acts, task_queue=queue):
            proxy.cut()  # the worker's polls fail; it keeps asking
            # Asked meanwhile, straight to the server: no worker can take it until it is back.
            done = asyncio.ensure_future(
                ClusterClient(direct, task_queue=queue, idle_s=0.2).compress(session_id)
            )
            while not await _running(direct, session_id):
                await asyncio.sleep(0.05)
            await proxy.start()
            assert (await done).status == "committed"
    assert len(database.new_compactions(session_id)) == 1


async def _running(client: Any, session_id: str) -> bool:
    from temporalio.service import RPCError

    try:
        await client.get_workflow_handle(session_id).describe()
    except RPCError:
        return False
    return True


def test_only_a_server_that_does_not_answer_is_unavailable() -> None:
    from types import SimpleNamespace

    from temporalio.service import ConnectConfig, RPCError, RPCStatusCode

    from orchestrator._core.errors import UnavailableError

    config = ConnectConfig(target_host="h:1")
    client = ClusterClient(SimpleNamespace(service_client=SimpleNamespace(config=config)))  # type: ignore[arg-type]
    refused = RPCError("bad request", RPCStatusCode.INVALID_ARGUMENT, b"")
    assert client._unavailable(refused) is refused  # reported as it is, not as unavailable
    gone = client._unavailable(RPCError("tcp connect error", RPCStatusCode.UNAVAILABLE, b""))
    assert isinstance(gone, UnavailableError)
    assert str(gone) == (
        "the Temporal server at h:1 cannot be reached (tcp connect error); tried for 10 s"
    )


@pytest.mark.anyio
async def test_a_server_whose_database_went_away_answers_unavailable(pg_url: str) -> None:
    # PostgreSQL stopped after the session was opened: no parameter is wrong, so not -32602
    # (the client would take it for its own mistake), but -32008 as for Temporal.
    database = Database(pg_url)
    session_id = database.add_example()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    try:
        parts = urlsplit(pg_url)
        proxy = Proxy(f"{parts.hostname}:{parts.port or 5432}")
        relay = asyncio.run_coroutine_threadsafe(proxy.start(), loop).result()
        through = urlunsplit(parts._replace(netloc=f"{parts.username}:{parts.password}@{relay}"))
        rpc = Dispatcher(ClusterHub(NOBODY, through).methods())
        opened = (await call(rpc, "session.open", path=session_id))["result"]
        assert opened["session_id"] == session_id
        loop.call_soon_threadsafe(proxy.cut)
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result()  # cut is done
        for method, params in (
            ("session.tree", {"session_id": session_id}),
            ("session.context", {"session_id": session_id}),
            ("session.compress", {"session_id": session_id}),
            ("session.open", {"path": session_id}),
        ):
            error = (await call(rpc, method, **params))["error"]
            assert error["code"] == UNAVAILABLE, (method, error)
            operation = {"operationId": "<id>"} if method == "session.compress" else {}
            assert sans_operation_id(error)["data"] == {"kind": "unavailable", **operation}
            assert f"{parts.username}@{relay}" in error["message"]
            assert "cannot connect" in error["message"]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


@pytest.mark.anyio
async def test_after_a_blip_the_operation_id_finds_the_outcome_of_the_work_that_went_on(
    stored: Stored,
) -> None:
    database, session_id, _ = stored
    queue = queue_name()  # no worker yet: the compaction waits to be accepted
    async with relayed() as (proxy, address), connected() as direct:
        client = await ClusterClient.connect(
            address, give_up_after=timedelta(seconds=3), task_queue=queue, idle_s=0.2
        )
        rpc = Dispatcher(ClusterHub(address, database.location, client=client).methods())
        assert "result" in await call(rpc, "session.open", path=session_id)
        pending = asyncio.ensure_future(
            call(rpc, "session.compress", session_id=session_id, operationId="blip-1")
        )
        while not await _running(direct, session_id):
            await asyncio.sleep(0.05)
        proxy.cut()
        error = (await pending)["error"]
        assert error["code"] == UNAVAILABLE
        assert error["data"] == {"kind": "unavailable", "operationId": "blip-1"}
        # Still unreachable: asking is unavailable too, with the id.
        asked = await call(rpc, "session.operation", session_id=session_id, operationId="blip-1")
        assert asked["error"]["code"] == UNAVAILABLE
        assert asked["error"]["data"] == {"kind": "unavailable", "operationId": "blip-1"}
        # Temporal is back and a worker takes the update: the work went on; the id finds it.
        await proxy.start()
        acts = SessionActivities(database.location, build_summarizer(RouteSettings()), SETTINGS)
        async with build_worker(direct, acts, task_queue=queue):
            while True:
                answer = await call(
                    rpc, "session.operation", session_id=session_id, operationId="blip-1"
                )
                if answer["result"]["state"] != "running":
                    break
                await asyncio.sleep(0.05)
    done = answer["result"]
    assert done["state"] == "done", done
    assert done["result"]["operationId"] == "blip-1"
    assert [e["id"] for e in database.new_compactions(session_id)] == [done["result"]["entryId"]]
