"""eos benchmarks: `python -m bench` (or `make bench`) measures what exactly-once costs against
baselines measured in the same run, and writes docs/BENCHMARKS.md. See bench/cli.py."""
