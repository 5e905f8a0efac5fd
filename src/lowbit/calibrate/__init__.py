"""Calibration: observers and statistics that produce ranges, scales and zero points; they never quantize.

- :mod:`~lowbit.calibrate.builders`: nGraph-style builders, [min, max] -> (scale, zero point), and an
  ``affine`` FormatSpec from them.
- :mod:`~lowbit.calibrate.observers`: the Observer base, MinMax, MovingAverageMinMax and Percentile
  observers, per tensor / per channel / per block; :mod:`~lowbit.calibrate.histogram_observers`: the MSE
  and Histogram (KL) search observers.
- :mod:`~lowbit.calibrate.magnitude`: MagnitudeObserver, the means of magnitudes behind binary / ternary
  scales (plus the range).
- :mod:`~lowbit.calibrate.specs`: ``calibrated_spec(observer, fmt)``, a FormatSpec of any scaled format with
  its scales frozen from an observer.
- :mod:`~lowbit.calibrate.quantile`: a bounded-memory quantile sketch with a proven error bound;
  :mod:`~lowbit.calibrate.histogram`: the dyadic histogram the search observers keep, and KL divergences.

See docs/calibration.md.
"""

from lowbit.calibrate.builders import ScaleZeroPoint, affine_spec, scale_zero_point
from lowbit.calibrate.observers import (
    MinMax,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    Observer,
    PercentileObserver,
)
from lowbit.calibrate.histogram_observers import HistogramObserver, MSEObserver
from lowbit.calibrate.magnitude import MagnitudeObserver
from lowbit.calibrate.histogram import DyadicHistogram
from lowbit.calibrate.quantile import GroupedQuantileSketch, QuantileSketch
from lowbit.calibrate.specs import calibrated_spec

__all__ = [
    "DyadicHistogram", "GroupedQuantileSketch", "HistogramObserver", "MagnitudeObserver", "MinMax", "MinMaxObserver",
    "MovingAverageMinMaxObserver", "MSEObserver", "Observer", "PercentileObserver", "QuantileSketch",
    "ScaleZeroPoint", "affine_spec", "calibrated_spec", "scale_zero_point",
]  # fmt: skip
