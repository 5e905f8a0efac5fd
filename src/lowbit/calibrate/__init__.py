"""Calibration: observers and statistics that produce ranges, scales and zero points; they never quantize.

- :mod:`~lowbit.calibrate.builders`: nGraph-style builders, [min, max] -> (scale, zero point), and an
  ``affine`` FormatSpec from them.
- :mod:`~lowbit.calibrate.observers`: MinMax, MovingAverageMinMax, Percentile, MSE and Histogram (KL)
  observers, per tensor / per channel / per block.
- :mod:`~lowbit.calibrate.magnitude`: MagnitudeObserver, the means of magnitudes behind binary / ternary
  scales (plus the range).
- :mod:`~lowbit.calibrate.specs`: ``calibrated_spec(observer, fmt)``, a FormatSpec of any scaled format with
  its scales frozen from an observer.
- :mod:`~lowbit.calibrate.quantile`: a bounded-memory quantile sketch with a proven error bound, and the
  dyadic histogram the search observers keep.

See docs/calibration.md.
"""

from lowbit.calibrate.builders import ScaleZeroPoint, affine_spec, scale_zero_point
from lowbit.calibrate.observers import (
    HistogramObserver,
    MinMax,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MSEObserver,
    Observer,
    PercentileObserver,
)
from lowbit.calibrate.magnitude import MagnitudeObserver
from lowbit.calibrate.quantile import DyadicHistogram, GroupedQuantileSketch, QuantileSketch
from lowbit.calibrate.specs import calibrated_spec

__all__ = [
    "DyadicHistogram", "GroupedQuantileSketch", "HistogramObserver", "MagnitudeObserver", "MinMax", "MinMaxObserver",
    "MovingAverageMinMaxObserver", "MSEObserver", "Observer", "PercentileObserver", "QuantileSketch",
    "ScaleZeroPoint", "affine_spec", "calibrated_spec", "scale_zero_point",
]  # fmt: skip
