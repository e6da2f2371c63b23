"""A worker's store work per turn, with and without its session cache (issue 10).

Run on demand (PostgreSQL optional)::

    python tests/bench/bench_turn_cache.py --entries 200 --turns 20 \\
        [--database postgresql://USER:PASSWORD@127.0.0.1/DB]

One session of ``--entries`` entries (bench_core's history), then ``--turns`` turns' store work
as the workflow asks a worker for it, the activities called directly (no Temporal): append the
prompt, read the agent's context, append the reply. Once with the default cache, once with
``--cache-sessions 0``. Printed per store: CPU time of this process per turn (``process_time``,
so other work on the machine does not count, though it still slows caches and the database),
whole-session parses per turn, and the load average (``/proc/loadavg``) before and after.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orchestrator._cluster.cache import SessionCache  # noqa: E402
from orchestrator._cluster.calls import NewEntry, TurnCall  # noqa: E402
from orchestrator._cluster.stores import WorkerStores  # noqa: E402
from orchestrator._cluster.turn.activities import TurnActivities  # noqa: E402
from orchestrator._runtime.types import RuntimeSettings  # noqa: E402
from orchestrator._store import jsonl, postgres  # noqa: E402
from tests.bench.bench_core import write_session  # noqa: E402

PARSES = [0]


def count_parses() -> None:
    for module in (jsonl, postgres):
        real = module.read_session

        def counted(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            PARSES[0] += 1
            return _real(*args, **kwargs)

        setattr(module, "read_session", counted)  # noqa: B010 - replaced for counting


def store_session(database: str, entries: int) -> str:
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "s.jsonl"
        write_session(path, entries)
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    header = json.loads(lines[0])
    header["id"] = session_id = f"bench-{uuid.uuid4().hex[:12]}"
    data = (json.dumps(header) + "\n" + "".join(lines[1:])).encode()
    if database.startswith("postgresql://"):
        with postgres.PostgresStore(database) as store:
            store.import_bytes(data)
    else:
        (Path(database) / f"{session_id}.jsonl").write_bytes(data)
    return session_id


def message(role: str, text: str) -> str:
    return json.dumps({"role": role, "content": [{"type": "text", "text": text}], "timestamp": 1})


def run(database: str, entries: int, turns: int, cache: SessionCache) -> tuple[float, float]:
    """CPU ms and whole-session parses per turn."""
    session_id = store_session(database, entries)
    stores = WorkerStores(database, cache=cache)
    activities = TurnActivities(stores, RuntimeSettings())
    try:
        start_cpu, start_parses = time.process_time(), PARSES[0]
        for n in range(turns):
            run_id = f"r{n}"
            prompt = NewEntry(entry_id=f"u{n:07d}", message=message("user", f"question {n}"))
            activities._append(TurnCall(session_id=session_id, run_id=run_id, entries=[prompt]))
            activities._context(TurnCall(session_id=session_id, run_id=run_id))
            reply = NewEntry(entry_id=f"a{n:07d}", message=message("assistant", f"answer {n}"))
            activities._append(TurnCall(session_id=session_id, run_id=run_id, entries=[reply]))
        cpu_ms = (time.process_time() - start_cpu) * 1000 / turns
        return cpu_ms, (PARSES[0] - start_parses) / turns
    finally:
        stores.close()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=200)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--database", help="a PostgreSQL URL (also measured: a directory)")
    args = parser.parse_args(argv)
    count_parses()
    print(f"load before: {Path('/proc/loadavg').read_text().strip()}")
    with tempfile.TemporaryDirectory() as directory:
        stores = [("directory", directory)]
        if args.database:
            stores.append(("postgresql", args.database))
        print("| store | cache | CPU ms per turn | parses per turn |")
        print("|---|---|---|---|")
        for name, database in stores:
            for label, cache in (("on", SessionCache()), ("off", SessionCache(max_sessions=0))):
                cpu_ms, parses = run(database, args.entries, args.turns, cache)
                print(f"| {name} | {label} | {cpu_ms:.1f} | {parses:.2f} |")
    print(f"load after: {Path('/proc/loadavg').read_text().strip()}")


if __name__ == "__main__":
    main(sys.argv[1:])
