"""Single-stream compressed inputs, decompressed by maintained libraries: a bzip2 file cut
into block ranges that many tasks read, each compressed byte decoded once, and gzip
read front to back.

bzip2 (`Bz2Blocks`). A .bz2 file is a run of blocks of up to 900 kB of data each, every one
decodable on its own and marked by a 48-bit magic number at any bit position (not byte
aligned). indexed_bzip2 finds the blocks by that magic and decodes them. A task given the
compressed byte range [start, stop) opens the library on a window of the file that begins
at byte `start` behind a 4-byte stream header (`BZh9`), so the library takes the window for
a bzip2 file and its block finder skips the bits before the first block; the task reads the
blocks whose magic starts in its range, and reads on into the next range's blocks only to
finish the record it has open there. So ranges that tile a file decode every block once,
but for the block where a range's last record ends, which the next range decodes again:
about one block (up to 900 kB of text) per range boundary, 0.4% of a 64 MiB range. Blocks
are decoded on the task's own thread (`_OnThisThread`), so a task uses one core.

Which task reads a record does not depend on how the file is cut: a record belongs to the
range holding the block where it starts (for the line formats: where the newline before it
is, since a range cannot know whether its first byte starts a line), and its order key is
(the bit offset of that block's magic in the file, its offset inside the block's data).

gzip (`open_gzip`). A deflate stream cannot be decoded from the middle without the 32 KiB
before it, so a .gz file is read front to back by one task, which hands whole records on
to cleaning tasks (pipelines/stages/corpus/units.py). Python's gzip (zlib) decompresses it, at
about 200 MB of text per CPU-second on the development machine: some 50 times what a
cleaning core takes (3-9 MB/s), so one reader feeds many cleaning cores. rapidgzip was
tried in its place and dropped: with one thread it was 1.6x faster (330 MB per CPU-second),
but its memory grew with the data read (232 MB of RSS after 256 MB of text, against 25 MB
for zlib; rapidgzip issue #69), which a multi-GB book or web dump cannot afford, and it
took a file cut inside its deflate data for a complete one (issue #71).

indexed_bzip2 is imported where a file is opened (a command that reads manifests does not
import it).
"""

from __future__ import annotations

import bisect
import gzip
import zlib
from typing import Any, BinaryIO

_HEAD = b"BZh9"  # a bzip2 stream header, largest block size (the decoder's bound only)
_THREADS = 2  # the fallback: indexed_bzip2.open reads a window with its block finder from 2 threads up
_READ = 1 << 16  # bytes per read: what a range reads past its last block is at most this


def _short(exc: BaseException) -> str:
    """The first line of a library's message, or its type when it has none useful."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return text if text and text != "std::exception" else type(exc).__name__


class _Window:
    """`head`, then the bytes of `raw` from `start` on, as a seekable read-only file; counts
    the bytes read from `raw`. What indexed_bzip2 is given instead of the file."""

    def __init__(self, raw: BinaryIO, start: int, size: int, head: bytes = _HEAD):
        self.raw, self.start, self.head = raw, start, head
        self.size = len(head) + size - start
        self.position = 0
        self.bytes = 0
        self.closed = False

    def read(self, size: int = -1) -> bytes:
        size = self.size - self.position if size is None or size < 0 else min(size, self.size - self.position)
        if size <= 0:
            return b""
        out = b""
        if self.position < len(self.head):
            out = self.head[self.position : self.position + size]
        rest = size - len(out)
        if rest:
            self.raw.seek(self.start + self.position + len(out) - len(self.head))
            data = self.raw.read(rest)
            self.bytes += len(data)
            out += data
        self.position += len(out)
        return out

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self.position, self.size)[whence]
        self.position = max(0, base + offset)
        return self.position

    def tell(self) -> int:
        return self.position

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def write(self, data) -> int:
        raise OSError("read-only")

    def close(self) -> None:
        self.closed = True


class _OnThisThread:
    """indexed_bzip2's block-finding reader with no decoding threads: blocks are decoded on
    the calling thread when read, so a task uses the one core Ray gave it, and nothing is
    decoded ahead of the reads. `indexed_bzip2.open` takes parallelization 1 to mean its
    serial reader, which wants a block right after the stream header; the class it uses
    for more threads takes 1 as well."""

    def __init__(self, file: Any):
        self.file = file

    def read(self, size: int) -> bytes:
        buffer = bytearray(size)
        return bytes(memoryview(buffer)[: self.file.readinto(buffer)])

    def __getattr__(self, name: str) -> Any:
        return getattr(self.file, name)


def _open_bzip2(window: _Window) -> Any:
    import indexed_bzip2

    if hasattr(indexed_bzip2, "_IndexedBzip2FileParallel"):
        return _OnThisThread(indexed_bzip2._IndexedBzip2FileParallel(window, 1))
    return indexed_bzip2.open(window, parallelization=_THREADS)  # decodes ahead on _THREADS threads


class Bz2Blocks:
    """The decompressed data of the bzip2 blocks whose magic starts in the compressed byte
    range [start, stop) (`stop` None: to the end), and of the blocks after them as far as
    they are read. Positions count from the first byte of the range's first block.

    Reads pause (return b"" with `paused` set) where the first block at or past `stop`
    begins; the reader clears `paused` to finish a record that is open there. `line_records`:
    records start after a newline (lines, jsonl, tsv), so a record starting right at that
    boundary is this range's. Close it (the library runs threads)."""

    def __init__(self, raw: BinaryIO, start: int, stop: int | None, size: int, line_records: bool = False):
        self.window = _Window(raw, start, size)
        self.start_bits = 8 * (start - len(_HEAD))  # library bit offset -> file bit offset
        self.stop_bits = None if stop is None else 8 * stop
        self.shift = 1 if line_records else 0
        self.decompressed = 0  # bytes handed out
        self.boundary: int | None = None  # position where the first block past the range begins
        self.paused = False
        self._pending = b""
        self._starts: list[int] = []  # decoded start of each block read so far ...
        self._bits: list[int] = []  # ... and the file bit offset of its magic
        self._block = -1  # the library's bit offset of the block being read
        self._past = False  # data past the boundary has been read
        self._file: Any = _open_bzip2(self.window)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> Bz2Blocks:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def compressed_read(self) -> int:
        return self.window.bytes

    @property
    def decoded_bytes(self) -> int:
        """Bytes the library handed out (some wait in `_pending`). Not counted: the rest of
        the block where the range's last record ends, which the library decodes whole and the
        next range decodes again."""
        return self.decompressed

    def owns(self, position: int) -> bool:
        """Whether a record starting at this position is this range's."""
        return self.boundary is None or position - self.shift < self.boundary

    def key(self, position: int) -> tuple[int, int]:
        """(file bit offset of the block holding `position`, offset inside its data)."""
        i = max(0, bisect.bisect_right(self._starts, position) - 1)
        return self._bits[i], position - self._starts[i]

    def _blocks(self) -> None:
        """The library's map of the blocks read so far (end-of-stream markers included:
        they share the decoded offset of the block after them, which sorts last)."""
        pairs = sorted(
            (decoded, bits + self.start_bits) for bits, decoded in self._file.available_block_offsets().items()
        )
        self._starts = [decoded for decoded, _ in pairs]
        self._bits = [bits for _, bits in pairs]

    def _where(self) -> str:
        at = self._bits[-1] // 8 if self._bits else self.start_bits // 8 + len(_HEAD)
        return f"the bzip2 block at or after compressed byte {at}"  # the block being read or the next

    def read(self, size: int = -1) -> bytes:
        if self.paused:
            return b""
        if self._past:  # finishing a record past the range: small reads
            size = min(size if size and size > 0 else _READ, _READ)
        if self._pending:
            data, self._pending = self._pending[:size], self._pending[size:]
            return data
        try:
            data = self._file.read(min(size, _READ) if size and size > 0 else _READ)
        except Exception as exc:  # noqa: BLE001 - the library raises RuntimeError/ValueError on damaged data
            self._blocks()
            raise OSError(f"in {self._where()}: {_short(exc)}") from None
        if not data:
            return b""
        begin = self.decompressed
        self.decompressed += len(data)
        block = self._file.tell_compressed()
        if block != self._block:  # a block was entered: the library's map has grown
            self._block = block
            self._blocks()
        if self.boundary is None and self.stop_bits is not None:
            # the library may list the next block before its data is read: the boundary can lie ahead
            self.boundary = next((s for s, b in zip(self._starts, self._bits) if b >= self.stop_bits), None)
        if self.boundary is not None and not self._past and self.decompressed > self.boundary:
            self._past = True
            cut = max(0, self.boundary - begin)
            data, self._pending = data[:cut], data[cut:]
            self.paused = True
        return data


class _Gzip:
    """Python's gzip over `raw`, whose errors (a cut or damaged member) become OSError
    naming the compressed byte reached. It reads every member of the file, checks each
    member's CRC-32 and length, and holds only zlib's 32 KiB window and its read buffer, so
    its memory does not grow with the file."""

    def __init__(self, raw: BinaryIO):
        self.raw = raw
        self.file = gzip.GzipFile(fileobj=raw)

    def read(self, size: int = -1) -> bytes:
        try:
            return self.file.read(size)
        except (OSError, EOFError, zlib.error) as exc:
            try:
                at = f" before compressed byte {self.raw.tell()}"
            except (OSError, AttributeError):
                at = ""
            raise OSError(f"gzip data{at}: {_short(exc)}") from None

    def close(self) -> None:
        self.file.close()


def open_gzip(raw: BinaryIO) -> _Gzip:
    """A gzip file's decompressed bytes (`read`, `close`), front to back."""
    return _Gzip(raw)
