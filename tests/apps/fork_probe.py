"""A module the fork server's tests run as `python -m tests.apps.fork_probe CODE [sleep]`: it prints
what a started process would see, then exits with CODE (or waits to be signalled)."""

from __future__ import annotations

import os
import sys
import time

if __name__ == "__main__":
    print(f"pid={os.getpid()} ppid={os.getppid()} cwd={os.getcwd()} probe={os.environ.get('PROBE')}", flush=True)
    print(f"argv={sys.argv[1:]}", file=sys.stderr, flush=True)
    if sys.argv[2:] == ["sleep"]:
        time.sleep(60)
    sys.exit(int(sys.argv[1]))
