"""A loopback port that is not sshd, for the tests of what the SSH transport says of one."""

from __future__ import annotations

import socket
import threading

HTTP_REPLY = b"HTTP/1.1 400 Bad Request\r\n\r\n"


class OneShotServer:
    """A loopback port whose every connection gets `reply` and is then closed (None: held
    open, silent)."""

    def __init__(self, reply):
        self.reply = reply
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        self.held = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self.reply is None:
                self.held.append(conn)
                continue
            conn.sendall(self.reply)
            conn.close()

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()
