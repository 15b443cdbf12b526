"""Throwaway servers configured with auth and TLS, for the transport-security tests.

Each runs on a free loopback port, with its files in a temporary directory,
under ``setpriv --pdeathsig KILL`` (it dies with the test process), and is
signalled only by the pid started here; the machine's shared Redis,
PostgreSQL and ZooKeeper are never touched. Certificates come from a
throwaway CA made with the ``openssl`` command line.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from celery_fencing.testing import redis_server
from celery_fencing.testing.processes import accepts_connections
from celery_fencing.testing.servers import START_TIMEOUT, ServerProcess
from tests.fixtures import zookeeper as zk

HOST = "127.0.0.1"
# The newest PostgreSQL installed (Debian keeps each major version apart); 15 on the development machine.
PG_BIN = max(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name), default=Path("/nonexistent"))


def _setpriv(*extra: str) -> list[str]:
    setpriv = shutil.which("setpriv")
    return [setpriv, *extra, "--pdeathsig", "KILL"] if setpriv else []


@dataclass(frozen=True)
class Certs:
    """A throwaway CA, a server certificate for 127.0.0.1/localhost and a client certificate (all PEM)."""

    ca: Path
    server_cert: Path
    server_key: Path
    server_bundle: Path  # PKCS#8 key followed by the certificate, as ZooKeeper's PEM key store wants it
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here: trusting it must fail


def make_certs(directory: Path) -> Certs:
    """Create the CA and certificates in *directory* with the openssl command line."""
    directory.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=120)

    for ca in ("ca", "other-ca"):
        openssl(
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{ca}.key",
            "-out",
            f"{ca}.pem",
            "-days",
            "2",
            "-subj",
            f"/CN=celery-fencing test {ca}",
        )
    for name in ("server", "client"):
        openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN={name}",
        )
        (directory / f"{name}.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n")
        openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
        )
    openssl("pkcs8", "-topk8", "-nocrypt", "-in", "server.key", "-out", "server.pk8")
    bundle = directory / "server-bundle.pem"
    bundle.write_bytes((directory / "server.pk8").read_bytes() + (directory / "server.pem").read_bytes())
    for path in directory.iterdir():
        path.chmod(0o644)
    for key in ("server.key", "client.key", "server.pk8", "ca.key", "other-ca.key", "server-bundle.pem"):
        (directory / key).chmod(0o600)
    return Certs(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        server_bundle=bundle,
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
        other_ca=directory / "other-ca.pem",
    )


class TLSZooKeeperServer(zk.ZooKeeperServer):
    """A standalone ZooKeeper with a ``secureClientPort`` (Netty, PEM key and trust stores, client certs required).

    The plain ``clientPort`` stays on loopback for the fixture's health checks
    (four-letter words); the tests connect to ``secure_port``. Debian's
    ZooKeeper jar lists netty's handler and transport on its class path but
    not netty-codec, which the TLS handler needs: its node's class path adds it.
    """

    EXTRA_CLASSPATH = ":/usr/share/java/netty-codec.jar:/usr/share/java/netty-resolver.jar"

    def __init__(self, certs: Certs) -> None:
        self.certs = certs
        self.secure_port = zk.free_ports(1)[0]
        super().__init__()

    def _make_node(self, port: int) -> zk.ZooKeeperNode:
        directory = self.directory / "node"
        config = zk._base_config(directory / "data", port, tick_time=self.tick_time, force_sync=False)
        config += [
            f"secureClientPort={self.secure_port}",
            f"secureClientPortAddress={HOST}",
            "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
            f"ssl.keyStore.location={self.certs.server_bundle}",
            "ssl.keyStore.type=PEM",
            f"ssl.trustStore.location={self.certs.ca}",
            "ssl.trustStore.type=PEM",
            "ssl.clientAuth=need",
        ]
        classpath = zk.CLASSPATH + self.EXTRA_CLASSPATH
        return zk.ZooKeeperNode(directory, port, "\n".join(config) + "\n", heap=self.heap, classpath=classpath)

    @property
    def secure_hosts(self) -> str:
        return f"{HOST}:{self.secure_port}"


class RedisServer(redis_server.RedisServer):
    """A redis-server with ACL users (the default user off) and TLS only (``port 0``)."""

    def __init__(self, certs: Certs, users: dict[str, str]) -> None:
        super().__init__()
        self.certs = certs
        lines = [
            f"bind {HOST}",
            "port 0",
            f"tls-port {self.port}",
            f"tls-cert-file {certs.server_cert}",
            f"tls-key-file {certs.server_key}",
            f"tls-ca-cert-file {certs.ca}",
            "tls-auth-clients optional",
            f"dir {self.directory}",
            'save ""',
            "appendonly no",
            "user default off",
            *(f"user {name} on >{password} ~* &* +@all" for name, password in users.items()),
        ]
        (self.directory / "redis.conf").write_text("\n".join(lines) + "\n")

    def command(self) -> list[str]:
        return [redis_server.REDIS_SERVER, str(self.directory / "redis.conf")]

    def serving(self) -> bool:
        return accepts_connections(self.port)  # TLS only: a plain PING gets no answer


class PostgresServer(ServerProcess):
    """A PostgreSQL cluster that takes TLS connections only (``hostnossl ... reject``), with password auth.

    ``initdb`` and ``postgres`` run as the ``postgres`` system user (PostgreSQL
    refuses to run as root), from a temporary directory it owns.
    """

    def __init__(self, certs: Certs, users: dict[str, str]) -> None:
        directory = Path(tempfile.mkdtemp(prefix="pg-tls-"))
        super().__init__(directory, directory / "postgres.log")
        self.certs = certs
        self.users = users
        self.data = self.directory / "data"
        self.tls = self.directory / "tls"
        self.port = zk.free_ports(1)[0]

    def describe(self) -> str:
        return f"postgres on port {self.port}"

    def _as_postgres(self, *command: str) -> list[str]:
        return [*_setpriv("--reuid=postgres", "--regid=postgres", "--init-groups"), *command]

    def start(self) -> None:
        tls = self.tls
        tls.mkdir()
        for source, name in ((self.certs.server_cert, "server.pem"), (self.certs.server_key, "server.key")):
            shutil.copy(source, tls / name)
        shutil.copy(self.certs.ca, tls / "ca.pem")
        (tls / "server.key").chmod(0o600)
        shutil.chown(self.directory, "postgres", "postgres")
        for path in [tls, *tls.iterdir()]:
            shutil.chown(path, "postgres", "postgres")
        subprocess.run(
            self._as_postgres(
                str(PG_BIN / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
            ),
            check=True,
            capture_output=True,
            timeout=180,
            env={**os.environ, "LC_ALL": "C"},
        )
        (self.data / "pg_hba.conf").write_text(
            "local all all trust\nhostssl all all 127.0.0.1/32 scram-sha-256\nhostnossl all all 127.0.0.1/32 reject\n"
        )
        self.launch()
        self.wait_serving()
        for name, password in self.users.items():
            self.psql(f"CREATE ROLE {name} LOGIN PASSWORD '{password}' SUPERUSER")

    def launch(self) -> None:
        tls = self.tls
        self._spawn(
            self._as_postgres(
                str(PG_BIN / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-k",
                str(self.directory),
                "-c",
                f"listen_addresses={HOST}",
                "-c",
                "ssl=on",
                "-c",
                f"ssl_cert_file={tls / 'server.pem'}",
                "-c",
                f"ssl_key_file={tls / 'server.key'}",
                "-c",
                f"ssl_ca_file={tls / 'ca.pem'}",
                "-c",
                "fsync=off",
            )
        )

    def wait_serving(self, timeout: float = START_TIMEOUT) -> None:
        self._wait_until(lambda: accepts_connections(self.port), timeout)

    def psql(self, sql: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            done = subprocess.run(
                self._as_postgres(
                    str(PG_BIN / "psql"),
                    "-h",
                    str(self.directory),
                    "-p",
                    str(self.port),
                    "-U",
                    "postgres",
                    "-d",
                    "postgres",
                    "-v",
                    "ON_ERROR_STOP=1",
                    "-c",
                    sql,
                ),
                capture_output=True,
                timeout=60,
                check=False,
            )
            if done.returncode == 0:
                return
            if time.monotonic() > deadline or b"starting up" not in done.stderr + done.stdout:
                raise RuntimeError(f"psql failed: {done.stderr.decode(errors='replace')}\n{self.log_tail()}")
            time.sleep(0.1)  # the server is still starting; psql is retried

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


@contextlib.contextmanager
def running(server: RedisServer | PostgresServer) -> Iterator[RedisServer | PostgresServer]:
    try:
        server.start()
        yield server
    finally:
        server.close()
