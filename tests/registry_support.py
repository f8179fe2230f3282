"""A real schema registry for the tests: Apicurio Registry, run from Maven Central.

Apicurio Registry publishes its Quarkus application on Maven Central as
`io.apicurio:apicurio-registry-app:<version>:tar.gz:all` (a runner jar plus its lib/ folder). The
3.0.x line runs on Java 17 (3.3.x needs Java 21) and serves a Confluent-compatible API under
`/apis/ccompat/v7`, which is what confluent-kafka's SchemaRegistryClient speaks. Like the Kafka
fixture, it is resolved once with Maven into $EOS_HOME/apicurio/<version>, started on a free
loopback port with in-memory storage, and stopped when the session ends. No stand-in is used.

Apicurio Registry authenticates clients only through an OIDC server. To test eos's client
against a registry that demands credentials over TLS, `SecuredRegistry` puts a small reverse
proxy in front of it: a real HTTPS server (certificate from a CA made by the test, with the
`cryptography` package) that refuses requests without the right basic-auth password or bearer
token, and can play an outage (503) on demand. eos's client is what is under test; the proxy
only forwards.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import http.server
import os
import shutil
import signal
import ssl
import subprocess
import tarfile
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from eos.errors import EnvironmentProblem
from eos.paths import eos_home

APICURIO_VERSION = "3.0.9"
ARTIFACT = f"io.apicurio:apicurio-registry-app:{APICURIO_VERSION}:tar.gz:all"
CCOMPAT = "/apis/ccompat/v7"


@dataclass
class RunningRegistry:
    url: str  # the Confluent-compatible base URL, as pipelines write it in `registry:`
    process: subprocess.Popen
    log: Path


def fetch_apicurio() -> Path:
    """The folder holding the runner jar, fetched with Maven once."""
    home = eos_home() / "apicurio" / APICURIO_VERSION
    runner = home / f"apicurio-registry-app-{APICURIO_VERSION}-runner.jar"
    if (home / ".complete").exists():
        return home
    mvn = shutil.which("mvn")
    if not mvn:
        raise EnvironmentProblem("Maven (mvn) is needed once, to fetch Apicurio Registry for the registry tests")
    staging = Path(tempfile.mkdtemp(prefix="apicurio-", dir=eos_home()))
    try:
        cmd = [mvn, "-B", "-q", "dependency:copy", f"-Dartifact={ARTIFACT}", f"-DoutputDirectory={staging}"]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise EnvironmentProblem(f"could not fetch {ARTIFACT}:\n{(result.stdout + result.stderr)[-2000:]}")
        [archive] = staging.glob("*.tar.gz")
        with tarfile.open(archive) as tar:
            tar.extractall(staging / "app", filter="data")
        if home.exists():
            shutil.rmtree(home)
        home.parent.mkdir(parents=True, exist_ok=True)
        (staging / "app").rename(home)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if not runner.exists():
        raise EnvironmentProblem(f"{ARTIFACT} has no {runner.name}")
    (home / ".complete").write_text(APICURIO_VERSION)
    return home


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/subjects", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def running_apicurio(workdir: Path, timeout_s: float = 120) -> Iterator[RunningRegistry]:
    from eos_ops.localkafka import find_java, free_port

    home = fetch_apicurio()
    port = free_port()
    log = workdir / "apicurio.log"
    cmd = [
        find_java(), "-Xmx384m", "-XX:+UseSerialGC",
        f"-Dquarkus.http.port={port}", "-Dquarkus.http.host=127.0.0.1",
        "-jar", str(home / f"apicurio-registry-app-{APICURIO_VERSION}-runner.jar"),
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, cwd=workdir, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}{CCOMPAT}"
    started = time.monotonic()
    try:
        while not _answers(url):
            if process.poll() is not None:
                raise EnvironmentProblem(f"Apicurio Registry exited ({process.returncode}):\n{log.read_text()[-3000:]}")
            if time.monotonic() - started > timeout_s:
                raise EnvironmentProblem(
                    f"Apicurio Registry not ready in {timeout_s:.0f} s:\n{log.read_text()[-3000:]}"
                )
            time.sleep(0.5)
        print(f"Apicurio Registry {APICURIO_VERSION} ready at {url} in {time.monotonic() - started:.1f} s")
        yield RunningRegistry(url, process, log)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


# ---------------------------------------------------------------------------------------------
# TLS and credentials in front of the registry
# ---------------------------------------------------------------------------------------------


@dataclass
class TestCA:
    ca_file: Path  # PEM: what a client trusts
    cert_file: Path  # PEM: the server's certificate for 127.0.0.1 and localhost, signed by the CA
    key_file: Path


def make_ca(folder: Path) -> TestCA:
    """A CA and a server certificate signed by it, made now (valid for a day: eos_ops.tls)."""
    from eos_ops.tls import CertificateAuthority

    ca = CertificateAuthority("eos test CA", valid_days=1)
    key_pem, cert_pem = ca.issue(("127.0.0.1", "localhost"), "127.0.0.1")
    folder.mkdir(parents=True, exist_ok=True)
    tls = TestCA(folder / "ca.pem", folder / "server.pem", folder / "server-key.pem")
    tls.ca_file.write_bytes(ca.cert_pem)
    tls.cert_file.write_bytes(cert_pem)
    tls.key_file.write_bytes(key_pem)
    return tls


@dataclass
class SecuredRegistry:
    """An HTTPS proxy in front of a registry that lets in only the current credentials."""

    upstream: str  # the registry's base URL (http://host:port/apis/ccompat/v7)
    tls: TestCA
    users: dict[str, str] = field(default_factory=dict)  # username -> password (change to rotate)
    tokens: set[str] = field(default_factory=set)  # bearer tokens let in
    outage: int = 0  # answer this many more schema-by-id lookups with 503 (a registry outage)
    answered: Counter = field(default_factory=Counter)  # HTTP status -> how many were sent
    asked: Counter = field(default_factory=Counter)  # request path -> how many were let in
    url: str = ""  # https://127.0.0.1:<port>/apis/ccompat/v7, as pipelines write it
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def allowed(self, header: str | None) -> bool:
        if not header:
            return False
        kind, _, value = header.partition(" ")
        if kind == "Bearer":
            return value in self.tokens
        if kind == "Basic":
            user, _, password = base64.b64decode(value).decode().partition(":")
            return self.users.get(user) == password
        return False

    def take_outage(self, path: str) -> bool:
        with self._lock:
            if self.outage > 0 and "/schemas/ids/" in path:
                self.outage -= 1
                return True
            return False


def _proxy_handler(registry: SecuredRegistry) -> type[http.server.BaseHTTPRequestHandler]:
    upstream = urlsplit(registry.upstream)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def _answer(self, status: int, body: bytes, content_type: str = "application/json") -> None:
            registry.answered[status] += 1
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if not registry.allowed(self.headers.get("Authorization")):
                self._answer(401, b'{"error_code": 401, "message": "Unauthorized"}')
                return
            if registry.take_outage(self.path):
                self._answer(503, b'{"error_code": 50301, "message": "Service Unavailable (test outage)"}')
                return
            registry.asked[self.path] += 1
            connection = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=30)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("authorization", "host")}
                connection.request(self.command, self.path, body or None, headers)
                response = connection.getresponse()
                self._answer(response.status, response.read(), response.getheader("Content-Type") or "")
            finally:
                connection.close()

        do_GET = do_POST = do_PUT = do_DELETE = _forward

    return Handler


@contextlib.contextmanager
def secured(upstream: str, tls: TestCA) -> Iterator[SecuredRegistry]:
    """An HTTPS, credential-checking proxy in front of `upstream`, on a free loopback port."""
    registry = SecuredRegistry(upstream, tls)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _proxy_handler(registry))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls.cert_file, tls.key_file)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.daemon_threads = True
    registry.url = f"https://127.0.0.1:{server.server_address[1]}{urlsplit(upstream).path}"
    thread = threading.Thread(target=server.serve_forever, name="registry-proxy", daemon=True)
    thread.start()
    try:
        yield registry
    finally:
        server.shutdown()
        server.server_close()
