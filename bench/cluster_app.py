"""The application `spark-submit` runs in the cluster section: eos/job.py's `eos run` of one
pipeline, with the benchmark's listener attached, so the run reports its epochs.

    spark-submit [--master ...] bench/cluster_app.py PIPELINE.json RESULT.json

It does what eos/job.py does (`eos run PIPELINE --trigger available-now` in the driver spark-submit
started: master, executors and resources are spark-submit's) through the same runner
(`eos.runner.run_config`, which builds its SparkSession from the submitted settings), plus a
`bench.pipelines.Collector`: the result file holds the run's wall time, its epochs and the
driver's CPU.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    import yaml

    from bench.pipelines import Collector
    from eos.config import pipeline_from_yaml
    from eos.runner import RunOptions, run_config
    from eos.yamlsource import parse_yaml

    config_file, result_file = Path(argv[0]), Path(argv[1])
    config = json.loads(config_file.read_text())
    parsed = pipeline_from_yaml(parse_yaml(yaml.safe_dump(config, sort_keys=False), f"<{config['name']}>"))
    collector = Collector()
    started = time.monotonic()
    started_wall = time.time()
    result = run_config(
        parsed,
        config_file.parent,
        RunOptions(trigger="available-now", progress=False, listeners=[collector]),
    )
    wall = time.monotonic() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result_file.write_text(
        json.dumps(
            {
                "wall_s": wall,
                "started_at": started_wall,
                "epochs": collector.epochs(),
                "records_out": sum(result.records_out.values()),
                "driver_python_cpu_s": usage.ru_utime + usage.ru_stime,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
