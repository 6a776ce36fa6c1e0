"""The `host` tier's other end: a tiny page service that keeps opaque page bytes by key in its
own process (standard library only), and the client that a LinkStore on the board sends through.

    with PageService(capacity_bytes=2**30) as service:     # on the host, in a thread
        address = service.address                           # "127.0.0.1:PORT" (ephemeral)
        store = connect_store(address)                      # on the board (after forwarding)
        store.put(node_id, tensor); store.get(node_id)

It listens on 127.0.0.1 only; over SSH the host forwards a board-side port to it. The bytes are
whole codec pages (header + payload + CRC32), so the service needs no torch, and a page damaged
on the way back is caught by the LinkStore that decodes it.

Frames (little endian), one request then one reply per round trip:

    request  u8 op | u32 key length | u64 body length | key (UTF-8) | body
    reply    u8 status | u64 body length | body
    op       1 put (body: the page) | 2 get | 3 drop | 4 clear | 5 stats
    status   0 ok (get: the page; stats: JSON) | 1 missing | 2 full (body: why) | 3 error (why)
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from typing import Hashable

from .errors import PageMissing, PageStoreError, PageStoreFull

REQUEST = struct.Struct("<BIQ")
REPLY = struct.Struct("<BQ")
PUT, GET, DROP, CLEAR, STATS = 1, 2, 3, 4, 5
OK, MISSING, FULL, ERROR = 0, 1, 2, 3
MAX_KEY_BYTES = 4096
# How long a request waits for a lost page service to come back: the host's default reconnect
# window (reconnect_timeout_s, 120 s) plus the time it takes to forward the port again. The
# host passes its board's own window in the run job's `host_pages_wait_s` param.
WAIT_S = 150.0
FIRST_PAUSE_S, LONGEST_PAUSE_S = 0.05, 5.0
# A link that hangs (packets lost without a reset: no error ever comes) is noticed by time
# alone. A request waits at most REQUEST_FLOOR_S for the link to take its next bytes or give
# the next bytes of the reply, and for the reply's first byte REQUEST_FLOOR_S plus the time
# the request's bytes need at SLOWEST_LINK_BPS (a page sent may sit in the buffers along an
# SSH forward, a few MB, until the link has carried it). Before, one fixed 60 s socket
# timeout made a hung link cost a minute before the reconnect logic began.
REQUEST_FLOOR_S = 10.0
SLOWEST_LINK_BPS = 64 << 10  # 0.5 Mbit/s: below a Pi's weak Wi-Fi; an 8 MiB page: 138 s


class PageServiceError(PageStoreError):
    """The page service cannot be reached, or answered something that is not a reply."""


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if not k:
            raise ConnectionError("the other end closed the connection")
        got += k
    return bytes(buf)


def _no_delay(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass


# -- the service (host side) ----------------------------------------------------------------------

class PageService:
    """Pages by key in this process's memory, served on 127.0.0.1:PORT (0: an ephemeral port).

    bytes_held / peak_bytes / puts / gets say what it saw; close() (or `with` exit) stops it,
    closes every connection and forgets every page."""

    def __init__(self, capacity_bytes: int | None = None, host: str = "127.0.0.1",
                 port: int = 0):
        if capacity_bytes is not None and capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self._pages: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self.bytes_held = self.peak_bytes = self.puts = self.gets = 0
        self._listener = socket.create_server((host, port))
        self.host, self.port = self._listener.getsockname()[:2]
        self._conns: set[socket.socket] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="page-service", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            _no_delay(conn)
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(target=self.serve, args=(conn,), name="page-service-conn",
                             daemon=True).start()

    def serve(self, conn) -> None:
        """Answer requests on one connected socket (or socket-like object with sendall,
        recv_into and close) until it closes."""
        try:
            while True:
                try:
                    op, key_len, body_len = REQUEST.unpack(_recv_exact(conn, REQUEST.size))
                except (ConnectionError, OSError):
                    return
                if key_len > MAX_KEY_BYTES:
                    return  # not a client of ours: drop the connection
                key = _recv_exact(conn, key_len).decode("utf-8", "replace")
                body = _recv_exact(conn, body_len) if body_len else b""
                status, reply = self._handle(op, key, body)
                head = REPLY.pack(status, len(reply))
                if len(reply) < 65536:
                    conn.sendall(head + reply)  # one segment for small replies
                else:
                    conn.sendall(head)
                    conn.sendall(reply)
        except (ConnectionError, OSError):
            return
        finally:
            with self._lock:
                self._conns.discard(conn)
            try:
                conn.close()
            except OSError:
                pass

    def _handle(self, op: int, key: str, body: bytes) -> tuple[int, bytes]:
        with self._lock:
            if op == PUT:
                replaced = len(self._pages.get(key, b""))
                held = self.bytes_held - replaced + len(body)
                if self.capacity_bytes is not None and held > self.capacity_bytes:
                    return FULL, (f"the host page service holds {self.bytes_held} of its "
                                  f"{self.capacity_bytes}-byte capacity").encode()
                self._pages[key] = body
                self.bytes_held = held
                self.peak_bytes = max(self.peak_bytes, held)
                self.puts += 1
                return OK, b""
            if op == GET:
                data = self._pages.get(key)
                if data is None:
                    return MISSING, b""
                self.gets += 1
                return OK, data
            if op == DROP:
                data = self._pages.pop(key, None)
                if data is not None:
                    self.bytes_held -= len(data)
                return OK, b""
            if op == CLEAR:
                self._pages.clear()
                self.bytes_held = 0
                return OK, b""
            if op == STATS:
                return OK, json.dumps(self.stats_locked()).encode()
        return ERROR, f"unknown operation {op}".encode()

    def stats_locked(self) -> dict:
        return {"pages": len(self._pages), "bytes_held": self.bytes_held,
                "peak_bytes": self.peak_bytes, "puts": self.puts, "gets": self.gets,
                "capacity_bytes": self.capacity_bytes}

    def stats(self) -> dict:
        with self._lock:
            return self.stats_locked()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conns, self._conns = list(self._conns), set()
            self._pages.clear()
            self.bytes_held = 0
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "PageService":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- the client (board side) ----------------------------------------------------------------------

def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = str(address).rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"a page service address is HOST:PORT, got {address!r}")
    return host or "127.0.0.1", int(port)


class PageClient:
    """One connection to a PageService; send / fetch / drop plug into LinkStore.

    A request whose connection breaks (the SSH link under the forward dropped, the host is
    reconnecting) is sent again on a new connection, with growing pauses, until it gets a reply
    or `wait_s` has passed since the break; then it is a PageServiceError that says what to do.
    Sending a request again is safe: the service applies a request only once it has all of it
    (a half-sent page is thrown away with its connection), and every operation is idempotent
    (put replaces the page under its key with the same bytes, get/stats read, drop/clear of
    what is gone is a no-op), so a request that reached the host before the drop and is
    applied again changes nothing.

    A link that hangs rather than breaks (packets lost, no reset) counts as broken once a
    request stops moving: no bytes taken or given for `timeout_s`, or no reply begun within
    `timeout_s` plus its request's bytes at `slowest_bps` (REQUEST_FLOOR_S, SLOWEST_LINK_BPS).
    A slow link that moves bytes is never cut: each chunk it takes or gives restarts the clock.

    Once it has given up, every later request fails at once with the same error: the cleanup
    after it (dropping what is left) must not wait `wait_s` again for each page. `breaks`
    counts the requests whose connection broke, whether or not it came back (a measurement's
    times would hold that wait)."""

    def __init__(self, address: str, timeout_s: float = REQUEST_FLOOR_S, wait_s: float = WAIT_S,
                 slowest_bps: float = SLOWEST_LINK_BPS):
        self.address = address
        self.host, self.port = parse_address(address)
        self.timeout_s = timeout_s
        self.wait_s = wait_s
        self.slowest_bps = slowest_bps
        self.breaks = 0
        self.lost: BaseException | None = None  # the break it gave up on, once it has
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def connect(self) -> "PageClient":
        """Connect now, once: a service that is not there at the start is a setup error, not a
        dropped link, so it is reported at once rather than waited for."""
        with self._lock:
            try:
                self._connect()
            except OSError as exc:
                raise PageServiceError(f"cannot reach the host page service at {self.address}: "
                                       f"{exc}") from exc
        return self

    def _connect(self) -> socket.socket:
        if self._sock is None:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
            _no_delay(sock)
            self._sock = sock
        return self._sock

    def _drop_socket(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None

    def request(self, op: int, key: Hashable = "", body: bytes | memoryview = b"") \
            -> tuple[int, bytes]:
        raw_key = str(key).encode()
        head = REQUEST.pack(op, len(raw_key), len(body)) + raw_key
        with self._lock:
            if self.lost is not None:
                raise self._gave_up(self.lost)
            deadline, pause = None, 0.0
            while True:
                try:
                    return self._round_trip(head, body)
                except (ConnectionError, OSError) as exc:
                    self._drop_socket()
                    now = time.monotonic()
                    if deadline is None:
                        self.breaks += 1
                        deadline = now + self.wait_s
                    if now >= deadline:
                        self.lost = exc
                        raise self._gave_up(exc) from exc
                    time.sleep(min(pause, deadline - now))
                    pause = min(max(2 * pause, FIRST_PAUSE_S), LONGEST_PAUSE_S)

    def _round_trip(self, head: bytes, body: bytes | memoryview) -> tuple[int, bytes]:
        sock = self._connect()
        self._send(sock, head)
        if len(body):
            self._send(sock, body)
        # its bytes may still be on the way (buffers along a forward): time for them to cross
        first_s = self.timeout_s + (len(head) + len(body)) / self.slowest_bps
        status, length = REPLY.unpack(self._recv(sock, REPLY.size, first_s))
        return status, self._recv(sock, length, self.timeout_s) if length else b""

    def _send(self, sock: socket.socket, data: bytes | memoryview) -> None:
        """All of `data`, each send waiting at most timeout_s for the link to take more."""
        view = memoryview(data).cast("B")
        sock.settimeout(self.timeout_s)
        while len(view):
            try:
                view = view[sock.send(view):]
            except socket.timeout:
                raise TimeoutError(f"the link took no bytes of a request for "
                                   f"{self.timeout_s:g} s (a hung link?)") from None

    def _recv(self, sock: socket.socket, n: int, first_s: float) -> bytes:
        """n bytes: the first within first_s, each later chunk within timeout_s."""
        buf = bytearray(n)
        view = memoryview(buf)
        got, wait_s = 0, first_s
        while got < n:
            sock.settimeout(wait_s)
            try:
                k = sock.recv_into(view[got:], n - got)
            except socket.timeout:
                raise TimeoutError((f"no reply from the page service for {wait_s:.1f} s"
                                    if not got else f"the reply stopped for {wait_s:.1f} s")
                                   + " (a hung link?)") from None
            if not k:
                raise ConnectionError("the other end closed the connection")
            got += k
            wait_s = self.timeout_s
        return bytes(buf)

    def _gave_up(self, exc: BaseException) -> PageServiceError:
        return PageServiceError(
            f"lost the host page service at {self.address} and it did not come back within "
            f"{self.wait_s:g} s ({exc}). Remedy: check the link between the host and the board; "
            "if it drops for longer, raise reconnect_timeout_s in the board's device config "
            "(the board waits that long for the host's pages), or plan with --paging flash")

    def send(self, key: Hashable, data: bytes) -> None:
        status, reply = self.request(PUT, key, data)
        if status == FULL:
            raise PageStoreFull(key, f"the host page service at {self.address}", len(data),
                                cause=reply.decode(errors="replace"),
                                remedy="give the host page service more capacity, or plan "
                                       "with less paging to host")
        self._check(status, reply, key)

    def fetch(self, key: Hashable) -> bytes:
        status, reply = self.request(GET, key)
        if status == MISSING:
            raise KeyError(key)
        self._check(status, reply, key)
        return reply

    def drop(self, key: Hashable) -> None:
        self._check(*self.request(DROP, key), key)

    def clear(self) -> None:
        self._check(*self.request(CLEAR), "")

    def stats(self) -> dict:
        status, reply = self.request(STATS)
        self._check(status, reply, "")
        return json.loads(reply)

    def _check(self, status: int, reply: bytes, key: Hashable) -> None:
        if status == MISSING:
            raise PageMissing(key, f"the host page service at {self.address}")
        if status != OK:
            raise PageServiceError(f"the host page service at {self.address} refused: "
                                   f"{reply.decode(errors='replace')}")

    def close(self) -> None:
        with self._lock:
            self._drop_socket()
