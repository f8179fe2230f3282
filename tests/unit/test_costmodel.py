"""The cost model's pure parts (bench.sections.costmodel): the least-squares line, the medians it
is fitted to, and the projection. The measurements themselves need a broker: `python -m bench
--sections costmodel` (docs/SCALING.md)."""

from __future__ import annotations

import math

import pytest

from bench.sections import costmodel


def test_a_line_through_exact_points_has_no_residual():
    line = costmodel.fit([16, 64, 256, 1024], [0.05 + 0.002 * x for x in (16, 64, 256, 1024)])
    assert line.fixed == pytest.approx(0.05) and line.per_unit == pytest.approx(0.002)
    assert line.worst == pytest.approx(0, abs=1e-9) and line.r2 == pytest.approx(1.0)
    assert line.exponent == pytest.approx(math.log(2.098 / 0.082) / math.log(1024 / 16))  # < 1: the fixed cost
    assert line.at(2048) == pytest.approx(0.05 + 0.002 * 2048)


def test_least_squares_of_noisy_points_and_the_worst_residual():
    # y = 1 + 2x with the middle point 1 too high: the line's residuals sum to zero, and the worst
    # is the middle one's (2/3 above the fitted 10/3).
    line = costmodel.fit([0, 1, 2], [1, 4, 5])
    assert line.per_unit == pytest.approx(2.0) and line.fixed == pytest.approx(4 / 3)
    assert sum(line.residuals) == pytest.approx(0, abs=1e-12)
    assert line.worst == pytest.approx(2 / 3) and line.r2 == pytest.approx(1 - (2 / 3) / (26 / 3))
    assert line.exponent is None  # a y at x = 0: no power law
    flat = costmodel.fit([5, 5], [1, 3])  # one x only: the mean, no slope
    assert (flat.fixed, flat.per_unit) == (2.0, 0.0)
    with pytest.raises(ValueError):
        costmodel.fit([], [])


def test_the_model_fits_medians_and_projects_to_the_cluster():
    rows = [{"path": "wire", "ids": n, "wall_s": w, "driver_cpu_s": 0.0, "broker_cpu_s": 0.0}
            for n, ws in ((16, (0.1, 0.2, 9.0)), (1024, (1.1, 1.2, 0.5))) for w in ws]  # fmt: skip
    zero = {"vote_cpu_s": 0, "decide_commit_cpu_s": 0, "decide_s": 0, "commit_s": 0}
    protocol = [
        {"slots": s, "sinks": k, "driver_cpu_s": 0.001 + 0.0002 * s * k, **zero} for s in (1, 16, 64) for k in (1, 4)
    ]
    result = costmodel.model({"fencing": rows, "protocol": protocol})
    wire = result["lines"]["fence_wall_s_per_id (wire)"]
    assert wire["per_unit"] == pytest.approx((1.1 - 0.2) / (1024 - 16))  # medians, not means: 9.0 is an outlier
    cluster = costmodel.CLUSTER
    assert result["projection"]["fence_s (wire)"] == pytest.approx(0.2 + wire["per_unit"] * (cluster["pool_ids"] - 16))
    per_epoch = result["projection"]["epoch_driver_cpu_s"]
    assert per_epoch == pytest.approx(0.001 + 0.0002 * cluster["slots"] * cluster["sinks"])
    assert "latest_offset_s" not in result["projection"]  # nothing measured, nothing projected
