"""The server's own CPU per ``session.compress``: the JSON-RPC layer without the runtime.

Run on demand (not part of the test run)::

    python tests/bench/bench_rpc.py                     # 1,000 sessions, 5 rounds
    python tests/bench/bench_rpc.py --sessions 200 --rounds 10
    python tests/bench/bench_rpc.py --profile rpc.prof  # cProfile of the last round

``bench_concurrent.py --only server`` measures a thousand real compactions through the server;
the runtime's work is most of its CPU time and varies from run to run more than the server's
own part. Here the server (:class:`~orchestrator._rpc.server.RpcServer` over the real hub,
dispatcher and connections, in a child process on a Unix socket) runs over a host whose
``session.compress`` does no work: it waits ``--latency`` seconds (so that every request is in
flight at once, as with a model), tells the three events a compaction tells, and answers what
a committed compaction answers, the same sizes as the real ones. Everything else is the
server's: reading and parsing the request, dispatching it, the operation id and its book, the
request's task and cancel scope, forwarding the events, encoding and writing the answer.

The client is ``bench_concurrent.py``'s: 16 connections, every session opened over them, then
every ``session.compress`` sent at once, at most 64 in flight per connection. Printed per round:
the wall time and the server's CPU time for the compactions (``/proc``: user plus system); then
the median CPU time per request over the rounds.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SUMMARY = "## Goal\nBenchmark summary.\n\n" + "- (none)\n" * 150
"""About the size of the real answer's summary (1.6 KB)."""


def serve(socket_path: str, latency: float, profile: str | None) -> None:
    """Child process: the server over a host that answers ``session.compress`` at once."""
    from orchestrator._rpc.host import Compacted, Described, Opened
    from orchestrator._rpc.hub import RpcHub
    from orchestrator._rpc.local_host import LocalHost
    from orchestrator._rpc.protocol import Peer
    from orchestrator._rpc.server import RpcServer

    class Host(LocalHost):
        """Sessions that exist by name; a compaction that waits, tells and answers."""

        async def open(self, path: str, *, create: bool, peer: Peer | None) -> Opened:
            described = Described(
                session_id=path, path=path, entries=300, leaf_id="0000012b", state="idle",
                busy=False,
            )  # fmt: skip
            return Opened(described)

        async def compress(
            self, session_id: str, focus: str | None, *, operation_id: str | None = None
        ) -> Compacted | str:
            update = {"type": "compaction_update", "id": "79f500ef70ba", "kind": "compaction"}
            self.outlet.tell(session_id, {**update, "status": "in_progress"})
            await anyio.sleep(latency)
            self.outlet.tell(session_id, {**update, "status": "completed"})
            compact = {"type": "session_compact", "entryId": "00c0c85b", "fromExtension": False}
            self.outlet.tell(session_id, {**compact, "reason": "manual", "willRetry": False})
            return Compacted(
                entry_id="00c0c85b",
                summary=SUMMARY,
                tokens_before=52113,
                first_kept_entry_id="0000010c",
                short_summary=None,
            )

    if profile is not None:
        import cProfile

        profiler = cProfile.Profile()
        signal.signal(signal.SIGUSR1, lambda *_: profiler.enable())

        def off(*_: object) -> None:
            profiler.disable()
            profiler.dump_stats(profile)
            Path(profile + ".done").touch()

        signal.signal(signal.SIGUSR2, off)

    from orchestrator._process.gc_policy import freeze_after_full_collections

    server = RpcServer(RpcHub(Host()))
    freeze_after_full_collections()  # as orchestrator serve does

    async def run() -> None:
        async with anyio.create_task_group() as group:
            await group.start(server.serve_unix, Path(socket_path))
            print("listening", flush=True)
            with anyio.open_signal_receiver(signal.SIGTERM) as signals:
                async for _ in signals:
                    await server.stop()
                    group.cancel_scope.cancel()
                    return

    anyio.run(run)


async def rounds(args: argparse.Namespace, socket_path: Path, pid: int) -> list[float]:
    """Open the sessions, then run ``args.rounds`` rounds of compactions; CPU seconds each."""
    # Here, not at the top: the server's process must not load its collector's meter.
    from tests.bench.bench_concurrent import (
        CONNECTIONS,
        Client,
        ServerProfile,
        cpu_seconds,
        run_lanes,
    )

    used: list[float] = []
    async with anyio.create_task_group() as readers:
        clients = []
        for _ in range(CONNECTIONS):
            client = Client(await anyio.connect_unix(str(socket_path)))
            readers.start_soon(client.reader)
            clients.append(client)
        ids = [f"bench-{i:05d}" for i in range(args.sessions)]

        async def open_one(index: int, client: Client) -> None:
            await client.call("session.open", {"path": ids[index]})

        async def compress(index: int, client: Client) -> None:
            answer = await client.call("session.compress", {"session_id": ids[index]})
            assert answer["compacted"], answer

        await run_lanes(clients, len(ids), open_one)
        for number in range(args.rounds):
            last = number == args.rounds - 1
            profiler = ServerProfile(pid, args.profile if last else None)
            await profiler.start()
            cpu, t0 = cpu_seconds(pid), time.perf_counter()
            await run_lanes(clients, len(ids), compress)
            wall, seconds = time.perf_counter() - t0, cpu_seconds(pid) - cpu
            await profiler.stop()
            used.append(seconds)
            print(f"round {number + 1}: wall {wall:.2f} s, server CPU {seconds:.2f} s", flush=True)
        for client in clients:
            await client.stream.aclose()
        readers.cancel_scope.cancel()
    return used


def main(argv: list[str]) -> None:
    if argv[:1] == ["--serve"]:
        serve(argv[1], float(argv[2]), argv[3] if len(argv) > 3 else None)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--latency", type=float, default=0.5)
    parser.add_argument("--profile", metavar="FILE", help="cProfile statistics of the last round")
    args = parser.parse_args(argv)
    if args.profile is not None:
        args.profile = str(Path(args.profile).resolve())
    folder = Path(tempfile.mkdtemp(prefix="bench-rpc-"))
    socket_path = folder / "rpc.sock"
    command = [sys.executable, str(Path(__file__).resolve()), "--serve", str(socket_path)]
    command += [str(args.latency), *([args.profile] if args.profile else [])]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert server.stdout is not None
        if "listening" not in server.stdout.readline():
            raise SystemExit("the server did not start")
        used: Any = anyio.run(rounds, args, socket_path, server.pid)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        shutil.rmtree(folder, ignore_errors=True)
    per_request = statistics.median(used) / args.sessions * 1e6
    print(f"server CPU per session.compress: {per_request:.0f} us (median of {len(used)} rounds)")


if __name__ == "__main__":
    main(sys.argv[1:])
