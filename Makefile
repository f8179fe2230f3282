# The two commands of the README:
#   make demo   set up, start the local Kafka broker and PostgreSQL, run the demo pipeline, verify exactly-once
#   make test   set up and run the whole test suite (what CI runs)
# Everything is installed into .venv from scratch; broker jars go to $(EOS_HOME).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export EOS_HOME ?= $(CURDIR)/.eos

.PHONY: demo stop test lint bench install clean

$(VENV)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@# An editable install leaves eos's own modules uncompiled, and with PYTHONDONTWRITEBYTECODE set
	@# every Python process Spark starts (two source runners per run, its workers) compiled them
	@# again: a source runner imported the Kafka reader in 18 ms instead of 8.
	$(BIN)/python -m compileall -q eos connectors/eos_connectors ops/eos_ops bench >/dev/null
	@touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/eos demo

# The demo's broker and PostgreSQL live under $(EOS_HOME), so stop them from here (or with EOS_HOME=.eos).
stop: install
	$(BIN)/eos kafka stop
	$(BIN)/eos postgres stop

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Three runs, every one of them always: the fault tests (tests/faults) in two worker processes,
# a file per worker. Each of them is mostly waiting (a cold `eos run`, an epoch's trigger, a
# recovery; the suite used a fifth of the 2 cores' CPU time run serially); each worker starts its
# own broker, PostgreSQL and S3 server. The rest runs alone: first-hour tests bound eos's own time
# to an error, and the cluster tests run three brokers, HDFS and a Spark cluster.
test: install lint
	@status=0; \
	$(BIN)/pytest tests/unit tests/integration || status=1; \
	$(BIN)/pytest -n 2 --dist loadfile tests/faults || status=1; \
	$(BIN)/pytest tests/secure tests/cluster || status=1; \
	exit $$status

bench: install
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python -m bench

clean:
	-$(BIN)/eos kafka stop
	-$(BIN)/eos postgres stop
	rm -rf $(VENV) .eos .pytest_cache .ruff_cache
