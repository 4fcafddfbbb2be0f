"""An object store that goes down and comes back, for tests: a TCP forwarder in front of it.

`Forwarder(port)` listens on 127.0.0.1:<a free port> and pipes every connection to
127.0.0.1:<port> (the moto server). `down()` resets every open connection (what a client
sees when the store dies mid-request) and closes the port, so new connections are refused;
`up()` listens again on the same port. `cut_answers(n)` keeps the port open but resets
every connection once it has passed `n` bytes of the store's answer (a store, or a proxy
in front of it, whose connections die mid-answer: the client has the status line and
headers, then part of the body; `cuts` counts them); `cut_answers(None)` passes answers
whole again. The server behind it keeps running, so its data stays as it was. Use it as a
context manager: leaving stops it (and its threads). `outage_when(store, ready, seconds)`
takes it down for a while once `ready()` holds.

An answer the store ends normally reaches the client whole: the end is passed on after
the bytes still queued for the client (moto closes each connection after its answer; a
reset there would drop the tail of a large answer that a busy client had not read yet).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

from processes import free_port


class Forwarder:
    def __init__(self, target_port: int):
        self.target = ("127.0.0.1", target_port)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._cut_after: int | None = None
        self.cuts = 0

    def __enter__(self) -> Forwarder:
        self.up()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def is_up(self) -> bool:
        return self._listener is not None

    def up(self) -> None:
        with self._lock:
            if self._listener is not None:
                return
            self._listener = socket.create_server(("127.0.0.1", self.port))  # SO_REUSEADDR: the same port at once
            self._listener.settimeout(0.1)  # accept() wakes to notice down()
            self._start(self._accept, self._listener)

    def down(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            connections, self._open = self._open, set()
        if listener is not None:
            listener.close()
        for sock in connections:
            _reset(sock)

    def cut_answers(self, after_bytes: int | None) -> None:
        """Reset each connection once `after_bytes` of its answer have passed (None: never)."""
        self._cut_after = after_bytes

    def stop(self) -> None:
        self.down()
        for thread in self._threads:
            thread.join(timeout=5)

    def _start(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name="outage-forwarder")
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed by down()
                return
            client.settimeout(None)
            try:
                server = socket.create_connection(self.target, timeout=5)
                server.settimeout(None)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                if self._listener is not listener:  # went down meanwhile
                    _reset(client)
                    _reset(server)
                    return
                self._open |= {client, server}
                self._start(self._pipe, client, server)
                self._start(self._pipe, server, client, True)

    def _pipe(self, source: socket.socket, sink: socket.socket, answer: bool = False) -> None:
        """Copy bytes one way until either side ends, then close both: with a reset when a
        side failed or the answer is cut (`cut_answers`), else after what is queued."""
        passed, ended = 0, False
        try:
            while data := source.recv(1 << 16):
                if answer and self._cut_after is not None and passed + len(data) > self._cut_after:
                    sink.sendall(data[: max(0, self._cut_after - passed)])
                    with self._lock:
                        self.cuts += 1
                    break
                sink.sendall(data)
                passed += len(data)
            else:
                ended = True
        except OSError:
            pass
        with self._lock:
            ours = {source, sink} & self._open
            self._open -= ours
        for sock in ours:
            (_close if ended else _reset)(sock)


def _close(sock: socket.socket) -> None:
    """Close after the bytes still queued for the peer, waking a thread blocked in recv on it."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset (no lingering), waking a thread blocked in recv on it."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


@contextlib.contextmanager
def outage_when(
    store: Forwarder, ready: Callable[[], bool], seconds: float, wait_s: float = 300
) -> Iterator[dict[str, float]]:
    """While the block runs, a thread takes `store` down for `seconds` once `ready()` holds
    (asked every 0.2 s, for at most `wait_s`). Yields what happened: `down_at` and `up_at`
    (time.monotonic()), empty when `ready()` never held. The store is up again when the
    block ends, whatever happened."""
    happened: dict[str, float] = {}
    over = threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + wait_s
        while not over.wait(0.2):
            if time.monotonic() > deadline:
                return
            if ready():
                store.down()
                happened["down_at"] = time.monotonic()
                over.wait(seconds)
                store.up()
                happened["up_at"] = time.monotonic()
                return

    thread = threading.Thread(target=watch, daemon=True, name="outage-watch")
    thread.start()
    try:
        yield happened
    finally:
        over.set()
        thread.join(timeout=10)
        store.up()
