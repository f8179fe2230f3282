"""eos.workergc: a Python worker's first eos task freezes what its imports created, so the full
collection PySpark runs after every task walks only what tasks created since. Each case runs in
a fresh interpreter: freezing is per process, and pytest's own heap must not decide the result."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_first_task_side_call_leaves_little_for_the_collection_after_the_task() -> None:
    out = _run(
        """
        import gc
        import pyarrow, fastavro  # what a worker imports for eos's tasks
        from eos.errors import crossing
        before = len(gc.get_objects())
        with crossing():
            pass
        print(before, len(gc.get_objects()), gc.get_freeze_count())
        """
    )
    before, tracked, frozen = map(int, out.split())
    assert before > 10_000, "the imports alone leave tens of thousands of objects for a full collection"
    assert frozen >= before, f"crossing() froze {frozen} objects of {before}"
    assert tracked < before / 20, f"{tracked} objects still walked by each collection (of {before})"


def test_freezes_again_only_after_new_imports_and_in_a_forked_child() -> None:
    out = _run(
        """
        import os
        from eos.workergc import freeze_new_imports
        first, again = freeze_new_imports(), freeze_new_imports()
        import json.tool  # a module not imported yet
        after_import = freeze_new_imports()
        read, write = os.pipe()
        child = os.fork()
        if child == 0:  # a PySpark daemon forks its workers
            os.write(write, b"1" if freeze_new_imports() else b"0")
            os._exit(0)
        os.waitpid(child, 0)
        print(first, again, after_import, os.read(read, 1).decode())
        """
    )
    assert out.split() == ["True", "False", "True", "1"]


def test_objects_a_task_creates_after_the_freeze_are_still_collected() -> None:
    out = _run(
        """
        import gc, weakref
        from eos.errors import crossing
        class Node:
            pass
        with crossing():
            a, b = Node(), Node()
            a.other, b.other = b, a  # a reference cycle: only the collector frees it
            gone = weakref.ref(a)
            del a, b
        gc.collect()
        print(gone() is None)
        """
    )
    assert out == "True"
