"""`eos s3 start|stop|status`: the local S3 server (S3Proxy on loopback, eos_ops.s3), for trying a
checkpoint on s3a:// (docs/S3.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _server(args: argparse.Namespace):
    from eos_ops.s3 import LocalS3

    return LocalS3(data_dir=args.data_dir, port=args.port)


def cmd_s3_start(args: argparse.Namespace) -> int:
    from eos_ops.s3 import SPARK_CONF

    server = _server(args)
    status = server.start(progress=_say, timeout=args.timeout)
    print(f"S3 at {status.endpoint}, bucket {server.bucket}: s3a://{server.bucket}/...")
    print(f"credentials (new at every start) and endpoint: `. {server.env_file}` in a shell (mode 0600)")
    print("a pipeline's settings for it (the ${VAR}s come from that file):\nspark:\n  conf:")
    print("\n".join(f"    {key}: {json.dumps(value)}" for key, value in SPARK_CONF.items()))
    return 0 if status.answers else 1


def cmd_s3_stop(args: argparse.Namespace) -> int:
    _server(args).stop(kill=args.kill, progress=_say)
    return 0


def cmd_s3_status(args: argparse.Namespace) -> int:
    server = _server(args)
    status = server.status()
    if not status.running:
        print(f"not running (data directory {status.data_dir})")
        return 3
    if not status.answers:
        print(f"running at {status.endpoint}, pid {status.pid}, NOT answering; log {server.log_file}")
        return 1
    print(
        f"running at {status.endpoint}, pid {status.pid}, bucket {server.bucket}; credentials {server.env_file}; "
        f"data {server.blobs_dir}; log {server.log_file}"
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    s3 = sub.add_parser(
        "s3",
        help="manage the local S3 server (for a checkpoint on s3a://)",
        description="Manage the local S3 server: S3Proxy (from Maven Central) on 127.0.0.1 with a filesystem "
        "backend under $EOS_HOME/s3, one bucket `eos`, AWS Signature V4 with credentials made at every start and "
        "written to a 0600 file, never to a command line. For trying a checkpoint on s3a:// (docs/S3.md).",
    )
    ssub = s3.add_subparsers(dest="s3_command", required=True, metavar="{start,stop,status}")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--port", type=int, default=None, help="TCP port on 127.0.0.1 (default: a free one, kept)")
        p.add_argument("--data-dir", type=Path, default=None, help="the server's folder (default $EOS_HOME/s3)")

    start = ssub.add_parser("start", help="start the server in the background and wait until it answers")
    common(start)
    start.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for readiness (120)")
    start.set_defaults(func=cmd_s3_start)

    stop = ssub.add_parser("stop", help="stop the server (the objects are kept)")
    common(stop)
    stop.add_argument("--kill", action="store_true", help="SIGKILL it instead (a crash)")
    stop.set_defaults(func=cmd_s3_stop)

    status = ssub.add_parser("status", help="is the server running and answering? (exit 3 if not running)")
    common(status)
    status.set_defaults(func=cmd_s3_status)
