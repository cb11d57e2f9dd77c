"""llama.cpp's RPC backend: a target whose layers run on other machines ("workers"), and
the worker that runs them.

``supports_rpc`` says whether the installed llama.cpp has the backend; ``parse_endpoints``
reads ``HOST:PORT[,HOST:PORT...]``. ``attach`` checks every worker (it must answer
llama.cpp's handshake with the same protocol version) and registers it with llama.cpp, once
per process; a model loaded afterwards with layers to offload places them on the workers
(llama.cpp puts RPC devices first and splits layers among them by their memory).
``serve_worker`` runs llama.cpp's RPC server on this machine's CPU.

llama.cpp aborts the whole process when an RPC connection breaks, and waits forever on a
worker that stops answering. So llama.cpp never talks to a worker directly: each worker gets
a relay on 127.0.0.1 that forwards bytes both ways. When a worker's side closes, or an
evaluation of a watched model has run longer than the timeout, the loss is reported once to
``on_lost`` and llama.cpp's side of the relay stays open: the blocked evaluation never
returns, but the process lives, so a front end can end the answer with an error and keep
what it has. After a loss the target must be neither used nor freed.

The relay's port is on 127.0.0.1, where any local program could connect. On Linux it
accepts only connections from this very process (``SO_PEERCRED`` answers for Unix sockets
only, so the peer's socket is looked up in ``/proc/net/tcp`` among this process's file
descriptors); others are closed unanswered. A worker is reached only once a connection has
carried llama.cpp's first bytes, and only such a connection can report a loss: a stray
connection that closes, or a worker that cannot be reached before anyone spoke, is no loss.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from localspec.backend.runtime import ensure_backend
from localspec.errors import BackendError, UsageError

REBUILD_HINT = (
    "this llama-cpp-python was built without llama.cpp's RPC backend; run scripts/setup.sh, "
    "or rebuild it: CMAKE_ARGS=-DGGML_RPC=ON pip install --force-reinstall --no-cache-dir "
    "--no-deps llama-cpp-python"
)
DEFAULT_TIMEOUT = 120.0  # seconds one evaluation may wait on the workers
DEFAULT_PORT = 50052  # llama.cpp's rpc-server default
CONNECT_TIMEOUT = 5.0
_CMD_HELLO = 14  # fixed for every protocol version
_CAPS_SIZE = 24  # rpc_msg_hello_req.conn_caps in protocol 7
_PROTOCOL = (7, 0)  # the RPC protocol of the llama.cpp this package builds
_CHUNK = 1 << 20
_DEVICE_TYPE_CPU = 0


def supports_rpc() -> bool:
    # llama_cpp is imported where it is used: ``localspec --help`` imports this module for
    # its option defaults, and llama_cpp loads its shared libraries on import.
    import llama_cpp

    return bool(llama_cpp.llama_supports_rpc())


def require_rpc() -> None:
    if not supports_rpc():
        raise BackendError(
            "--rpc needs llama.cpp's RPC backend, which this installation lacks", REBUILD_HINT
        )


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_endpoint(text: str) -> Endpoint:
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(
            f"invalid RPC worker {text.strip()!r}", "write HOST:PORT, e.g. 192.168.1.7:50052"
        )
    return Endpoint(host, int(port))


def parse_endpoints(text: str | list[str]) -> list[Endpoint]:
    """``"a:1,b:2"`` (or a list of such strings) -> endpoints, in order, without repeats."""
    parts = [p for item in ([text] if isinstance(text, str) else text) for p in item.split(",")]
    endpoints: list[Endpoint] = []
    for part in parts:
        if part.strip():
            endpoint = parse_endpoint(part)
            if endpoint not in endpoints:
                endpoints.append(endpoint)
    if not endpoints:
        raise UsageError("--rpc names no worker", "write HOST:PORT[,HOST:PORT...]")
    return endpoints


def handshake(endpoint: Endpoint, timeout: float = CONNECT_TIMEOUT) -> tuple[int, int, int]:
    """Say hello to a worker as llama.cpp does -> its protocol version, or BackendError."""
    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout) as sock:
            sock.sendall(struct.pack("<BQ", _CMD_HELLO, _CAPS_SIZE) + bytes(_CAPS_SIZE))
            head = _recv_exactly(sock, 8)
            (size,) = struct.unpack("<Q", head)
            reply = _recv_exactly(sock, min(size, 64))
    except TimeoutError:
        raise BackendError(
            f"RPC worker {endpoint} accepted the connection but did not answer within "
            f"{timeout:g} s",
            "a worker serves one client at a time: is another process using it?",
        ) from None
    except (OSError, EOFError) as err:
        reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
        raise BackendError(
            f"cannot reach RPC worker {endpoint}: {reason}",
            f"start it there with: localspec worker --host HOST --port {endpoint.port}",
        ) from None
    if len(reply) < 3:
        raise BackendError(f"{endpoint} is not an RPC worker (it answered {reply!r})", "")
    version = (reply[0], reply[1], reply[2])
    if version[0] != _PROTOCOL[0] or version[1] > _PROTOCOL[1]:
        raise BackendError(
            f"RPC worker {endpoint} speaks protocol {'.'.join(map(str, version))}, this "
            f"localspec {_PROTOCOL[0]}.{_PROTOCOL[1]}",
            "install the same localspec and llama-cpp-python versions on every machine",
        )
    return version


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            raise EOFError("the worker closed the connection")
        data += part
    return bytes(data)


class Watched(Protocol):
    """A model whose evaluations the link times: ``busy_since`` is the monotonic time the
    running evaluation started, or None between evaluations."""

    @property
    def busy_since(self) -> float | None: ...


class _Relay:
    """Forwards llama.cpp's connections to one worker (see the module docstring)."""

    def __init__(self, worker: Endpoint, lost: Callable[[str], None]) -> None:
        self.worker = worker
        self._lost = lost
        self._held: list[socket.socket] = []  # llama.cpp's sides, never closed by us
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.local = Endpoint("127.0.0.1", self._listener.getsockname()[1])
        threading.Thread(target=self._accept, name=f"rpc relay {worker}", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if peer_is_this_process(client) is False:
                _close(client)  # another program on this machine: not llama.cpp's
                continue
            threading.Thread(target=self._pair, args=(client,), daemon=True).start()

    def _pair(self, client: socket.socket) -> None:
        buf = bytearray(_CHUNK)
        try:
            first = client.recv_into(buf)
        except OSError:
            first = 0
        if first == 0:  # closed before saying anything: nothing of llama.cpp's was lost
            _close(client)
            return
        self._held.append(client)  # from here llama.cpp's side is never closed by us
        try:
            worker = socket.create_connection(
                (self.worker.host, self.worker.port), timeout=CONNECT_TIMEOUT
            )
        except OSError as err:
            self._lost(f"cannot reach RPC worker {self.worker}: {err.strerror or err}")
            return
        worker.settimeout(None)
        for sock in (client, worker):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        worker.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        ended = threading.Event()  # set when llama.cpp closed its side: not a loss
        args = (client, worker, ended, bytes(buf[:first]))
        threading.Thread(target=self._to_worker, args=args, daemon=True).start()
        self._to_client(worker, client, ended)

    def _to_worker(
        self, client: socket.socket, worker: socket.socket, ended: threading.Event, first: bytes
    ) -> None:
        try:
            worker.sendall(first)
        except OSError as err:
            self._lost(f"lost RPC worker {self.worker}: {err.strerror or err}")
            return
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while True:
            try:
                n = client.recv_into(buf)
            except OSError:
                n = 0
            if n == 0:  # llama.cpp closed the connection: the model was freed
                ended.set()
                _close(worker)
                return
            try:
                worker.sendall(view[:n])
            except OSError as err:
                self._lost(f"lost RPC worker {self.worker}: {err.strerror or err}")
                return

    def _to_client(self, worker: socket.socket, client: socket.socket, ended: threading.Event):
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while True:
            try:
                n = worker.recv_into(buf)
                reason = "it closed the connection"
            except OSError as err:
                n, reason = 0, err.strerror or str(err)
            if n == 0:
                if not ended.is_set():
                    self._lost(f"lost RPC worker {self.worker}: {reason}")
                return
            try:
                client.sendall(view[:n])
            except OSError:
                return


class _Workers:
    """The process's relays (llama.cpp keeps registered devices for the process's life) and
    the current link's loss handler."""

    def __init__(self) -> None:
        self.relays: dict[Endpoint, _Relay] = {}
        self.lock = threading.Lock()
        self.lost: str | None = None
        self.link: RpcLink | None = None

    def report(self, message: str) -> None:
        with self.lock:
            if self.lost is not None:
                return
            self.lost = message
            link = self.link
        if link is not None:
            link.on_lost(message)


_WORKERS = _Workers()


class RpcLink:
    """The workers a session's target runs on; see the module docstring."""

    def __init__(
        self, endpoints: list[Endpoint], timeout: float, on_lost: Callable[[str], None]
    ) -> None:
        self.endpoints = endpoints
        self.timeout = timeout
        self.on_lost = on_lost
        self._watched: list[Watched] = []
        self._stop = threading.Event()

    @property
    def lost(self) -> str | None:
        """Why the workers were lost, or None while they serve."""
        return _WORKERS.lost

    def watch(self, model: Watched) -> None:
        """Time ``model``'s evaluations: one longer than the timeout is a loss."""
        self._watched.append(model)
        if len(self._watched) == 1:
            threading.Thread(target=self._watchdog, name="rpc watchdog", daemon=True).start()

    def _watchdog(self) -> None:
        while not self._stop.wait(min(0.25, self.timeout / 4)):
            now = time.monotonic()
            for model in self._watched:
                since = model.busy_since
                if since is not None and now - since > self.timeout:
                    _WORKERS.report(
                        f"the RPC workers ({', '.join(map(str, self.endpoints))}) did not "
                        f"answer for {self.timeout:g} s"
                    )
                    return

    def close(self) -> None:
        """Stop timing (the relays stay: llama.cpp keeps its devices for the process)."""
        self._stop.set()
        if _WORKERS.link is self:
            _WORKERS.link = None


def attach(endpoints: list[Endpoint], timeout: float, on_lost: Callable[[str], None]) -> RpcLink:
    """Check and register ``endpoints`` with llama.cpp (each once per process) -> the link
    that reports their loss to ``on_lost``. BackendError names a worker that does not
    answer, or an installation without the RPC backend."""
    require_rpc()
    if _WORKERS.lost is not None:
        raise BackendError(f"this process lost its RPC workers: {_WORKERS.lost}", "start again")
    new = [e for e in endpoints if e not in _WORKERS.relays]
    for endpoint in new:
        handshake(endpoint)
    ensure_backend()
    add_server = _rpc_function(
        "ggml_backend_rpc_add_server", ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)
    )
    lib = _ggml()
    for endpoint in new:
        relay = _Relay(endpoint, _WORKERS.report)
        _WORKERS.relays[endpoint] = relay
        reg = add_server(str(relay.local).encode())
        if not reg:
            raise BackendError(f"llama.cpp could not add RPC worker {endpoint}", "")
        lib.ggml_backend_register(ctypes.c_void_p(reg))
    link = RpcLink(endpoints, timeout, on_lost)
    _WORKERS.link = link
    return link


def serve_worker(host: str, port: int, threads: int) -> None:
    """Run llama.cpp's RPC server for this machine's CPU on ``host:port``; blocks for the
    life of the process (it serves one client at a time, one after another)."""
    require_rpc()
    try:  # llama.cpp only prints that it could not bind; say why first
        with socket.create_server((host, port)):
            pass
    except OSError as err:
        raise BackendError(
            f"cannot listen on {Endpoint(host, port)}: {err.strerror or err}",
            "pick another --port, or stop what uses this one",
        ) from None
    # The worker prints llama.cpp's log lines as llama-cpp-python does, uncaptured.
    ensure_backend(capture_log=False)
    start = _rpc_function(
        "ggml_backend_rpc_start_server",
        ctypes.CFUNCTYPE(
            None,
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_void_p),
        ),
    )
    lib = _ggml()
    cpu = lib.ggml_backend_dev_by_type(_DEVICE_TYPE_CPU)
    if not cpu:
        raise BackendError("llama.cpp has no CPU device", "")
    devices = (ctypes.c_void_p * 1)(cpu)
    start(str(Endpoint(host, port)).encode(), None, threads, 1, devices)
    raise BackendError(f"llama.cpp's RPC server on {Endpoint(host, port)} stopped", "")


def peer_is_this_process(conn: socket.socket) -> bool | None:
    """Whether the other end of a loopback TCP connection is a socket of this process:
    Linux lists every TCP socket with its inode in ``/proc/net/tcp``, and this process's
    sockets among its file descriptors. None where that cannot be told (no ``/proc``)."""
    try:
        peer = conn.getpeername()[:2]
        ours = conn.getsockname()[:2]
        with open("/proc/net/tcp6" if conn.family == socket.AF_INET6 else "/proc/net/tcp") as fh:
            lines = fh.readlines()[1:]
    except OSError:
        return None
    wanted = (_proc_address(conn.family, *peer), _proc_address(conn.family, *ours))
    inode = None
    for line in lines:
        fields = line.split()
        if len(fields) > 9 and (fields[1], fields[2]) == wanted:
            inode = fields[9]
            break
    if inode is None:
        return False  # gone already, or not a local socket
    target = f"socket:[{inode}]"
    try:
        descriptors = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for fd in descriptors:
        with contextlib.suppress(OSError):  # closed while we look
            if os.readlink(f"/proc/self/fd/{fd}") == target:
                return True
    return False


def _proc_address(family: int, host: str, port: int) -> str:
    """An address as ``/proc/net/tcp`` writes it: the address's bytes as native-order
    32-bit words in hex, then the port in hex."""
    raw = socket.inet_pton(family, host)
    words = struct.unpack(f"={len(raw) // 4}I", raw)
    return "".join(f"{w:08X}" for w in words) + f":{port:04X}"


def _close(sock: socket.socket) -> None:
    # shutdown first: a plain close leaves the other thread's recv blocked and sends no FIN
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def _ggml() -> ctypes.CDLL:
    """ggml's backend registry as llama.cpp sees it. The wheel ships libggml under two file
    names (copies, not links), and ``llama_cpp._ggml`` loads the one llama.cpp does not: its
    registry would be a second one, whose devices no model ever sees. Symbols looked up
    through libllama's handle resolve in the libggml libllama itself links."""
    from llama_cpp import llama_cpp as bindings

    lib = bindings._lib
    lib.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    lib.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_backend_register.restype = None
    lib.ggml_backend_register.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    lib.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    return lib


def _rpc_function(name: str, prototype):
    lib = _ggml()
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise BackendError("llama.cpp's RPC backend is not registered", REBUILD_HINT)
    address = lib.ggml_backend_reg_get_proc_address(reg, name.encode())
    if not address:
        raise BackendError(f"llama.cpp's RPC backend has no {name}", REBUILD_HINT)
    return prototype(address)
