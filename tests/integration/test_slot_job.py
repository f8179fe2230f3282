"""Every epoch's job runs one Python function, made once; its tasks learn which epoch attempt they
write from the job's local property (eos.protocol.slot.EPOCH_PROPERTY), on a real SparkSession."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from pyspark.sql import functions as F

from eos.protocol.plan import SINK_TAG, EpochPlan, SinkPlan, sink_column
from eos.protocol.report import SlotReport
from eos.protocol.sink import PipelineInfo
from eos.protocol.slot import EPOCH_PROPERTY, SlotFunction, epoch_property


def test_every_epochs_job_runs_the_function_made_once_and_its_tasks_read_their_epoch_from_the_job(spark):
    rows = spark.range(0, 6, 1, 2).select(F.lit(0).alias(SINK_TAG), F.struct(F.col("id")).alias(sink_column(0)))
    first = EpochPlan(
        pipeline=PipelineInfo("slot-job", "ck-id", True, 60.0),
        epoch=1,
        attempt=1,
        run="run-a",
        offsets="digest-1",
        config="config-digest",
        sinks=(SinkPlan("counted", 0, None, False),),  # no writer: the slot counts its rows
        skip=frozenset(),
        coordinator=None,
        timeout_s=60.0,
    )
    slots, context = SlotFunction(), spark.sparkContext
    made = None
    for plan in (first, replace(first, epoch=2, offsets="digest-2"), replace(first, epoch=2, attempt=2)):
        context.setLocalProperty(EPOCH_PROPERTY, epoch_property(plan))
        try:
            reports = [SlotReport.from_json(row.report) for row in slots.apply(rows, plan).collect()]
        finally:
            context.setLocalProperty(EPOCH_PROPERTY, None)
        assert sorted(r.slot for r in reports) == [0, 1]
        assert sum(r.sinks["counted"].skipped for r in reports) == 6
        made = made or slots.udf
        assert slots.udf is made  # not a new function (pickled, registered in the JVM) per epoch
    # A job without the property: its tasks refuse to guess which epoch they write.
    with pytest.raises(Exception, match=re.escape(EPOCH_PROPERTY)):
        slots.apply(rows, first).collect()
