"""Fairness benchmark: one client floods a big session, another asks for ``session.list``.

Run on demand (not part of the test run)::

    python tests/bench/bench_fairness.py                      # 200k entries, 64 session.context
    python tests/bench/bench_fairness.py --entries 300000 --method session.tree
    python tests/bench/bench_fairness.py --leave 2            # the flooding client leaves after 2 s
    python tests/bench/bench_fairness.py --method session.fork --requests 8
    python tests/bench/bench_fairness.py --method session.tree.navigate --requests 8

The session is a linear pi file written by ``bench_core.write_session`` (user prompts, assistant
messages with tool calls, tool results of 200 B to ~6 KB; 200k entries are 122 MB), kept in the
temporary folder between runs; each run serves a copy of it in a folder of its own (runs at once
do not collide, and forks, compactions and navigations leave the kept file as it was).
``orchestrator serve --socket`` runs in a child process.

Two clients on their own connections. The *poller* sends ``session.list`` every 50 ms from the
start to the end and records each answer's latency. The *flooder* opens the session
(``session.open``; the poller's latencies meanwhile are the "open" phase), then writes
``--requests`` requests of ``--method`` in one write and reads the answers (only their ids are
parsed), or closes its connection after ``--leave`` seconds. The "flood" phase lasts until the
flooder has every answer (or was disconnected, or left) and then 3 s more, so that work the
server goes on with after the client left shows.

Printed: per phase, the poller's count, max and p99 latency; the flooder's answers, bytes and
time; and the server's peak RSS (``VmHWM`` of ``/proc/PID/status``) after the open and at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_core import write_session  # noqa: E402
from tests.bench.serving import serving  # noqa: E402

POLL_EVERY = 0.05
TAIL = 3.0


def vm(pid: int, key: str) -> int:
    """A ``/proc/PID/status`` value in MiB (``VmHWM``: peak RSS, ``VmRSS``: now)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) // 1024
    raise KeyError(key)


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) the process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Lines:
    """A socket's lines, read without parsing more than the id of each."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream = stream
        self.buffer = bytearray()
        self.bytes = 0

    async def next(self) -> bytes | None:
        while True:
            end = self.buffer.find(b"\n")
            if end >= 0:
                line = bytes(self.buffer[:end])
                del self.buffer[: end + 1]
                return line
            try:
                chunk = await self.stream.receive(1 << 20)
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                return None
            self.bytes += len(chunk)
            self.buffer += chunk


def request(ident: int, method: str, params: dict[str, Any]) -> bytes:
    line = {"jsonrpc": "2.0", "id": ident, "method": method, "params": params}
    return json.dumps(line).encode() + b"\n"


class Poller:
    """Asks ``session.list`` every 50 ms; records (phase, latency) per answer."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.lines = Lines(stream)
        self.stream = stream
        self.phase = "idle"
        self.samples: list[tuple[str, float]] = []
        self.worst: tuple[float, float] = (0.0, 0.0)  # (latency, seconds since the start)
        self.start = time.perf_counter()
        self.stopped = False

    async def run(self) -> None:
        ident = 0
        while not self.stopped:
            ident += 1
            started = time.perf_counter()
            await self.stream.send(request(ident, "session.list", {}))
            line = await self.lines.next()
            if line is None:
                raise SystemExit("the poller was disconnected")
            elapsed = time.perf_counter() - started
            # Counted in the phase it ends in: a stall that a phase began counts there.
            self.samples.append((self.phase, elapsed))
            if self.phase == "flood" and elapsed > self.worst[0]:
                self.worst = (elapsed, started - self.start)
            await anyio.sleep(max(0.0, POLL_EVERY - elapsed))

    def report(self, phase: str) -> str:
        values = sorted(v for p, v in self.samples if p == phase)
        if not values:
            return f"{phase}: no answers"
        p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
        return (
            f"{phase}: {len(values)} answers, max {values[-1] * 1000:.0f} ms, "
            f"p99 {p99 * 1000:.0f} ms"
        )


def params(args: argparse.Namespace, session_id: str, i: int) -> dict[str, Any]:
    """The flood's requests: a fork of the last user message into a new file each time, a
    navigation to the last user message and back, or the method with the session alone."""
    if args.method == "session.fork":
        return {"session_id": session_id, "entry_id": args.targets[0], "path": f"fork-{i}.jsonl"}
    if args.method == "session.tree.navigate":
        return {"session_id": session_id, "target_id": args.targets[i % 2]}
    return {"session_id": session_id}


def targets(session: Path) -> list[str]:
    """The ids of the last user message and of the last entry (read from the file's end)."""
    with session.open("rb") as file:
        file.seek(max(0, session.stat().st_size - (1 << 20)))
        lines = file.read().splitlines()[1:]
    entries = [json.loads(line) for line in lines]
    users = [e["id"] for e in entries if e.get("message", {}).get("role") == "user"]
    return [users[-1], entries[-1]["id"]]


async def flood(
    stream: anyio.abc.ByteStream, session_id: str, args: argparse.Namespace
) -> tuple[int, int, int, float]:
    """Send the requests in one write; (answers, errors, bytes, seconds) until done or gone.

    The answers are not kept: only the first bytes of each line are looked at, so that the
    client takes little of the two cores the server runs on.
    """
    payload = b"".join(
        request(1000 + i, args.method, params(args, session_id, i)) for i in range(args.requests)
    )
    started = time.perf_counter()
    await stream.send(payload)
    answers = errors = size = 0
    head = b""  # the first bytes of the line being read
    with anyio.move_on_after(args.leave if args.leave is not None else 600):
        while answers < args.requests:
            try:
                chunk = await stream.receive(1 << 20)
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                break
            size += len(chunk)
            start = 0
            while (end := chunk.find(b"\n", start)) >= 0:
                head += chunk[start : min(end, start + 300)]
                if head.find(b'"method"', 0, 40) >= 0:  # a notification (the session's events)
                    head, start = b"", end + 1
                    continue
                answers += 1
                if head.find(b'"error"', 0, 200) >= 0:
                    errors += 1
                    if errors == 1:
                        print("first error:", head.decode(errors="replace"))
                head, start = b"", end + 1
            if len(head) < 300:
                head += chunk[start : start + 300 - len(head)]
    await stream.aclose()
    return answers, errors, size, time.perf_counter() - started


async def drive(socket_path: Path, session: Path, pid: int, args: argparse.Namespace) -> None:
    poll_stream = await anyio.connect_unix(str(socket_path))
    flood_stream = await anyio.connect_unix(str(socket_path))
    poller = Poller(poll_stream)
    async with anyio.create_task_group() as group:
        group.start_soon(poller.run)
        await anyio.sleep(0.5)
        print(f"server peak RSS before opening: {vm(pid, 'VmHWM')} MiB")
        poller.phase = "open"
        started = time.perf_counter()
        await flood_stream.send(request(1, "session.open", {"path": session.name}))
        opened = json.loads(await Lines(flood_stream).next() or b"{}")
        if "result" not in opened:
            raise SystemExit(f"session.open failed: {opened}")
        print(f"open: {time.perf_counter() - started:.2f} s, {opened['result']['entries']} entries")
        print(f"server peak RSS after opening: {vm(pid, 'VmHWM')} MiB")
        await anyio.sleep(0.5)
        poller.phase = "flood"
        answers, errors, size, took = await flood(
            flood_stream, opened["result"]["session_id"], args
        )
        how = "left" if args.leave is not None and took >= args.leave else "done"
        cpu_at_end = cpu_seconds(pid)
        print(
            f"flood ({args.requests} x {args.method}): {answers} answers ({errors} errors), "
            f"{size / 1e6:.0f} MB, flooder {how} after {took:.1f} s"
        )
        await anyio.sleep(TAIL)
        poller.stopped = True
        tail_cpu = cpu_seconds(pid) - cpu_at_end
    print(poller.report("open"))
    print(poller.report("flood"))
    print(f"worst flood answer: {poller.worst[0] * 1000:.0f} ms, asked at {poller.worst[1]:.1f} s")
    print(f"server CPU in the {TAIL:.0f} s after the flooder was done or left: {tail_cpu:.2f} s")
    print(f"server peak RSS (VmHWM): {vm(pid, 'VmHWM')} MiB, now {vm(pid, 'VmRSS')} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=200_000)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--method", default="session.context")
    parser.add_argument("--leave", type=float, default=None, help="flooder leaves after S s")
    args = parser.parse_args()
    # The written session is kept between runs (122 MB at 200k entries); each run serves a
    # copy in a folder of its own, so that runs at once do not refuse each other's open (the
    # session's lock) and a compress or navigate run leaves the kept one as it was.
    folder = Path(tempfile.gettempdir()) / "orchestrator-bench-fairness"
    folder.mkdir(exist_ok=True)
    kept = folder / f"s{args.entries}.jsonl"
    if not kept.exists():
        write_session(kept, args.entries)
    with tempfile.TemporaryDirectory(dir=folder, prefix="run-") as run:
        session = Path(run) / kept.name
        shutil.copyfile(kept, session)
        args.targets = targets(session)
        socket_path = Path(run) / "serve.sock"
        command = [sys.executable, "-m", "orchestrator", "serve"]
        command += ["--socket", str(socket_path), "--dir", run]
        with serving(command, stop_within=60) as server:
            anyio.run(drive, socket_path, session, server.pid, args)


if __name__ == "__main__":
    main()
