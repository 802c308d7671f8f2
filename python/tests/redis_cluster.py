"""A real Redis Cluster of redis-server processes on loopback ports, for the shared-tier tests.

The same procedure as the C++ tests' LocalCluster (src/shared/local_cluster.cpp,
LocalCluster::start / assemble / wait_ready), restated with a few lines of RESP: N masters on
free ports (each port and its cluster bus port + 10000 free), each owning an equal share of
the 16384 slots (CLUSTER ADDSLOTSRANGE, SET-CONFIG-EPOCH), MEET to the first node, then wait
until every node says cluster_state:ok with every slot assigned. stop() kills and reaps every
node it started and removes its temp dir.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SLOTS = 16384


def redis_server() -> str | None:
    """The redis-server program on PATH, or None."""
    return shutil.which("redis-server")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _encode(args) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class _Reader:
    def __init__(self, sock):
        self.sock, self.buf = sock, b""

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise ConnectionError("connection closed")
                self.buf += chunk
            data, self.buf = self.buf[:n], self.buf[n + 2:]
            return data.decode(errors="replace")
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise RuntimeError(f"unexpected RESP reply {line!r}")


def command(port: int, *args, timeout: float = 2.0):
    """Runs one command on the node at 127.0.0.1:port; an error reply raises RuntimeError."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(_encode(args))
        return _Reader(s).reply()


def _info_field(text: str, name: str) -> str:
    for line in text.splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    return ""


class LocalCluster:
    def __init__(self, masters: int = 3, start_timeout: float = 30.0):
        server = redis_server()
        if server is None:
            raise RuntimeError("redis-server not found on PATH (Debian: apt-get install "
                               "redis-server)")
        self.dir = Path(tempfile.mkdtemp(prefix="radixtier-pyredis-"))
        self.procs: list[subprocess.Popen] = []
        self.ports: list[int] = []
        try:
            self._spawn(server, masters)
            self._assemble(start_timeout)
        except BaseException:
            self.stop()
            raise

    @property
    def seeds(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.ports]

    def _spawn(self, server: str, n: int) -> None:
        rng = random.Random()
        for _ in range(8):
            base = rng.randint(20000, 50000 - n)
            ports = list(range(base, base + n))
            if not all(_port_free(p) and _port_free(p + 10000) for p in ports):
                continue
            procs = []
            for p in ports:
                log = open(self.dir / f"node-{p}.log", "wb")
                procs.append(subprocess.Popen(
                    [server, "--port", str(p), "--cluster-enabled", "yes",
                     "--cluster-config-file", f"nodes-{p}.conf", "--cluster-node-timeout", "1000",
                     "--cluster-require-full-coverage", "no", "--save", "", "--appendonly", "no",
                     "--bind", "127.0.0.1", "--dir", str(self.dir), "--daemonize", "no",
                     "--maxmemory-policy", "allkeys-lru"],
                    stdout=log, stderr=subprocess.STDOUT))
                log.close()
            self.procs, self.ports = procs, ports
            if self._all_answer(10.0):
                return
            self._kill()  # a port taken meanwhile: try others
        raise RuntimeError(f"could not start {n} redis-server nodes (logs in {self.dir})")

    def _all_answer(self, timeout: float) -> bool:
        until = time.monotonic() + timeout
        for proc, port in zip(self.procs, self.ports):
            while True:
                if proc.poll() is not None:
                    return False
                try:
                    if command(port, "PING") == "PONG":
                        break
                except OSError:
                    pass
                if time.monotonic() > until:
                    return False
                time.sleep(0.05)
        return True

    def _assemble(self, timeout: float) -> None:
        n = len(self.ports)
        for m, port in enumerate(self.ports):
            first, last = m * SLOTS // n, (m + 1) * SLOTS // n - 1
            command(port, "CLUSTER", "ADDSLOTSRANGE", first, last)
            command(port, "CLUSTER", "SET-CONFIG-EPOCH", m + 1)
        for port in self.ports[1:]:
            command(port, "CLUSTER", "MEET", "127.0.0.1", self.ports[0])
        until = time.monotonic() + timeout
        for port in self.ports:
            while True:
                info = command(port, "CLUSTER", "INFO")
                if (_info_field(info, "cluster_state") == "ok"
                        and _info_field(info, "cluster_slots_assigned") == str(SLOTS)
                        and _info_field(info, "cluster_known_nodes") == str(n)):
                    break
                if time.monotonic() > until:
                    raise RuntimeError(f"redis node {port} not ready after {timeout} s: {info}")
                time.sleep(0.05)

    def dbsize(self) -> int:
        return sum(int(command(p, "DBSIZE")) for p in self.ports)

    def _kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self.procs, self.ports = [], []

    def stop(self) -> None:
        self._kill()
        shutil.rmtree(self.dir, ignore_errors=True)
