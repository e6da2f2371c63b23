"""The bytes of a session file: its lines, how it is read and how a whole file is written.

The pieces of :class:`~orchestrator._store.jsonl.JsonlStore` that are plain functions of a path or
a descriptor: encoding an entry as the line pi writes, opening only regular files, reading in
chunks (and the last line backwards), the temporary file a rewrite or a new file is written to,
and naming a new file by a link that never replaces what is there. The store's modules
(``jsonl`` and ``jsonl_file``) say when each is used and why (their theory of operation).
"""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from stat import S_ISREG

from orchestrator._core.entries import Entry
from orchestrator._core.errors import SessionError
from orchestrator._core.load_result import LoadResult
from orchestrator._core.loading import ParsedSession, read_session_chunks
from orchestrator._core.migration import RandomHex, uuid_hex
from orchestrator._store.files import only_regular, os_failure, session_file
from orchestrator._store.tail import tail_of_file

CHUNK = 1 << 16
"""Bytes read at a time backwards (the last line)."""
LOAD_CHUNK = 1 << 20
"""Bytes read at a time when a file is loaded (:func:`read_chunks`).

Every read lets go of the interpreter lock, and takes it back before the thread waiting for it
(a server's event loop, while a session loads in a worker thread) is awake: a read every
64 KB, half a millisecond apart, starved that thread for 30 to 170 ms at a time while a
200,000-entry session loaded (CPython's lock is handed over only after 5 ms without a
release; issue 35). A read every megabyte leaves it those 5 ms. A megabyte chunk is no dearer
in memory: the allocator reuses the freed one for the next (4 MB more at the peak)."""
LINES_PER_WRITE = 4096
"""Lines joined for one write of a whole file: a few megabytes, never the file twice."""


def write_pi_line(entry: Entry) -> bytes:
    """Serialize one entry as the line pi writes (``JSON.stringify`` plus a newline), in UTF-8.

    Compact separators and raw (unescaped) non-ASCII, like ``JSON.stringify``. A lone surrogate
    is written as a backslash-u escape, as ``JSON.stringify`` does, so the line is valid UTF-8.
    Known difference: Python spells some floats differently (``1e-07`` for ``1e-7``); both read
    back as the same number.

    Args:
        entry: The entry (or header) to write.

    Returns:
        The line, ending in a newline.

    Raises:
        SessionError: The entry holds something JSON cannot carry (NaN, infinity, a set...),
            which pi could not read back.
    """
    try:
        text = json.dumps(entry, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise SessionError(f"entry {entry.get('id')!r} cannot be written as JSON: {exc}") from exc
    return (text + "\n").encode("utf-8", "backslashreplace")


def file_signature(stat: os.stat_result) -> tuple[int, int, int, int]:
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


def open_session_file(path: Path, flags: int, mode: int = 0o666) -> int:
    """Open the session file itself, refusing anything but a regular file.

    ``O_NONBLOCK`` keeps the open from waiting: a named pipe opened for reading waits for a
    writer for ever (and a signal does not end the wait: the call is restarted). It changes
    nothing for a regular file. A pipe or a device (``/dev/zero`` reads without end) is refused.

    Raises:
        OSError: The open failed (the caller says why, in one line).
        SessionError: The path names something that is not a regular file.
    """
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    return only_regular(fd, f"{path}: not a regular file; a session is a file of JSON lines")


def refuse_shared(path: Path, names: int) -> None:
    """Refuse to write a session file that has other names too (hard links; see ``jsonl_file``).

    Raises:
        SessionError: ``names`` is more than one.
    """
    if names > 1:
        raise SessionError(
            f"{path}: has {names} names (hard links); refusing to change it: an append changes "
            "every name, but the lock and the journal are per name, so a writer under another "
            "name would not be kept out (copy it to give it one name)"
        )


def temporary_name(path: Path, token: str) -> str:
    """The name of a temporary file that will replace (or become) ``path``: hidden, beside it."""
    return f".{path.name}.{token}.tmp"


def remove_temporaries(path: Path) -> None:
    """Remove the temporary files of ``path``'s rewrites that a killed owner left behind.

    Only regular files named exactly as :func:`temporary_name` names them (eight hex digits)
    go; the caller holds the session's lock, under which alone they are written. A folder that
    cannot be listed, or a file that cannot be removed, is left as it is: litter, not harm.
    """
    prefix, suffix = f".{path.name}.", ".tmp"  # as temporary_name names them
    try:
        names = os.listdir(path.parent)
    except OSError:
        return
    for name in names:
        token = name[len(prefix) : -len(suffix)]
        if not (name.startswith(prefix) and name.endswith(suffix) and is_token(token)):
            continue
        leftover = path.parent / name
        try:
            if S_ISREG(os.lstat(leftover).st_mode):
                leftover.unlink()
        except OSError:
            pass


def is_token(text: str) -> bool:
    return len(text) == 8 and all(c in "0123456789abcdef" for c in text)


def corrupt_fragment(side: int, moved: bytes) -> bytes:
    """A torn line as the ``.corrupt`` file keeps it: a line of its own, ending in a newline.

    Kept as moved, the fragments of two crashes ran together (``{"a":"torn1{"b":"torn2``) and
    nobody could tell where one ended. Each now ends in a newline, and one is put before it when
    the file ends without one (a fragment kept before fragments ended in newlines). A torn line
    holds no newline (it is what follows the last one), so the newlines are only separators.
    """
    size = os.fstat(side).st_size
    apart = b"\n" if size and os.pread(side, 1, size - 1) != b"\n" else b""
    return apart + moved + b"\n"


def link_new(temporary: Path, path: Path) -> None:
    """Give the whole file ``temporary`` the new name ``path``, never replacing what is there.

    A hard link fails when the name exists, where a rename would replace it. A file system
    without hard links (FAT, some network shares) gets a rename instead, after a last look: the
    owner lock keeps other stores of ours out, so only a program that ignores it could slip in.

    Raises:
        SessionError: ``path`` already exists, or the folder refuses the name.
    """
    try:
        os.link(temporary, path)
        return
    except FileExistsError:
        raise SessionError(f"{path}: already exists") from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise os_failure(path, "create it", exc) from exc
    if os.path.lexists(path):
        raise SessionError(f"{path}: already exists")
    try:
        os.rename(temporary, path)
    except OSError as exc:
        raise os_failure(path, "create it", exc) from exc


def read_chunks(fd: int) -> Iterator[bytes]:
    """The bytes of an open descriptor from where it is to the end, 1 MB at a time.

    A load parses these as they come (:func:`read_session_chunks`): a whole-file read held the
    file in fresh memory, one page fault per 4 KB, the dearest part of loading a big file on a
    virtual machine (issue 9). A chunk is freed once split, and the next read reuses its memory.
    Why a megabyte: :data:`LOAD_CHUNK`.
    """
    while chunk := os.read(fd, LOAD_CHUNK):
        yield chunk


def parse_file(
    path: Path,
    random_hex: RandomHex,
    *,
    outline: bool,
    taken: Callable[[Entry], Entry] | None = None,
) -> tuple[os.stat_result, ParsedSession, bytearray] | None:
    """Parse the file at ``path``: its stat, the parse (its tail set) and its last byte.

    ``None`` when there is no file. A file is read a chunk at a time (see
    :func:`~orchestrator._core.loading.read_session_chunks`, and ``outline`` and ``taken``
    there).

    Raises:
        SessionError: The file cannot be read (permissions, a folder...).
    """
    try:
        fd = open_session_file(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise os_failure(path, "read it", exc) from exc
    last = bytearray()  # the last byte parsed
    try:
        stat = os.fstat(fd)
        parsed = read_session_chunks(
            last_byte_into(last, read_chunks(fd)),
            size=stat.st_size,
            random_hex=random_hex,
            outline=outline,
            taken=taken,
        )
        # The end of the bytes just parsed, read back through the same descriptor: a file
        # is only appended to in place (rewrites are renames), so they are the same bytes.
        parsed.result.tail = tail_of_file(fd, os.lseek(fd, 0, os.SEEK_CUR))
    except OSError as exc:
        raise os_failure(path, "read it", exc) from exc
    finally:
        os.close(fd)
    return stat, parsed, last


def read_outline(
    path: str | os.PathLike[str], taken: Callable[[Entry], Entry] | None = None
) -> LoadResult:
    """The session file at ``path`` read for its problems and tree only (``check``).

    Each entry keeps its id, parent, type and references
    (:func:`~orchestrator._core.reading.outline_of`); the problems are those a full load finds.
    Nothing is kept for a later write: an outline must never be written back. A missing file
    reads as empty, as :meth:`JsonlStore.load` reads it. ``taken``: makes each outline from the
    whole entry instead (not for a file that migrates).

    Raises:
        SessionError: The file cannot be read (permissions, a folder...).
    """
    read = parse_file(session_file(path), uuid_hex, outline=True, taken=taken)
    return LoadResult(header=None) if read is None else read[1].result


def last_byte_into(last: bytearray, chunks: Iterator[bytes]) -> Iterator[bytes]:
    """``chunks``, keeping the last byte seen in ``last`` (a load learns how the file ends)."""
    for chunk in chunks:
        if chunk:
            last[:] = chunk[-1:]
        yield chunk


def read_last_line(fd: int, size: int) -> tuple[int, bytes]:
    """Return ``(offset, bytes)`` of the file from just before its last newline to the end.

    The pieces read backwards are joined once at the end: prepending each to the bytes so far
    copied the whole line again per 64 KB, and repairing a torn line of 200 MB took minutes
    with the lock held. Now every byte is read once and copied once.
    """
    position, pieces = size, []
    while position > 0:
        start = max(0, position - CHUNK)
        piece = os.pread(fd, position - start, start)
        pieces.append(piece)
        position = start
        if b"\n" in piece:
            break
    pieces.reverse()
    return position, b"".join(pieces)


def default_owner() -> str:
    """The name a store that writes without :meth:`JsonlStore.own` gives its lock."""
    name = Path(sys.argv[0]).name if sys.argv else ""
    return name if name and not name.startswith("-") else "python"


def write_temporary(path: Path, data: list[bytes], mode: int | None, create: int = 0o666) -> Path:
    """A fsynced file holding the lines ``data`` beside the session ``path``, ``mode`` when given.

    ``None`` keeps the mode the umask gives a new file made with ``create``, as pi's
    ``writeFileSync`` would with the default ``0o666``.
    """
    directory = path.parent
    import secrets  # here, not at the top: reading a session never needs it

    temporary = directory / temporary_name(path, secrets.token_hex(4))
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, create)
    except OSError as exc:
        doing = "write a temporary file in its folder to replace it"
        raise os_failure(path, doing, exc) from exc
    try:
        if mode is not None:
            os.fchmod(fd, mode)  # the original's
        for start in range(0, len(data), LINES_PER_WRITE):
            view = memoryview(b"".join(data[start : start + LINES_PER_WRITE]))
            written = 0
            while written < len(view):
                written += os.write(fd, view[written:])
        os.fsync(fd)
    except BaseException as exc:
        os.close(fd)
        temporary.unlink(missing_ok=True)
        if isinstance(exc, OSError):  # a full disk, a quota: say which file
            raise os_failure(path, "write it", exc) from exc
        raise
    os.close(fd)
    return temporary
