"""`eos postgres start|stop|status|dsn|cleanup|remove`: the local PostgreSQL server, and a pipeline's
lingering prepared transactions."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _server(args: argparse.Namespace):
    from eos_ops.localpg import LocalPostgres

    return LocalPostgres(port=args.port, data_dir=args.data_dir)


def _shown(dsn: str) -> str:
    from eos_connectors.postgres.db import masked_dsn

    return masked_dsn(dsn)


def cmd_postgres_start(args: argparse.Namespace) -> int:
    server = _server(args)
    status = server.start(timeout=args.timeout, progress=_say)
    print(f"{_shown(server.dsn)}  (the password: {server.password_file}; `eos postgres dsn` prints the full DSN)")
    return 0 if status.running else 1


def cmd_postgres_stop(args: argparse.Namespace) -> int:
    _server(args).stop(kill=args.kill, progress=_say)
    return 0


def cmd_postgres_status(args: argparse.Namespace) -> int:
    server = _server(args)
    status = server.status()
    if not status.running:
        print(f"not running (data directory {status.data_dir})")
        return 3
    if not status.answering:
        print(f"running at {server.host}:{status.port}, pid {status.pid}, NOT answering; log {status.log_file}")
        return 1
    cluster = f" (cluster {status.cluster})" if status.cluster else ""
    print(
        f"running at {server.host}:{status.port}, pid {status.pid}, PostgreSQL {status.version}, "
        f"{status.prepared} prepared transactions; data {status.data_dir}{cluster}; log {status.log_file}"
    )
    return 0


def cmd_postgres_remove(args: argparse.Namespace) -> int:
    from eos.errors import ConfigError

    if not args.yes:
        raise ConfigError("`eos postgres remove` deletes the server's databases: add --yes to confirm")
    _server(args).remove(progress=_say)
    return 0


def cmd_postgres_dsn(args: argparse.Namespace) -> int:
    print(_server(args).dsn)
    return 0


# ---------------------------------------------------------------------------------------------
# cleanup
# ---------------------------------------------------------------------------------------------


def cleanup(path: Path, take_over: bool = False) -> int:
    """Resolve a stopped pipeline's prepared transactions by its recorded decision, as recovery
    does: commit the ones the last decision commits, roll back every other one. Refused while the
    pipeline's driver answers (eos.driver.take_over); otherwise this command takes the pipeline
    over (fencing every earlier driver, so none can record a decision behind its back)."""
    import psycopg

    from eos.errors import EnvironmentProblem
    from eos_connectors.postgres.db import first_line
    from eos_connectors.postgres.sink import PostgresSink, prepared_xacts, resolve_prepared
    from eos_ops.stopped import taken_over

    with taken_over(path, PostgresSink, "prepares no transactions", take_over) as stopped:
        config, decision = stopped.config, stopped.decision
        groups: dict[str, list[PostgresSink]] = {}
        for sink in stopped.sinks:
            groups.setdefault(sink.system(), []).append(sink)
        total = 0
        for system, group in groups.items():
            connections = {}
            for sink in group:
                conn = sink.connection()
                connections.setdefault(conn.info.user, conn)
            before = {x.gid: x for x in prepared_xacts(group[0].connection(), config.name)}
            if not before:
                print(f"{system}: no prepared transactions of {config.name}")
                continue
            try:
                done = resolve_prepared(connections, config.name, decision)
            except psycopg.Error as exc:  # a StrandedPrepared says itself what to do
                raise EnvironmentProblem(f"{system}: resolving failed: {first_line(exc)}") from None
            for gid, what in done:
                age = f" (prepared {before[gid].age_s:.0f} s ago)" if gid in before else ""
                print(f"{system}: {what} {gid}{age}")
            total += len(done)
        print(f"done: {total} prepared transactions resolved")
        return 0


def cmd_postgres_cleanup(args: argparse.Namespace) -> int:
    return cleanup(args.pipeline, take_over=args.take_over)


def register(sub: argparse._SubParsersAction) -> None:
    postgres = sub.add_parser(
        "postgres",
        help="manage the local PostgreSQL server; resolve a pipeline's lingering prepared transactions",
        description="Manage the local PostgreSQL server (max_prepared_transactions=64, loopback only, data under "
        "$EOS_HOME), and resolve the prepared transactions a stopped pipeline left in its PostgreSQL sinks.",
    )
    commands = "{start,stop,status,dsn,cleanup,remove}"
    psub = postgres.add_subparsers(dest="postgres_command", required=True, metavar=commands)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--port", type=int, default=5432, help="TCP port on 127.0.0.1 (5432)")
        p.add_argument("--data-dir", type=Path, default=None, help="server data (default $EOS_HOME/postgres-PORT)")

    start = psub.add_parser("start", help="start the server in the background and wait until it answers")
    common(start)
    start.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for readiness (120)")
    start.set_defaults(func=cmd_postgres_start)

    stop = psub.add_parser("stop", help="shut the server down (prepared transactions are kept)")
    common(stop)
    stop.add_argument("--kill", action="store_true", help="SIGKILL every server process instead (a crash)")
    stop.set_defaults(func=cmd_postgres_stop)

    status = psub.add_parser("status", help="is the server running and answering? (exit 3 if not running)")
    common(status)
    status.set_defaults(func=cmd_postgres_status)

    remove = psub.add_parser(
        "remove",
        help="stop the server and delete its cluster (wherever it is), password and log; nothing else",
    )
    common(remove)
    remove.add_argument("--yes", action="store_true", help="confirm: every database of the server is deleted")
    remove.set_defaults(func=cmd_postgres_remove)

    dsn = psub.add_parser("dsn", help="print the `eos` role's connection string, password included")
    common(dsn)
    dsn.set_defaults(func=cmd_postgres_dsn)

    cleanup_ = psub.add_parser(
        "cleanup",
        help="resolve a stopped pipeline's prepared transactions by its recorded decision",
        description="Prepared transactions hold their locks and keep VACUUM from removing old rows until they are "
        "committed or rolled back. A pipeline resolves its own at every start; this resolves them while it is "
        "stopped: the ones its last recorded decision commits are committed, every other one of the pipeline is "
        "rolled back (exactly what recovery would do). Refused while the pipeline's driver still answers.",
    )
    cleanup_.add_argument("pipeline", type=Path, help="the pipeline YAML file")
    cleanup_.add_argument(
        "--take-over", action="store_true",
        help="fence a driver that still answers (a stale process you cannot stop) instead of refusing",
    )  # fmt: skip
    cleanup_.set_defaults(func=cmd_postgres_cleanup)
