"""A TCP proxy the soak can cut: one worker reaches the database through it, and a "partition"
stops every byte in both directions without closing anything, as a dead switch or a pulled
cable would. The worker's statements hang (they are not refused: the connections look alive),
its renewals with them, and only its lease keeper's local deadline can tell it the lease is gone.
Healing lets the bytes through again."""

from __future__ import annotations

import contextlib
import select
import socket
import threading


class PartitionProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1"):
        self.target = (target_host, target_port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self._open = threading.Event()
        self._open.set()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="partition-proxy", daemon=True).start()

    def url(self, database: str) -> str:
        return f"mysql+pymysql://root@127.0.0.1:{self.port}/{database}"

    def cut(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    @property
    def cut_off(self) -> bool:
        return not self._open.is_set()

    def close(self) -> None:
        self._closed.set()
        self._open.set()
        with contextlib.suppress(OSError):
            self.listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while not self._closed.is_set():
                self._open.wait()  # while cut, nothing moves either way; buffers keep what arrived
                ready, _, _ = select.select([a, b], [], [], 0.2)
                for s in ready:
                    if not self._open.is_set():
                        break
                    data = s.recv(65536)
                    if not data:
                        return
                    peers[s].sendall(data)
        except OSError:
            return
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()
