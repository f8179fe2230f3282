"""A real S3 server on loopback: S3Proxy with its filesystem backend, for the tests and for trying
a checkpoint on s3a:// (`eos s3 start|stop|status`).

Why S3Proxy: an S3 API server (Apache-2.0) on Maven Central that runs as a plain JVM, like the
local broker and HDFS, with no Docker and no download at run time; its filesystem backend keeps
each bucket as a folder. It is a real HTTP server speaking the S3 REST API with AWS Signature V4,
so what a client sees (S3A's create, copy-as-rename, listing and delete, delta-rs' conditional
PUT) is what it would see of S3, minus S3's scale. The jars come from `ops/s3/s3proxy/pom.xml`,
cached under $EOS_HOME/s3proxy/<hash of the pom>/libs.

A `LocalS3` is identified by its folder, which holds everything:

    <data_dir>/conf/s3proxy.properties  the server's settings, the credentials among them (0600)
    <data_dir>/conf/s3.env              AWS_* variables for a shell or a pipeline's ${VAR} (0600)
    <data_dir>/blobs/<bucket>/          the objects (a folder per bucket, 0700)
    <data_dir>/s3proxy.log, .pid

Credentials: a fresh access key and secret key are made at every start and written to those two
files only (0600, in a 0700 folder). S3Proxy reads them from its properties file, never from its
command line, and the keys never reach a log. Private by POSIX modes too: S3Proxy's filesystem
backend reports a bucket or an object that other users may read as public-read, and then answers
anonymous requests for it, so the server runs with umask 077 and the bucket folder is made 0700.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import http.client
import os
import re
import secrets
import string
import subprocess
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit

from eos.errors import EnvironmentProblem
from eos.paths import eos_home, ops_dir
from eos_ops import jvm
from eos_ops.jvm import Progress, quiet

MAIN_CLASS = "org.gaul.s3proxy.Main"
SERVICE = "the local S3 server"
BUCKET = "eos"
REGION = "us-east-1"

# The s3a settings a pipeline's `spark.conf` needs for this server, credentials as ${VAR}s that
# `eos s3 start` writes to <data_dir>/conf/s3.env (docs/S3.md). Path-style: the bucket is in the
# path (http://127.0.0.1:PORT/BUCKET/KEY), not in a host name of its own.
SPARK_CONF = {
    "spark.hadoop.fs.s3a.endpoint": "${AWS_ENDPOINT_URL}",
    "spark.hadoop.fs.s3a.endpoint.region": "${AWS_REGION}",
    "spark.hadoop.fs.s3a.path.style.access": "true",
    "spark.hadoop.fs.s3a.access.key": "${AWS_ACCESS_KEY_ID}",
    "spark.hadoop.fs.s3a.secret.key": "${AWS_SECRET_ACCESS_KEY}",
}


def s3proxy_ops_dir() -> Path:
    return ops_dir() / "s3" / "s3proxy"


def s3proxy_version() -> str:
    """The S3Proxy version the pom pins (the one place it is written)."""
    match = re.search(r"<s3proxy.version>([^<]+)</s3proxy.version>", (s3proxy_ops_dir() / "pom.xml").read_text())
    return match.group(1) if match else "unknown"


def fetch_s3proxy_jars(progress: Progress = quiet) -> Path:
    return jvm.fetch_jars(
        s3proxy_ops_dir() / "pom.xml", eos_home() / "s3proxy", f"S3Proxy {s3proxy_version()}", progress
    )


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str = field(repr=False)

    @classmethod
    def generate(cls) -> Credentials:
        letters = string.ascii_uppercase + string.digits
        return cls("EOS" + "".join(secrets.choice(letters) for _ in range(17)), secrets.token_urlsafe(30))


@dataclass
class S3Status:
    endpoint: str | None
    data_dir: Path
    pid: int | None
    answers: bool = False  # a signed request for the bucket succeeded
    ready_in: float | None = None  # seconds the start took

    @property
    def running(self) -> bool:
        return self.pid is not None


class LocalS3:
    """One S3Proxy on loopback, identified by `data_dir`, serving one bucket (`bucket`).

    `port` fixes the port; None picks a free one on the first start and keeps it while free."""

    def __init__(
        self,
        data_dir: Path | str | None = None,
        port: int | None = None,
        bucket: str = BUCKET,
        host: str = "127.0.0.1",
        heap: str = "128m",
    ):
        self.data_dir = Path(data_dir).expanduser().resolve() if data_dir else eos_home() / "s3"
        self.port = port
        self.bucket = bucket
        self.host = host
        self.heap = heap

    # -- files ------------------------------------------------------------------------------
    @property
    def conf_dir(self) -> Path:
        return self.data_dir / "conf"

    @property
    def properties_file(self) -> Path:
        return self.conf_dir / "s3proxy.properties"

    @property
    def env_file(self) -> Path:
        return self.conf_dir / "s3.env"

    @property
    def blobs_dir(self) -> Path:
        return self.data_dir / "blobs"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "s3proxy.log"

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "s3proxy.pid"

    def _properties(self) -> dict[str, str]:
        try:
            lines = self.properties_file.read_text().splitlines()
        except OSError:
            return {}
        return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))

    @property
    def endpoint(self) -> str:
        """http://host:port of the running (or last started) server."""
        endpoint = self._properties().get("s3proxy.endpoint")
        if endpoint is None:
            raise EnvironmentProblem(
                f"{SERVICE} in {self.data_dir} has not been started yet: it has no endpoint",
                hint="start it first (`eos s3 start`, or LocalS3.start())",
            )
        return endpoint

    def credentials(self) -> Credentials:
        """The keys the server was last started with (read from its 0600 properties file)."""
        settings = self._properties()
        if "s3proxy.identity" not in settings:
            raise EnvironmentProblem(f"{SERVICE} in {self.data_dir} has no credentials yet: start it first")
        return Credentials(settings["s3proxy.identity"], settings["s3proxy.credential"])

    def env(self) -> dict[str, str]:
        """The environment a client of this server needs: the AWS SDKs' and delta-rs' variable names,
        which SPARK_CONF refers to."""
        credentials = self.credentials()
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": REGION,
            "AWS_ACCESS_KEY_ID": credentials.access_key,
            "AWS_SECRET_ACCESS_KEY": credentials.secret_key,
            "AWS_ALLOW_HTTP": "true",  # delta-rs (object_store) refuses http:// endpoints without it
        }

    def client(self) -> S3Client:
        return S3Client(self.endpoint, self.credentials())

    # -- process ----------------------------------------------------------------------------
    def pid(self) -> int | None:
        return jvm.pid_from_file(self.pid_file, MAIN_CLASS, str(self.properties_file))

    def status(self) -> S3Status:
        pid = self.pid()
        endpoint = self._properties().get("s3proxy.endpoint")
        status = S3Status(endpoint, self.data_dir, pid)
        if pid is not None and endpoint is not None:
            with contextlib.suppress(OSError, http.client.HTTPException, EnvironmentProblem):
                status.answers = self.client().request("HEAD", f"/{self.bucket}").status == 200
        return status

    def start(self, progress: Progress = quiet, timeout: float = 120.0) -> S3Status:
        """Start the server (idempotent: a running one is left as it is) and wait until a signed
        request for the bucket succeeds. New credentials at every start."""
        started = time.monotonic()
        if self.pid() is not None and (status := self.status()).answers:
            progress(f"S3 already running at {status.endpoint} (pid {status.pid}).")
            return status
        self.stop(kill=True)  # a server that runs but does not answer is not ours to wait for
        java = jvm.find_java(SERVICE)
        libs = fetch_s3proxy_jars(progress)
        port = self._choose_port()
        endpoint = f"http://{self.host}:{port}"
        with _private_umask():
            for folder in (self.data_dir, self.conf_dir, self.blobs_dir, self.blobs_dir / self.bucket):
                folder.mkdir(mode=0o700, exist_ok=True)
                os.chmod(folder, 0o700)  # an existing one too: others reading it makes the bucket public
            credentials = Credentials.generate()
            _write_private(self.properties_file, self._server_properties(endpoint, credentials))
            _write_private(self.env_file, "".join(f"export {key}={value}\n" for key, value in self.env().items()))
        cmd = [
            java, f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-Djava.net.preferIPv4Stack=true", f"-Dlogback.configurationFile={s3proxy_ops_dir() / 'logback.xml'}",
            "-cp", str(libs / "*"), MAIN_CLASS, "--properties", str(self.properties_file),
        ]  # fmt: skip
        progress(f"Starting S3Proxy {s3proxy_version()} at {endpoint} (bucket {self.bucket}) ...")
        with _private_umask(), open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.data_dir,
                start_new_session=True, umask=0o077,
            )  # fmt: skip
        self.pid_file.write_text(str(proc.pid))
        status = self._await_ready(proc, timeout)
        status.ready_in = time.monotonic() - started
        progress(f"S3 ready at {endpoint} in {status.ready_in:.1f} s; credentials in {self.env_file} (mode 0600).")
        return status

    def stop(self, kill: bool = False, progress: Progress = quiet, timeout: float = 30.0) -> bool:
        """SIGTERM (or SIGKILL with kill=True) and wait until gone. False if it was not running."""
        pid = self.pid()
        if pid is not None and jvm.terminate(pid, timeout=timeout, kill=kill):
            progress(f"S3Proxy did not stop within {timeout:.0f} s; killed it.")
        self.pid_file.unlink(missing_ok=True)
        progress(f"S3 in {self.data_dir} stopped." if pid else f"No S3 server running for {self.data_dir}.")
        return pid is not None

    # -- start-up steps ---------------------------------------------------------------------
    def _choose_port(self) -> int:
        stored = self._properties().get("s3proxy.endpoint")
        wanted = self.port or (int(stored.rsplit(":", 1)[1]) if stored else None)
        if wanted is not None and jvm.port_is_free(self.host, wanted):
            return wanted
        if self.port is not None:
            raise EnvironmentProblem(
                f"port {self.port} on {self.host} ({SERVICE}, {self.data_dir}) is in use by another process.",
                hint="stop that process, or choose another port",
            )
        return jvm.free_ports(1, self.host)[0]

    def _server_properties(self, endpoint: str, credentials: Credentials) -> str:
        settings = {
            "s3proxy.endpoint": endpoint,
            "s3proxy.authorization": "aws-v4",
            "s3proxy.identity": credentials.access_key,
            "s3proxy.credential": credentials.secret_key,
            "jclouds.provider": "filesystem",
            "jclouds.filesystem.basedir": str(self.blobs_dir),
        }
        # Every value is written as it is: none holds a character java.util.Properties would read
        # otherwise (keys of [A-Za-z0-9_-], a loopback URL, a path eos chose).
        for key, value in settings.items():
            if re.search(r"[\\\n\r]", value):
                raise EnvironmentProblem(f"{SERVICE}: {key} may not hold a backslash or a line break: {value!r}")
        return "# Written by eos_ops.s3 at every start: edits here are overwritten.\n" + "".join(
            f"{key}={value}\n" for key, value in settings.items()
        )

    def _await_ready(self, proc: subprocess.Popen, timeout: float) -> S3Status:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = proc.poll()
            if code is not None:
                self.pid_file.unlink(missing_ok=True)
                raise EnvironmentProblem(
                    f"S3Proxy exited with code {code} during start-up. Last lines of {self.log_file}:\n"
                    + jvm.tail(self.log_file)
                )
            status = self.status()
            if status.answers:
                return status
            time.sleep(0.1)
        self.stop(kill=True)
        raise EnvironmentProblem(
            f"S3Proxy did not answer within {timeout:.0f} s. Last lines of {self.log_file}:\n" + jvm.tail(self.log_file)
        )


@contextlib.contextmanager
def _private_umask():
    previous = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(previous)


def _write_private(path: Path, text: str) -> None:
    """`text` into `path`, readable by its owner only from the first byte (written under another
    name, then renamed over it)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.unlink(missing_ok=True)
    with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
        out.write(text)
    os.replace(partial, path)


# ---------------------------------------------------------------------------------------------
# A small S3 client (AWS Signature V4 over http.client): readiness, and tests that read the
# bucket without sharing code with Spark's S3A.
# ---------------------------------------------------------------------------------------------


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


def _sign(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


class S3Client:
    def __init__(self, endpoint: str, credentials: Credentials, region: str = REGION, timeout: float = 10.0):
        parts = urlsplit(endpoint)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.credentials = credentials
        self.region = region
        self.timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        query: dict[str, str] | None = None,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        signed: bool = True,
    ) -> Response:
        """One request; `path` is /BUCKET[/KEY], unencoded. `signed=False` sends it anonymously."""
        now = datetime.datetime.now(datetime.timezone.utc)
        amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        uri = quote(path, safe="/-_.~")
        canonical_query = "&".join(
            f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted((query or {}).items())
        )
        payload = hashlib.sha256(body).hexdigest()
        sent = {"host": f"{self.host}:{self.port}", "x-amz-date": amz_date, "x-amz-content-sha256": payload}
        sent.update({k.lower(): v.strip() for k, v in (headers or {}).items()})
        if signed:
            names = sorted(sent)
            canonical = "\n".join(
                [method, uri, canonical_query, *(f"{n}:{sent[n]}" for n in names), "", ";".join(names), payload]
            )
            scope = f"{day}/{self.region}/s3/aws4_request"
            to_sign = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
            key = _sign(("AWS4" + self.credentials.secret_key).encode(), day)
            for part in (self.region, "s3", "aws4_request"):
                key = _sign(key, part)
            signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
            sent["authorization"] = (
                f"AWS4-HMAC-SHA256 Credential={self.credentials.access_key}/{scope}, "
                f"SignedHeaders={';'.join(names)}, Signature={signature}"
            )
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            connection.request(method, uri + (f"?{canonical_query}" if canonical_query else ""), body, sent)
            response = connection.getresponse()
            return Response(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
        finally:
            connection.close()

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every key under `prefix` (ListObjectsV2, page by page)."""
        found: list[str] = []
        token = None
        while True:
            query = {"list-type": "2", "prefix": prefix, **({"continuation-token": token} if token else {})}
            response = self._ok(self.request("GET", f"/{bucket}", query), f"listing {bucket}/{prefix}")
            root = ET.fromstring(response.body)
            ns = {"s3": root.tag.split("}")[0].strip("{")} if root.tag.startswith("{") else {}
            found += [element.text or "" for element in root.iterfind(".//s3:Contents/s3:Key", ns)]
            token = root.findtext("s3:NextContinuationToken", None, ns)
            if root.findtext("s3:IsTruncated", "false", ns) != "true" or not token:
                return found

    def get(self, bucket: str, key: str) -> bytes | None:
        response = self.request("GET", f"/{bucket}/{key}")
        return None if response.status == 404 else self._ok(response, f"reading {bucket}/{key}").body

    def put(self, bucket: str, key: str, data: bytes, headers: dict[str, str] | None = None) -> Response:
        """PUT an object; the response as it is (a conditional PUT may answer 412)."""
        return self.request("PUT", f"/{bucket}/{key}", body=data, headers=headers)

    def delete(self, bucket: str, key: str) -> None:
        self._ok(self.request("DELETE", f"/{bucket}/{key}"), f"deleting {bucket}/{key}")

    @staticmethod
    def _ok(response: Response, what: str) -> Response:
        if response.status >= 300:
            raise EnvironmentProblem(f"S3 {what}: HTTP {response.status}: {response.body[:300]!r}")
        return response
