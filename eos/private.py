"""Folders on the driver's machine that only the user eos runs as may use.

Two kinds. A folder for files eos trusts when it reads them back (the scratch folder: the ends
the scans of a source agree on, eos.protocol.barrier) must be this user's own and closed to
others: for a remote checkpoint it is under the machine's temp folder, where any local user can
create it first, under a name anyone can compute. A folder for files others must not read (the
checkpoint's metadata, `_eos`) is made 0700.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

from eos.errors import CheckpointError


def private_folder(path: Path) -> Path:
    """`path` as a folder only this user can use, for files eos trusts when it reads them back
    (the ends the scans of a source agree on: eos.protocol.barrier). Created with mode 0700 (and
    so are its missing parents). An existing one must be a folder of this user's: a link, a file,
    or a folder of another user's (who made it first, under a name eos uses, could have put files
    there) is refused. One of this user's that others could write into is replaced: what it held
    is disposable, and may not be eos's. Read access for others is taken away."""
    try:
        os.mkdir(path, 0o700)
        return path
    except FileNotFoundError:
        private_folder(path.parent)
        return private_folder(path)
    except FileExistsError:
        pass
    info = os.lstat(path)
    me = os.geteuid()
    what = "a link" if stat.S_ISLNK(info.st_mode) else None if stat.S_ISDIR(info.st_mode) else "a file"
    if what or info.st_uid != me:
        whose = what or f"a folder of uid {info.st_uid}'s, not of this user's (uid {me})"
        raise CheckpointError(
            f"eos's private folder {path} is {whose}: files another user put there would be trusted",
            hint=f"remove {path} (as its owner, or root) and start again; or point TMPDIR to a folder only you "
            "can write (for a remote checkpoint's scratch folder)",
        )
    if info.st_mode & 0o022:
        try:
            shutil.rmtree(path)
            os.mkdir(path, 0o700)
        except OSError as exc:
            raise CheckpointError(
                f"eos's private folder {path} was open to other users (mode {stat.S_IMODE(info.st_mode):04o}), and "
                f"replacing it failed: {exc}",
                hint=f"remove {path} (as root if another user's files are in it) and start again",
            ) from exc
        print(
            f"eos: warning: {path} was open to other users (mode {stat.S_IMODE(info.st_mode):04o}); replaced it "
            "with a private one (what it held was not trusted)",
            file=sys.stderr,
            flush=True,
        )
    elif info.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def private_dir(path: Path) -> None:
    """The metadata's folder: created 0700, or made 0700 (not replaced: it holds the metadata)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if stat.S_IMODE(os.stat(path).st_mode) != 0o700:
            try:
                os.chmod(path, 0o700)
            except PermissionError as exc:
                raise CheckpointError(
                    f"cannot make {path} private (mode 0700): {exc}",
                    hint="the checkpoint belongs to another user: run eos as that user",
                ) from exc
