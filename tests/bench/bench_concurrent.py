"""Concurrency benchmark: many sessions compacting at once, through the runtime and the server.

Run on demand (not part of the test run)::

    python tests/bench/bench_concurrent.py                    # 1,000 sessions, L = 1 s, both paths
    python tests/bench/bench_concurrent.py --sessions 200 --entries 300 --latency 0.5
    python tests/bench/bench_concurrent.py --only runtime     # or --only server
    python tests/bench/bench_concurrent.py --model fake       # in-process model, no HTTP
    python tests/bench/bench_concurrent.py --only runtime --uvloop  # the runtime on uvloop
    python tests/bench/bench_concurrent.py --only server --server-profile server.prof

The model. By default every summary goes over HTTP to the local provider server
(``orchestrator/testing/_provider.py``) running in a child process, where each answer
waits ``L`` seconds: the route is one :class:`~orchestrator.RemoteSummaryModel`, shared by every
session (one HTTP client, one connection pool). ``--model fake`` uses an in-process model that
sleeps ``L`` instead, which leaves out HTTP.

The sessions are small linear pi files (``--entries``, a few hundred each, the history of
``bench_core.py``), written once into a temporary folder, each with its own session id.

**runtime**: one process opens every session with ``AgentSession.open`` (owner, journal, context,
settling), then starts ``compact()`` on all of them at once. It installs the server's garbage
collection policy (``orchestrator._process.gc_policy``) and settles it after opening, as
``orchestrator serve`` does; ``BENCH_GC_POLICY=0`` leaves the policy out.

**server**: ``orchestrator serve --socket`` runs in a child process with ``--remote``; the
benchmark opens every session over 16 connections (``session.open``) and then sends every
``session.compress`` at once, spread over the same connections (at most 64 in flight per
connection, the server's default bound). ``--server-profile FILE`` runs the server under cProfile,
switched on for the compactions only (its event loop's thread: the work of the worker threads
is not in it), and writes the statistics to ``FILE`` (``python -m pstats FILE``); the profiler
slows the server down, so its times are for comparing one part with another, not for the goal.

Printed for each path: the time to open every session, then for the compactions the wall time
from the first request to the last answer, p50 and p99 of each operation's latency, the event
loop's worst lag (a ticker task that sleeps 5 ms and records how late it woke; in the server
path the ticker runs in the client, and the server's own lag shows in the latencies), and the
peak RSS of the process that ran the sessions, and the CPU time the compactions took in that
process and in the provider server (on a shared machine the wall time depends on the other jobs;
the CPU time much less).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_core import write_session  # noqa: E402
from tests.bench.serving import serving  # noqa: E402

GC_POLICY = os.environ.get("BENCH_GC_POLICY", "1") == "1"
CONNECTIONS = 16
PER_CONNECTION = 64  # the server's default max_in_flight


# -- the model -------------------------------------------------------------------------------------


def serve_provider(latency: float, count: int) -> None:
    """Child process: the local provider server answering ``count`` summaries after ``latency``."""
    from orchestrator.testing import LocalProvider, Reply

    # Reply.remote's keywords are body fields: the wait is the Reply's own ``delay``.
    reply = Reply(body={"summary": _SUMMARY}, delay=latency)
    provider = LocalProvider((reply,) * count)
    provider.start()
    print(provider.url, flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    provider.stop()


def _gate_passing() -> str:
    # The summary gate (D32) is on by default: a reply in both layouts passes it whichever
    # request (history or a split turn's prefix) it answers, so the benchmark never asks twice.
    from orchestrator.testing import summary_text

    note = "Benchmark summary."
    return summary_text(note) + "\n\n" + summary_text(note, purpose="turn_prefix")


_SUMMARY = _gate_passing()


class FakeModel:
    """An in-process model route that takes exactly ``latency`` seconds."""

    def __init__(self, latency: float) -> None:
        self.latency = latency

    @property
    def name(self) -> str:
        return "fake/fixed-latency"

    @property
    def context_window(self) -> int:
        return 200_000

    async def complete(self, request: Any) -> Any:
        from orchestrator._core.model import ModelResponse, Usage

        await anyio.sleep(self.latency)
        return ModelResponse(
            text=_SUMMARY,
            stop_reason="stop",
            usage=Usage(input=1000, output=20),
            model="fixed-latency",
            provider="fake",
        )


class Provider:
    """The provider server in a child process (HTTP), or nothing (``--model fake``)."""

    def __init__(self, kind: str, latency: float, count: int) -> None:
        self.kind = kind
        self.latency = latency
        self.count = count
        self.process: subprocess.Popen[str] | None = None
        self.url = ""

    def __enter__(self) -> Provider:
        if self.kind == "http":
            self.process = subprocess.Popen(
                [sys.executable, __file__, "--serve-provider", str(self.latency), str(self.count)],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert self.process.stdout is not None
            self.url = self.process.stdout.readline().strip() + "/summary"
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(10)

    def routes(self) -> Any:
        from orchestrator._models.remote import RemoteSummaryModel
        from orchestrator._runtime.operation.summarize import SummaryRoutes

        if self.kind == "http":
            return SummaryRoutes(candidates=(RemoteSummaryModel(self.url),))
        return SummaryRoutes(candidates=(FakeModel(self.latency),))


# -- profiling the server --------------------------------------------------------------------------

PROFILE_ON, PROFILE_OFF = signal.SIGUSR1, signal.SIGUSR2


def serve_profiled(output: str, argv: list[str]) -> None:
    """Child process: ``orchestrator serve`` with cProfile on between two signals.

    :data:`PROFILE_ON` switches it on; :data:`PROFILE_OFF` switches it off and writes the
    statistics to ``output``, then ``output + ".done"`` (the benchmark waits for that file).
    The handlers run on the event loop's thread, which is the one profiled.
    """
    import cProfile

    from orchestrator._cli.main import main as orchestrator

    profile = cProfile.Profile()

    def off(*_: object) -> None:
        profile.disable()
        profile.dump_stats(output)
        Path(output + ".done").touch()

    signal.signal(PROFILE_ON, lambda *_: profile.enable())
    signal.signal(PROFILE_OFF, off)
    sys.exit(orchestrator(argv))


class ServerProfile:
    """Switches a profiled server's profiler on and off (``--server-profile``; none: nothing)."""

    def __init__(self, pid: int, output: str | None) -> None:
        self.pid = pid
        self.output = output

    async def start(self) -> None:
        if self.output is not None:
            os.kill(self.pid, PROFILE_ON)
            await anyio.sleep(0.2)  # the handler runs once the loop wakes

    async def stop(self) -> None:
        if self.output is None:
            return
        done = Path(self.output + ".done")
        done.unlink(missing_ok=True)
        os.kill(self.pid, PROFILE_OFF)
        while not done.exists():
            await anyio.sleep(0.05)
        done.unlink()
        print(f"server profile (compactions): {self.output}", flush=True)


# -- sessions --------------------------------------------------------------------------------------


def write_sessions(folder: Path, count: int, entries: int) -> list[Path]:
    """``count`` copies of one linear session, each with its own header id, fsynced."""
    folder.mkdir(parents=True, exist_ok=True)
    template = folder / "template.jsonl"
    write_session(template, entries)
    lines = template.read_bytes().split(b"\n", 1)
    header = json.loads(lines[0])
    template.unlink()
    paths = []
    for i in range(count):
        header["id"] = f"bench-{i:05d}"
        path = folder / f"s{i:05d}.jsonl"
        path.write_bytes(json.dumps(header).encode() + b"\n" + lines[1])
        paths.append(path)
    os.sync()  # durable before timing: the commits' fsyncs must not flush the new files
    return paths


# -- measuring -------------------------------------------------------------------------------------


class GcMeter:
    """CPU time spent in the cyclic garbage collector, and how many full collections ran.

    CPU time of the collecting thread (a collection holds the GIL from start to stop), not wall
    time: on a loaded machine a collection's wall time also counts the moments other jobs had
    the core, several times its own cost at a load of 8.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self.by_generation = [0.0, 0.0, 0.0]
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.thread_time()
        else:
            spent = time.thread_time() - self._start
            self.seconds += spent
            self.by_generation[info["generation"]] += spent
            self.full += info["generation"] == 2

    def take(self) -> str:
        young, middle, full = self.by_generation
        parts = f"{young:.2f} + {middle:.2f} + {full:.2f} in {self.full} full"
        text = f"gc CPU {self.seconds:.2f} s ({parts})"
        self.seconds, self.full, self.by_generation = 0.0, 0, [0.0, 0.0, 0.0]
        return text


GC = GcMeter()


class LagMeter:
    """A ticker task: sleeps ``tick`` seconds and records how late it woke."""

    def __init__(self, tick: float = 0.005) -> None:
        self.tick = tick
        self.worst = 0.0
        self.running = True

    async def run(self) -> None:
        while self.running:
            start = time.perf_counter()
            await anyio.sleep(self.tick)
            self.worst = max(self.worst, time.perf_counter() - start - self.tick)

    def reset(self) -> None:
        self.worst = 0.0


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds spent by the process holding the sessions and by the provider, per phase."""

    def __init__(self, pid: int, provider: Provider) -> None:
        self.pids = (pid, provider.process.pid if provider.process is not None else None)
        self.start = self._now()
        self.seconds = 0.0  # the sessions' process, in the last phase taken

    def _now(self) -> tuple[float, float]:
        own, provider = self.pids
        return cpu_seconds(own), cpu_seconds(provider) if provider is not None else 0.0

    def take(self) -> str:
        now = self._now()
        used = (now[0] - self.start[0], now[1] - self.start[1])
        self.start = now
        self.seconds = used[0]
        text = f"CPU {used[0]:.2f} s"
        return text + (f" (provider {used[1]:.2f} s)" if self.pids[1] is not None else "")


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def peak_rss_mb(who: int = resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024  # Linux: KiB


def report(
    name: str,
    opened: float,
    open_lag: float,
    wall: float,
    lat: list[float],
    lag: float,
    rss: float,
    results: dict[str, int],
    gcs: tuple[str, str] = ("", ""),
    cpu: str = "",
) -> dict[str, Any]:
    row = {
        "path": name,
        "open_s": opened,
        "open_lag_ms": open_lag * 1e3,
        "wall_s": wall,
        "p50_s": statistics.median(lat),
        "p99_s": percentile(lat, 99),
        "lag_ms": lag * 1e3,
        "rss_mb": rss,
        "results": results,
        "cpu": cpu,
    }
    print(
        f"{name}: open {opened:.2f} s (loop lag {open_lag * 1e3:.0f} ms{gcs[0]}); compactions: "
        f"wall {wall:.2f} s, p50 {row['p50_s']:.2f} s, p99 {row['p99_s']:.2f} s, loop lag "
        f"{lag * 1e3:.0f} ms{gcs[1]}, {cpu}, peak RSS {rss:.0f} MB, outcomes {results}",
        flush=True,
    )
    return row


# -- through the runtime ---------------------------------------------------------------------------


async def through_runtime(paths: list[Path], provider: Provider) -> dict[str, Any]:
    from orchestrator._runtime.session import AgentSession

    routes = provider.routes()
    from orchestrator._process.gc_policy import freeze_after_full_collections

    policy = freeze_after_full_collections()
    if not GC_POLICY:
        policy.uninstall()
    meter = LagMeter()
    runtimes: list[Any] = []
    latencies: list[float] = []
    results: dict[str, int] = {}
    async with anyio.create_task_group() as ticker:
        ticker.start_soon(meter.run)
        await anyio.sleep(0.05)
        t0 = time.perf_counter()
        for path in paths:
            runtimes.append(AgentSession.open(path, owner="bench", summarizer=routes))
            await anyio.sleep(0)  # as a server would between requests
        policy.settle()  # as orchestrator serve does after opening its sessions at start
        opened = time.perf_counter() - t0
        open_lag = meter.worst
        open_gc = GC.take()
        await anyio.sleep(0.05)
        meter.reset()

        async def one(runtime: Any) -> None:
            start = time.perf_counter()
            try:
                status = (await runtime.compact()).status
            except Exception as error:  # noqa: BLE001 - counted and shown, not raised
                status = f"{type(error).__name__}: {error}"
            latencies.append(time.perf_counter() - start)
            results[status] = results.get(status, 0) + 1

        GC.take()
        cpu = CpuMeter(os.getpid(), provider)
        t0 = time.perf_counter()
        async with anyio.create_task_group() as group:
            for runtime in runtimes:
                group.start_soon(one, runtime)
        wall = time.perf_counter() - t0
        used = cpu.take()
        lag = meter.worst
        run_gc = GC.take()
        meter.running = False
    for runtime in runtimes:
        runtime.close()
    policy.uninstall()
    for model in routes.candidates:
        if hasattr(model, "aclose"):
            await model.aclose()
    gcs = (f", {open_gc}", f", {run_gc}")
    rss = peak_rss_mb()
    row = report("runtime", opened, open_lag, wall, latencies, lag, rss, results, gcs, used)
    return {**row, "cpu_s": cpu.seconds}


# -- through the server ----------------------------------------------------------------------------


class Client:
    """One socket connection speaking JSON-RPC lines; answers matched by id."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.buffer = b""
        self.waiting: dict[int, anyio.Event] = {}
        self.answers: dict[int, Any] = {}
        self.next_id = 0

    async def reader(self) -> None:
        while True:
            try:
                chunk = await self.stream.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                return
            self.buffer += chunk
            *lines, self.buffer = self.buffer.split(b"\n")
            for line in lines:
                message = json.loads(line)
                if "id" in message and message["id"] in self.waiting:
                    self.answers[message["id"]] = message
                    self.waiting.pop(message["id"]).set()

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        self.next_id += 1
        ident = self.next_id
        done = self.waiting[ident] = anyio.Event()
        line = {"jsonrpc": "2.0", "id": ident, "method": method, "params": params}
        await self.stream.send(json.dumps(line).encode() + b"\n")
        await done.wait()
        answer = self.answers.pop(ident)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer["result"]


async def through_server(
    paths: list[Path], provider: Provider, folder: Path, profile: str | None = None
) -> dict[str, Any]:
    assert provider.kind == "http", "the server path needs --model http"
    socket_path = folder / "bench.sock"
    here, output = str(Path(__file__).resolve()), str(Path(profile or ".").resolve())
    start = ["-m", "orchestrator"] if profile is None else [here, "--serve-profiled", output]
    command = [
        sys.executable,
        *start,
        "serve",
        "--socket",
        str(socket_path),
        "--dir",
        str(folder),
        "--remote",
        provider.url,
    ]
    with serving(command, stop_within=30) as server:
        profiler = ServerProfile(server.pid, output if profile is not None else None)
        return await _drive_server(paths, socket_path, server.pid, provider, profiler)


async def run_lanes(
    clients: list[Client], count: int, work: Callable[[int, Client], Awaitable[None]]
) -> None:
    """Run ``work`` for 0..count-1, spread over the connections, PER_CONNECTION in flight each."""

    async def lane(lane_no: int) -> None:
        limiter = anyio.Semaphore(PER_CONNECTION)

        async def bounded(index: int) -> None:
            async with limiter:
                await work(index, clients[lane_no])

        async with anyio.create_task_group() as group:
            for index in range(lane_no, count, len(clients)):
                group.start_soon(bounded, index)

    async with anyio.create_task_group() as lanes:
        for lane_no in range(len(clients)):
            lanes.start_soon(lane, lane_no)


async def _drive_server(
    paths: list[Path], socket_path: Path, pid: int, provider: Provider, profiler: ServerProfile
) -> dict[str, Any]:
    meter = LagMeter()
    latencies: list[float] = []
    results: dict[str, int] = {}
    async with anyio.create_task_group() as outer:
        outer.start_soon(meter.run)
        clients = []
        for _ in range(CONNECTIONS):
            client = Client(await anyio.connect_unix(str(socket_path)))
            outer.start_soon(client.reader)
            clients.append(client)
        ids: list[str] = [""] * len(paths)

        async def open_one(index: int, client: Client) -> None:
            answer = await client.call("session.open", {"path": paths[index].name})
            ids[index] = answer["session_id"]

        t0 = time.perf_counter()
        await run_lanes(clients, len(paths), open_one)
        opened = time.perf_counter() - t0
        open_lag = meter.worst
        meter.reset()

        async def compress(index: int, client: Client) -> None:
            start = time.perf_counter()
            try:
                answer = await client.call("session.compress", {"session_id": ids[index]})
                key = "committed" if answer.get("compacted") else "not compacted"
            except RuntimeError as error:
                key = str(error)
            latencies.append(time.perf_counter() - start)
            results[key] = results.get(key, 0) + 1

        await profiler.start()
        cpu = CpuMeter(pid, provider)
        t0 = time.perf_counter()
        await run_lanes(clients, len(paths), compress)
        wall = time.perf_counter() - t0
        used = cpu.take()
        await profiler.stop()
        lag = meter.worst
        meter.running = False
        rss = _rss_of(pid)
        for client in clients:
            await client.stream.aclose()
    row = report("server", opened, open_lag, wall, latencies, lag, rss, results, cpu=used)
    return {**row, "cpu_s": cpu.seconds}


def _rss_of(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


# -- main ------------------------------------------------------------------------------------------


def options() -> argparse.ArgumentParser:
    """The command line's options (``measure`` takes what they parse to)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--entries", type=int, default=300)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--model", choices=("http", "fake"), default="http")
    parser.add_argument("--only", choices=("runtime", "server"))
    parser.add_argument("--profile", metavar="FILE", help="pyinstrument HTML of the runtime path")
    parser.add_argument(
        "--server-profile", metavar="FILE", help="cProfile statistics of the server's compactions"
    )
    parser.add_argument(
        "--uvloop", action="store_true", help="run the runtime path on uvloop's event loop"
    )
    return parser


def main(argv: list[str]) -> None:
    if argv[:1] == ["--serve-provider"]:
        serve_provider(float(argv[1]), int(argv[2]))
        return
    if argv[:1] == ["--serve-profiled"]:
        serve_profiled(argv[1], argv[2:])
        return
    args = options().parse_args(argv)
    load = os.getloadavg()
    print(
        f"Python {sys.version.split()[0]}, {os.cpu_count()} cores, load average "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}; {args.sessions} sessions of "
        f"{args.entries} entries, model {args.model}, L = {args.latency:g} s",
        flush=True,
    )
    measure(args)


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Both paths (or ``args.only``'s) with ``main``'s options: each path's printed row."""
    rows = []
    folder = Path(tempfile.mkdtemp(prefix="bench-concurrent-"))
    try:
        with Provider(args.model, args.latency, 4 * args.sessions) as provider:
            if args.only in (None, "runtime"):
                paths = write_sessions(folder / "runtime", args.sessions, args.entries)
                loop = {"use_uvloop": args.uvloop}
                if args.profile:
                    from pyinstrument import Profiler

                    profiler = Profiler(async_mode="disabled")
                    profiler.start()
                    rows.append(anyio.run(through_runtime, paths, provider, backend_options=loop))
                    profiler.stop()
                    Path(args.profile).write_text(profiler.output_html())
                else:
                    rows.append(anyio.run(through_runtime, paths, provider, backend_options=loop))
                gc.collect()
            if args.only in (None, "server"):
                server_folder = folder / "server"
                paths = write_sessions(server_folder, args.sessions, args.entries)
                profile = args.server_profile
                rows.append(anyio.run(through_server, paths, provider, server_folder, profile))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
