"""Keep a Python worker's long-lived objects out of the collection PySpark runs after every task.

A reused PySpark worker runs a full `gc.collect()` after each task (pyspark/daemon.py). In a
worker that has imported pyarrow, fastavro, pydantic and eos, that walks ~90,000 objects, nearly
all of them modules, classes and functions that live as long as the process: 27 ms on an idle
machine, 50-100 ms on a busy 2-core one. It holds the GIL the whole time, right when the task has
returned and the worker's commit thread waits for the driver's decision: in tiny epochs the
collection after the slot task was most of the commit step (release -> commit reported).

`freeze_new_imports()` runs at the start of every eos task-side call (eos.errors.crossing). When
modules were imported since the last time (the first task in a process, or the first of a kind),
it moves every object alive now into the permanent generation (`gc.freeze()`), which collections
skip. At a task's first call the daemon has just collected after the previous task, so what is
alive is reachable; a later call in the same task (a codec UDF's next batch) freezes only if that
task imported something meanwhile, and then may also freeze the task's own objects. Frozen objects
are still freed by reference counting; only a reference cycle alive at a freeze stays until the
process ends, and freezes happen only while the set of imported modules grows (a handful per
process). What a task creates after the last freeze is collected as before.
"""

from __future__ import annotations

import gc
import os
import sys

_seen: tuple[int, int] = (0, 0)  # (pid, number of imported modules) at the last freeze


def freeze_new_imports() -> bool:
    """Freeze what is alive if modules were imported since the last freeze in this process.
    Returns whether it froze. A forked child starts over (its pid differs)."""
    global _seen
    now = (os.getpid(), len(sys.modules))
    if now == _seen:
        return False
    _seen = now
    gc.freeze()
    return True
