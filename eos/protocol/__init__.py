"""The epoch commit protocol: Flink's checkpoint-and-two-phase-commit, on Spark micro-batches.

One epoch (a Spark micro-batch) goes through these steps; each file here is one part:

  1. prepare      source.py     every source plans the epoch's end offsets; Spark logs them
                                before any record is read (the barrier; a replay reads the same)
  2. plan         plan.py       the driver's plan for the epoch: which slots already committed it
                  ledger.py     (the ledger: what each slot committed, bound to its offsets)
  3. pre-commit   slot.py       one Spark task per slot writes its rows and its ledger entry into
                  sink.py       one transaction per sink and makes it durable but invisible
                                (the sink API: what a two-phase-commit sink implements)
  4. vote         coordinator.py  slots vote `prepared` to the driver's vote service
  5. decide       decision.py   the driver records "commit" durably, fenced against other drivers
  6. commit       committer.py  the driver (or the slot's own process) commits every slot
  7. mark         (Spark)       Spark's commit log marks the epoch committed

  recovery.py     before the first epoch and after a failed attempt: fence, resolve, read the
                  ledgers, check them against the checkpoint
  checkpoint.py   Spark's logs and eos's metadata, on any Hadoop FileSystem
  poison.py       poison decisions a source asked for (a schema id no registry knows): recorded
                  in the checkpoint before any attempt routes by them, the same in every replay
  report.py       what slots report to the driver, and the driver to its listeners

docs/EXACTLY_ONCE.md states the invariants these steps keep and why.
"""
