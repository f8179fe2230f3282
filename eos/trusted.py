"""Whether a file eos runs, or a folder it keeps such files or a socket in, is this user's own.

eos executes what it keeps under $EOS_HOME: the launcher Spark runs for every local Python process
(`spark-python/`), and the Spark home it points Spark at (`spark-home/`, whose `bin/` scripts and
`conf/` Spark would run and read). Whoever can write one of them, or rename one of the folders
above it, runs code as this user. So before eos runs them: each must belong to this user and be
writable by no one else, and so must each folder between it and $EOS_HOME, $EOS_HOME included;
the folders above $EOS_HOME may also belong to root, and may be writable by others only with the
sticky bit (like /tmp: no one renames another's entries there).
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from eos.errors import EnvironmentProblem


def current_user() -> int:
    return os.geteuid()


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def why_untrusted(path: Path, *, root_ok: bool = False, sticky_ok: bool = False) -> str | None:
    """What makes `path` (not followed if a symlink) unsafe to trust, or None: it is someone else's,
    or others may write it."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        return f"cannot be examined ({exc.strerror})"
    me = current_user()
    if info.st_uid != me and not (root_ok and info.st_uid == 0):
        return f"belongs to {_name(info.st_uid)}, not to {_name(me)}"
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    writable = info.st_mode & 0o022
    if writable and not (sticky_ok and stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX):
        who = "other users" if writable & 0o002 else "its group"
        return f"can be written by {who} (mode {stat.filemode(info.st_mode)})"
    return None


def check_home(home: Path) -> None:
    """Refuse to run anything from `home` ($EOS_HOME, resolved) unless it and every folder above
    it are safe (above: root's or this user's, writable by others only with the sticky bit)."""
    problem = why_untrusted(home)
    if problem is not None:
        raise EnvironmentProblem(
            f"eos runs programs it keeps in {home} ($EOS_HOME), and that folder {problem}: "
            "another user could replace them",
            hint=f"use a folder of your own that only you can write: `chmod go-w {home}`, or set EOS_HOME",
        )
    for folder in home.parents:
        problem = why_untrusted(folder, root_ok=True, sticky_ok=True)
        if problem is not None:
            raise EnvironmentProblem(
                f"eos runs programs it keeps in {home} ($EOS_HOME), and the folder {folder} above it {problem}: "
                "another user could replace them",
                hint="set EOS_HOME to a folder whose parents only you or root can write",
            )


def own_folder(folder: Path, home: Path) -> Path:
    """`folder`, a folder of eos's own under `home`, made (mode 0755) if missing; one that others
    may write is closed to them (what it holds is checked by its user), one that is not this
    user's is refused. `home` is checked first (check_home)."""
    for missing in reversed([p for p in (home, *home.parents) if not p.exists()]):
        missing.mkdir(mode=0o755, exist_ok=True)  # not the umask's 0775: the check below would refuse it
    check_home(home)
    for missing in reversed([p for p in (folder, *folder.parents) if not p.exists()]):
        missing.mkdir(mode=0o755, exist_ok=True)
    for inner in reversed([p for p in (folder, *folder.parents) if p.is_relative_to(home) and p != home]):
        problem = why_untrusted(inner)
        info = os.lstat(inner)
        if problem is not None and info.st_uid == current_user() and stat.S_ISDIR(info.st_mode):
            inner.chmod(stat.S_IMODE(info.st_mode) & ~0o022)
            problem = why_untrusted(inner)
        if problem is not None:
            raise EnvironmentProblem(
                f"eos keeps programs it runs in {inner}, and that folder {problem}",
                hint=f"delete {inner} (eos makes it again), or set EOS_HOME to a folder of your own",
            )
    return folder
