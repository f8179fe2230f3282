"""The spark-submit entrypoint: `spark-submit [options] eos/job.py PIPELINE.yaml [eos run options]`.

spark-submit needs a file, not a console script; this file runs `eos run` inside the driver
spark-submit started (the master, deploy mode and resources are spark-submit's).
"""

import sys

from eos.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
