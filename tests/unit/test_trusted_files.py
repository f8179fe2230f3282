"""What eos executes from $EOS_HOME (the launcher, the Spark home mirror) and where its fork server
listens must be this user's own and writable by no one else (eos.trusted): one that is not is
made again when eos made it, refused with the reason otherwise. Real files, modes and sockets;
"another user" is the only thing simulated (eos.trusted.current_user), so that the tests need
no second account."""

from __future__ import annotations

import hashlib
import os
import socket
import stat
import sys
from pathlib import Path

import pytest

from eos import runnerforks, sparksession, trusted
from eos.errors import EnvironmentProblem


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "eos-home"
    folder.mkdir(mode=0o755)
    monkeypatch.setenv("EOS_HOME", str(folder))
    return folder.resolve()


def _mirror(home: Path) -> Path:
    mirror = sparksession.compiled_spark_home(sys.executable)
    assert mirror is not None and mirror.parent == home / "spark-home"
    return mirror


def test_someone_elses_file_and_a_writable_one_are_untrusted(tmp_path: Path, monkeypatch) -> None:
    mine = tmp_path / "mine"
    mine.write_text("x")
    mine.chmod(0o755)
    assert trusted.why_untrusted(mine) is None
    mine.chmod(0o775)
    assert "written by its group" in (trusted.why_untrusted(mine) or "")
    mine.chmod(0o757)
    assert "written by other users" in (trusted.why_untrusted(mine) or "")
    mine.chmod(0o755)
    sticky = tmp_path / "shared"
    sticky.mkdir()
    sticky.chmod(0o1777)  # like /tmp: trusted above $EOS_HOME only
    assert trusted.why_untrusted(sticky, sticky_ok=True) is None
    assert trusted.why_untrusted(sticky) is not None
    monkeypatch.setattr(trusted, "current_user", lambda: os.geteuid() + 1)
    assert "belongs to" in (trusted.why_untrusted(mine) or "")


def test_a_changed_launcher_is_made_again(home: Path) -> None:
    launcher = sparksession.python_launcher(sys.executable)
    assert launcher is not None and launcher.parent == home / "spark-python"
    text = launcher.read_text()
    assert hashlib.sha256(text.encode()).hexdigest()[:12] == launcher.name
    launcher.write_text(text.replace("exec", "echo owned; exec", 1))  # what a planted one would do
    assert sparksession.python_launcher(sys.executable) == launcher
    assert launcher.read_text() == text
    launcher.chmod(0o777)  # writable by anyone: made again, as eos makes it
    assert sparksession.python_launcher(sys.executable) == launcher
    assert stat.S_IMODE(launcher.stat().st_mode) == 0o755 and launcher.read_text() == text


def test_a_launcher_that_is_not_eoss_is_refused_when_inherited(home: Path, monkeypatch) -> None:
    launcher = sparksession.python_launcher(sys.executable)
    assert launcher is not None
    sparksession.check_launcher(str(launcher))  # as made: accepted
    launcher.write_text(launcher.read_text() + "echo owned\n")
    with pytest.raises(EnvironmentProblem, match="not the one eos made: its text was changed"):
        sparksession.check_launcher(str(launcher))


def test_eoss_folders_must_be_this_users(home: Path, monkeypatch) -> None:
    home.chmod(0o775)
    with pytest.raises(EnvironmentProblem, match=r"\(\$EOS_HOME\), and that folder can be written by its group"):
        sparksession.python_launcher(sys.executable)
    home.chmod(0o755)
    folder = home / "spark-python"
    folder.mkdir()
    folder.chmod(0o777)  # eos's own folder, opened to others: closed again, its launcher checked
    assert sparksession.python_launcher(sys.executable) is not None
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    real = trusted.current_user()
    monkeypatch.setattr(trusted, "current_user", lambda: real + 1)  # now every file here is someone else's
    with pytest.raises(EnvironmentProblem, match="belongs to"):
        sparksession.python_launcher(sys.executable)


def test_a_tampered_mirror_is_made_again(home: Path) -> None:
    mirror = _mirror(home)
    # Spark reads $SPARK_HOME/conf/spark-env.sh and runs $SPARK_HOME/bin/*: plant both.
    (mirror / "conf").mkdir()
    (mirror / "conf" / "spark-env.sh").write_text("echo owned\n")
    (mirror / "bin").unlink()
    (mirror / "bin").symlink_to(home)
    assert _mirror(home) == mirror
    assert not (mirror / "conf").exists()
    assert os.readlink(mirror / "bin") == str(sparksession.pyspark_package() / "bin")
    (mirror / "python").chmod(0o777)
    assert _mirror(home) == mirror and stat.S_IMODE((mirror / "python").stat().st_mode) == 0o755


def test_the_fork_servers_socket_folder_is_private(tmp_path: Path, monkeypatch) -> None:
    shared = tmp_path / "shared-tmp"
    shared.mkdir()
    shared.chmod(0o777)  # anyone may rename entries here: no place for the socket
    monkeypatch.setenv("TMPDIR", str(shared))
    monkeypatch.setattr(runnerforks.tempfile, "tempdir", None)
    with pytest.raises(EnvironmentProblem, match="can be written by other users"):
        runnerforks._private_folder()
    assert list(shared.iterdir()) == []
    shared.chmod(0o1777)  # with the sticky bit, as /tmp
    folder = runnerforks._private_folder()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_the_fork_server_answers_only_its_own_user(monkeypatch) -> None:
    server, client = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with server, client:
        assert runnerforks._peer_is_me(server)
        real = os.geteuid()
        monkeypatch.setattr(os, "geteuid", lambda: real + 1)
        assert not runnerforks._peer_is_me(server)
