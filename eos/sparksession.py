"""Building the SparkSession eos runs in, with defaults that suit short micro-batches."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from eos import jvmstop, runnerforks, sparklog, trusted
from eos.errors import ConfigError, EnvironmentProblem
from eos.model import is_secret
from eos.paths import eos_home

# Measured when eos was designed: on a local filesystem this halves the fixed checkpoint cost per
# micro-batch.
LOCAL_CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


def is_local_path(location: str) -> bool:
    return "://" not in location or location.startswith("file:")


def default_conf(master: str, checkpoint: str | None = None) -> dict[str, str]:
    cores = os.cpu_count() or 2
    conf = {
        "spark.master": master,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # 200 shuffle partitions is for batch jobs; a micro-batch wants about one per core (and a
        # stateful pipeline's slots are its shuffle partitions).
        "spark.sql.shuffle.partitions": str(cores),
        # Operator state (dedup, windows) stays in Spark's default store, in memory: a per-record
        # JNI call into RocksDB, and a RocksDB scan of all state to evict what the watermark
        # passed, held the demo's pipeline at 0.79x the rate (bench/NOTES.md). A pipeline
        # whose state outgrows the executors' memory chooses RocksDB in `spark.conf`; Spark pins
        # a checkpoint's store in its offset log, so existing checkpoints keep theirs.
        # For RocksDB, two of eos's settings: changelog checkpointing (only the epoch's changes
        # are written, not a snapshot), and no row count (one read more per write and delete
        # just to report Spark's numTotalStateRows metric, which eos does not use).
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows": "false",
        "spark.sql.session.timeZone": "UTC",
        # PySpark records the Python call site of every DataFrame function it is handed, for the
        # context of an error: about five more round trips to the JVM per call, half of the ~1,300
        # that building a pipeline makes (~50 ms of every start, more on every epoch's plan). The
        # call sites would be eos's own code; set it back to true in `spark.conf` to see them.
        "spark.python.sql.dataFrameDebugging.enabled": "false",
        # The JVM talks to its Python workers over loopback TCP by default, where a small write
        # that follows another waits for the peer's delayed ACK (Nagle): the one-row message that
        # tells a source's read task which ranges to read arrived 40-43 ms after the task's
        # function, in every read task of every epoch. Over a Unix domain socket it arrives at
        # once: the slot's read + write 59-62 -> 20-27 ms, a 40-record epoch 192-224 -> 160-202 ms.
        "spark.python.unix.domain.socket.enabled": "true",
        # PySpark's worker daemon, without a BrokenPipeError traceback each time the JVM hangs up
        # on a worker that was done (eos/sparkdaemon.py).
        "spark.python.daemon.module": "eos.sparkdaemon",
    }
    if not sparklog.verbose():
        conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile={sparklog.log_config_file()}"
        # A JVM that runs already (spark-submit's) logs from INFO up until eos.sparklog loads eos's
        # file into it: at least the SparkContext's start says only what matters.
        conf["spark.log.level"] = "WARN"
    if checkpoint is None or is_local_path(checkpoint):
        conf["spark.sql.streaming.checkpointFileManagerClass"] = LOCAL_CHECKPOINT_FILE_MANAGER
    elif checkpoint.startswith("hdfs://"):
        # The HDFS client does not retry NameNode calls by default: a NameNode restart would fail
        # the epoch's checkpoint writes at once. Retry every ~1 s for up to 2 minutes instead
        # (measured: a streaming micro-batch rides out a NameNode restart in ~13 s).
        conf["spark.hadoop.dfs.client.retry.policy.enabled"] = "true"
        conf["spark.hadoop.dfs.client.retry.policy.spec"] = "1000,120"
    return conf


# What Spark's status store keeps for its UI and REST API: 1,000 finished jobs, stages and SQL
# executions by default, each SQL execution with its plan graph and every metric. Nobody sees them
# while the UI is off (eos's default), and a pipeline runs two or three per epoch: at a 0.25 s
# trigger the demo's pipeline grew the driver's live heap from 78 to 136 MiB in 80 s (SQLPlanMetric,
# SparkPlanGraphNode, TaskDataWrapper...), against a flat 94.5 MiB with 50 of each kept.
WITHOUT_UI = {
    "spark.ui.retainedJobs": "50",
    "spark.ui.retainedStages": "50",
    "spark.sql.ui.retainedExecutions": "50",
}


def session_settings(
    master: str | None, conf: Mapping[str, str] | None, checkpoint: str | None, under_spark_submit: bool
) -> dict[str, str]:
    """eos's defaults, then the pipeline's `spark.conf`; with the UI off, the status store keeps
    little (WITHOUT_UI) unless the pipeline says otherwise."""
    settings = default_conf(master or "local[*]", checkpoint)
    if master is None and under_spark_submit:
        # Under spark-submit the JVM already runs with the master the user chose.
        settings.pop("spark.master")
    settings.update(conf or {})
    if settings.get("spark.ui.enabled", "true").strip().lower() == "false":
        for key, value in WITHOUT_UI.items():
            settings.setdefault(key, value)
    return settings


def _runs_this_interpreter(python: str | None) -> bool:
    # Not resolved: a virtualenv's python is a symlink to the base interpreter, and another
    # virtualenv (without this pyspark) resolves to the same file.
    found = shutil.which(python) if python else None
    return found is not None and Path(found).absolute() == Path(sys.executable).absolute()


def pyspark_package() -> Path:
    """The installed pyspark package's directory (the PyPI wheel is a whole Spark distribution)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def compiled_spark_home(python: str | None) -> Path | None:
    """A SPARK_HOME whose Python processes import PySpark from the installed package, or None.

    Why: Spark puts $SPARK_HOME/python/lib/pyspark.zip (and py4j's zip) first on the path of
    every Python process it starts, and a zip holds no compiled bytecode, so each one compiles
    PySpark from source: 0.55 s per process on a 2-core machine. An eos job starts six before its
    first epoch (data-source lookup and planning, a streaming-source runner per scan, the worker
    daemon): about 4 s of every start and restart. When those processes run this interpreter
    (`python`), the installed pyspark package *is* the code in that zip, with its bytecode
    cached. This returns a mirror of the package directory (every entry a symlink) without
    python/lib, kept under $EOS_HOME; Spark then finds no zip and Python imports the package.
    None when `python` is another interpreter (which may have no pyspark but the zip's) or this
    pyspark is not a full distribution.
    """
    if not _runs_this_interpreter(python):
        return None
    home = pyspark_package()
    if not (home / "python" / "lib" / "pyspark.zip").is_file() or not (home / "jars").is_dir():
        return None
    from pyspark import __version__

    key = hashlib.sha256(f"{home}|{__version__}".encode()).hexdigest()[:12]
    # Spark runs the mirror's bin/ scripts and reads its conf/: it must be this user's, and exactly
    # what eos makes (eos.trusted), else it is made again.
    mirrors = trusted.own_folder(eos_home() / "spark-home", eos_home())
    mirror = mirrors / f"{__version__}-{key}"
    if _whole_mirror(mirror, home):
        return mirror
    if os.path.lexists(mirror):  # not what eos makes (any more): set aside and deleted, made again
        stale = mirror.with_name(f".{mirror.name}.{os.getpid()}.stale")
        with contextlib.suppress(FileNotFoundError):  # another process set it aside first
            mirror.rename(stale)
        shutil.rmtree(stale, ignore_errors=True)
    partial = mirror.with_name(f"{mirror.name}.{os.getpid()}.partial")
    try:
        _link_entries(home, partial, but="python")
        _link_entries(home / "python", partial / "python", but="lib")  # lib: the zips
        partial.rename(mirror)
    except OSError:
        # No symlinks here, or another process just made the same mirror: use it if it is whole.
        shutil.rmtree(partial, ignore_errors=True)
    return mirror if _whole_mirror(mirror, home) else None


def _whole_mirror(mirror: Path, home: Path) -> bool:
    """Whether `mirror` is what compiled_spark_home makes of `home`: this user's folders, writable
    by no one else, holding a symlink to each entry of the package but python/ (python/: of its
    python/ but lib/) and nothing else."""
    try:
        for folder, source, but in ((mirror, home, "python"), (mirror / "python", home / "python", "lib")):
            if trusted.why_untrusted(folder) is not None:
                return False
            wanted = {entry.name for entry in source.iterdir() if entry.name != but}
            if {entry.name for entry in folder.iterdir()} != wanted | ({"python"} if folder == mirror else set()):
                return False
            if any(os.readlink(folder / name) != str(source / name) for name in wanted):
                return False
        return True
    except OSError:  # missing, or an entry that is no symlink
        return False


# Spark puts its spark-core jar on every Python process's path as well, after the zips (for a
# PySpark packaged inside the jar; this distribution's jar holds no Python). Python cannot skip
# a path entry: the first import that gets past the entries before it reads the jar's whole
# directory (~6,000 entries, 30 ms), and PySpark reads it again when a process takes its first
# task (importlib.invalidate_caches). The launcher takes the jar off PYTHONPATH, then runs the
# interpreter (exec: Spark's handle on the process stays the interpreter's). POSIX sh, no other
# program: what it adds to a process's start was within the noise of one here (~10 ms).
_LAUNCHER = """#!/bin/sh
# Made by eos (eos/sparksession.py, python_launcher): runs {python} without Spark's spark-core
# jar on PYTHONPATH; PySpark's streaming source runners are forked by eos's fork server when one
# runs (eos/runnerforks.py).
set -f
kept=
IFS=:
for entry in $PYTHONPATH; do
    case $entry in
        */spark-core_*.jar) ;;
        *) kept=${{kept:+$kept:}}$entry ;;
    esac
done
unset IFS
if [ "$1" = "-m" ] && [ "$2" = "{runner}" ] && [ -S "${{{forks}:-}}" ]; then
    PYTHONPATH=$kept exec {quoted} -S -I -c '{client}' "$@"
fi
PYTHONPATH=$kept exec {quoted} "$@"
"""


def python_launcher(python: str) -> Path | None:
    """What Spark's local Python processes should run in place of `python`, this interpreter:
    a launcher that takes Spark's jar off their path (above), kept under $EOS_HOME. None when
    the launcher cannot be made (then `python` itself is used)."""
    assert "'" not in runnerforks.CLIENT  # the launcher quotes it with single quotes
    text = _LAUNCHER.format(
        python=python,
        quoted=shlex.quote(python),
        runner=runnerforks.RUNNER_MODULE,
        forks=runnerforks.SOCKET_ENV,
        client=runnerforks.CLIENT,
    )
    folder = trusted.own_folder(eos_home() / "spark-python", eos_home())
    launcher = folder / hashlib.sha256(text.encode()).hexdigest()[:12]
    if trusted_launcher(launcher):
        return launcher
    partial = None  # a launcher that is not what eos made is made again, over it
    try:
        descriptor, partial = tempfile.mkstemp(dir=launcher.parent, prefix=".")
        with os.fdopen(descriptor, "w") as out:
            out.write(text)
        os.chmod(partial, 0o755)
        # Run it once before Spark does: on a filesystem mounted noexec, or without /bin/sh,
        # every Python process Spark starts would fail.
        subprocess.run([partial, "-c", ""], check=True, timeout=60, capture_output=True)
        os.replace(partial, launcher)
    except (OSError, subprocess.SubprocessError):
        if partial is not None:
            Path(partial).unlink(missing_ok=True)
        return None
    return launcher


def is_launcher(python: str | None) -> bool:
    """Whether `python` is one of eos's launchers (made here or by the eos process that started this one)."""
    return python is not None and Path(python).parent == eos_home() / "spark-python"


def trusted_launcher(launcher: Path) -> bool:
    """Whether `launcher` is one eos made, unchanged: a file of this user's that no one else may
    write, whose text hashes to its name (python_launcher names each after its text)."""
    if trusted.why_untrusted(launcher) is not None:
        return False
    try:
        text = launcher.read_bytes() if stat.S_ISREG(os.lstat(launcher).st_mode) else b""
    except OSError:
        return False
    return hashlib.sha256(text).hexdigest()[:12] == launcher.name


def check_launcher(python: str) -> None:
    """Refuse to have Spark run a launcher that is not what eos made (one inherited from the eos
    process that started this one, say): whoever changed it would run code as this user."""
    path = Path(python)
    trusted.own_folder(path.parent, eos_home())
    if not trusted_launcher(path):
        raise EnvironmentProblem(
            f"PYSPARK_PYTHON names eos's launcher {path}, which is not the one eos made: "
            f"{trusted.why_untrusted(path) or 'its text was changed'}",
            hint="delete it (eos makes its launchers again) and unset PYSPARK_PYTHON, or point it at a python",
        )


def local_python(python: str | None, launch: bool = True) -> tuple[Path | None, str | None]:
    """For Spark processes whose Python runs `python`: the SPARK_HOME to run them from (the
    mirror, or None for Spark's own) and the program they should run (the launcher, or
    `python`). One decision for a local session (build_spark) and eos's standalone cluster
    (eos_ops.sparkcluster): the launcher only where the mirror applies, i.e. `python` is this
    interpreter; `launch=False` keeps `python` as it is."""
    mirror = compiled_spark_home(python)
    if mirror is None or not launch:
        return mirror, python
    launcher = python_launcher(sys.executable)
    return mirror, str(launcher) if launcher is not None else python


def _link_entries(source: Path, target: Path, but: str) -> None:
    """`target` holding a symlink to every entry of `source` except the one named `but`."""
    target.mkdir(mode=0o755)
    for entry in source.iterdir():
        if entry.name != but:
            (target / entry.name).symlink_to(entry)


def secret_settings(settings: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the settings that may be shown, the secret ones), as eos.model decides what is secret."""
    public, secret = {}, {}
    for key, value in settings.items():
        (secret if is_secret(key, value) else public)[key] = value
    return public, secret


def _escaped(text: str) -> str:
    """`text` as a key or value of a java.util.Properties file: a backslash before the characters
    that would end a key or start a comment, and every other character outside printable ASCII as
    a \\uXXXX escape (whatever encoding the reader assumes)."""
    out = []
    for char in text:
        if char in "\\ :=#!":
            out.append("\\" + char)
        elif " " < char < "\x7f":
            out.append(char)
        else:
            units = char.encode("utf-16-be")
            out.extend(f"\\u{units[i]:02x}{units[i + 1]:02x}" for i in range(0, len(units), 2))
    return "".join(out)


def write_private_properties(path: Path, settings: Mapping[str, str]) -> None:
    """`settings` as a Spark properties file only its owner can read (mode 0600 from the start:
    written under a new name, then renamed over `path`)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.unlink(missing_ok=True)
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="ascii") as out:
        out.writelines(f"{_escaped(key)}={_escaped(str(value))}\n" for key, value in settings.items())
    os.replace(partial, path)


@contextlib.contextmanager
def _properties_file(settings: Mapping[str, str]) -> Iterator[Path]:
    """A private properties file holding `settings`, in a fresh folder of mode 0700, deleted on exit."""
    folder = Path(tempfile.mkdtemp(prefix="eos-spark-conf-"))
    try:
        path = folder / "secret.properties"
        write_private_properties(path, settings)
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _off_the_command_line(secret: Mapping[str, str]) -> Iterator[None]:
    """PySpark starts its JVM as `spark-submit --conf KEY=VALUE ... pyspark-shell`, so every setting
    it is handed is on that process's command line, which every local user can read (`ps`). The
    secret ones go to spark-submit in a private properties file instead (--properties-file, with
    --load-spark-defaults so that spark-defaults.conf is read as before), which is deleted once
    the JVM answers: spark-submit has read it by then. Spark treats them as it treats `--conf`
    (spark.hadoop.* reaches Hadoop's configuration, spark.authenticate.secret the driver's)."""
    if not secret:
        yield
        return
    submit_args = os.environ.get("PYSPARK_SUBMIT_ARGS")
    if submit_args is not None and "--properties-file" in shlex.split(submit_args):
        raise ConfigError(
            f"spark.conf holds secret settings ({', '.join(sorted(secret))}), which eos hands to Spark in a "
            "properties file of its own, and PYSPARK_SUBMIT_ARGS names another one",
            hint="put those settings in your properties file instead of the pipeline's spark.conf",
        )
    with _properties_file(secret) as path:
        os.environ["PYSPARK_SUBMIT_ARGS"] = (
            f"--properties-file {shlex.quote(str(path))} --load-spark-defaults {submit_args or 'pyspark-shell'}"
        )
        try:
            yield
        finally:
            if submit_args is None:
                os.environ.pop("PYSPARK_SUBMIT_ARGS", None)
            else:
                os.environ["PYSPARK_SUBMIT_ARGS"] = submit_args


def build_spark(
    app_name: str = "eos",
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    checkpoint: str | None = None,
):
    """A SparkSession: local[*] unless a master is given (or spark-submit already chose one).
    Secret settings never reach a command line (_off_the_command_line)."""
    under_spark_submit = bool(os.environ.get("PYSPARK_GATEWAY_PORT"))
    if "PYSPARK_PYTHON" not in os.environ and not under_spark_submit and (master or "local").startswith("local"):
        # Local Python workers must run this interpreter (with eos and its dependencies
        # installed), not whichever `python3` is first on PATH. On a cluster the executors'
        # interpreter is the deployment's business (spark.pyspark.python, an --archives venv).
        os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")
    from pyspark.sql import SparkSession

    settings = session_settings(master, conf, checkpoint, under_spark_submit)
    if not under_spark_submit:  # a JVM eos starts: the S3A connector for an s3a:// checkpoint
        from eos.s3a import with_connector

        settings = with_connector(settings, checkpoint)
    chosen = os.environ.get("SPARK_HOME")
    if (
        not under_spark_submit
        and settings.get("spark.master", "").startswith("local")
        and (not chosen or Path(chosen).resolve() == pyspark_package())
    ):
        # Only for a local JVM, where every Python process Spark starts runs the interpreter
        # below (executors elsewhere have their own SPARK_HOME), and never instead of another
        # Spark the user chose.
        named = settings.get("spark.pyspark.python")
        python = named or os.environ.get("PYSPARK_PYTHON")
        # A python named in the pipeline's spark.conf is the user's choice: it stays.
        mirror, program = local_python(python, launch=not named)
        if mirror is not None:
            os.environ["SPARK_HOME"] = str(mirror)
            if program is not None and program != python:
                os.environ["PYSPARK_PYTHON"] = program
    local = not under_spark_submit and settings.get("spark.master", "").startswith("local")
    # eos's launcher hands the source runners to this process's fork server, which imports PySpark
    # while the JVM starts (a JVM that runs already never sees the variable). The launcher may be
    # inherited from the eos process that started this one, with that process's server: never
    # used, its runners would live in that process's group and die with it.
    launched = is_launcher(os.environ.get("PYSPARK_PYTHON"))
    if launched:
        check_launcher(os.environ["PYSPARK_PYTHON"])
    runnerforks.use(local and launched)
    from pyspark import SparkContext

    # Only a JVM started here gets a command line; to a running one (spark-submit's, or this
    # process's earlier session) every setting travels over the gateway.
    launches = not under_spark_submit and SparkContext._gateway is None
    public, secret = secret_settings(settings) if launches else (settings, {})
    builder = SparkSession.builder.appName(app_name)
    for key, value in public.items():
        builder = builder.config(key, value)
    quiet = not sparklog.verbose()
    # A JVM started here gets a stderr without the lines nobody can act on (eos.sparklog).
    filtering = sparklog.filtered_stderr() if quiet and launches else contextlib.nullcontext()
    with _off_the_command_line(secret), filtering:
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    if quiet and not launches:
        # spark-submit's JVM: its stderr through eos's filter from now on, and eos's log levels
        # instead of Spark's default profile, once the SparkContext has started (Spark loads its
        # profile again when the context starts) (eos.sparklog).
        sparklog.filter_system_err(session.sparkContext._jvm)
        sparklog.use_eos_levels(session.sparkContext._jvm)
    if quiet:
        sparklog.quiet_accumulator_server(session.sparkContext)
    # A SIGTERM or Ctrl-C that reaches the JVM stops eos's queries before the SparkContext (eos.jvmstop).
    jvmstop.stop_eos_first(session)
    return session
