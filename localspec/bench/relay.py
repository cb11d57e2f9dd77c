"""A slower link to an RPC worker, for the bench: ``--rpc-delay MS``.

``DelayRelay(worker, rtt_ms)`` listens on 127.0.0.1 (an unused port: ``address``) and
forwards every connection to ``worker`` (``HOST:PORT``), delivering each chunk of bytes half
the round-trip delay after it arrived, in each direction and in order, as ``tc netem delay``
would on a link: a round trip costs ``rtt_ms`` more, whatever the chunks' sizes (delay, not
bandwidth: chunks in flight overlap). Nothing leaves the connections it is given. ``close``
stops listening and ends the connections under way; ``relayed(endpoints, rtt_ms)`` starts one
relay per worker.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import deque
from collections.abc import Sequence

from localspec.backend.rpc import parse_endpoint

CHUNK = 1 << 20


class DelayRelay:
    """Forwards 127.0.0.1:``port`` to a worker with an added round-trip delay."""

    def __init__(self, worker: str, rtt_ms: float) -> None:
        endpoint = parse_endpoint(worker)
        self.worker = (endpoint.host, endpoint.port)
        self.half = rtt_ms / 2000.0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        # Connections under way, and how many of their two directions have ended.
        self._open: dict[tuple[socket.socket, socket.socket], int] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            try:
                worker = socket.create_connection(self.worker)
            except OSError:  # the worker refused: the client sees its connection end
                client.close()
                continue
            pair = (client, worker)
            with self._lock:
                self._open[pair] = 0
            for sock in pair:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for src, dst in ((client, worker), (worker, client)):
                queue: deque[tuple[float, bytes]] = deque()
                ready = threading.Condition()
                threading.Thread(target=self._read, args=(src, queue, ready), daemon=True).start()
                threading.Thread(
                    target=self._write, args=(dst, queue, ready, pair), daemon=True
                ).start()

    def _read(self, src: socket.socket, queue: deque, ready: threading.Condition) -> None:
        """Every chunk of ``src`` with the time it is due; an empty one at its end."""
        while True:
            try:
                data = src.recv(CHUNK)
            except OSError:
                data = b""
            with ready:
                queue.append((time.monotonic() + self.half, data))
                ready.notify()
            if not data:
                return

    def _write(
        self,
        dst: socket.socket,
        queue: deque,
        ready: threading.Condition,
        pair: tuple[socket.socket, socket.socket],
    ) -> None:
        """Each chunk to ``dst`` once due; at an end, both sides end (their reads wake, and
        the other direction ends too), and once both directions have, the sockets close."""
        while True:
            with ready:
                while not queue:
                    ready.wait()
                due, data = queue.popleft()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if data:
                try:
                    dst.sendall(data)
                    continue
                except OSError:
                    pass
            _shut(pair)
            with self._lock:
                self._open[pair] += 1
                if self._open[pair] == 2:
                    del self._open[pair]
                    for sock in pair:
                        sock.close()
            return

    def close(self) -> None:
        """Stop listening, and end every connection under way."""
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self.listener.close()
        with self._lock:
            for pair in self._open:
                _shut(pair)


def _shut(pair: tuple[socket.socket, socket.socket]) -> None:
    for sock in pair:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def relayed(endpoints: Sequence[str], rtt_ms: float) -> list[DelayRelay]:
    """One relay per worker, in order; each one's ``address`` stands for its worker."""
    relays: list[DelayRelay] = []
    try:
        for endpoint in endpoints:
            relays.append(DelayRelay(endpoint, rtt_ms))
    except OSError:
        for relay in relays:
            relay.close()
        raise
    return relays
