"""Calibration observers (DESIGN.md §5 step 4): streaming, fixed-size, mergeable.

Each observer watches one tensor's values batch by batch and renders the
scale/offset of its chosen range into the tensor's config::

    observer = make_observer(config)        # from config.observer_algorithm
    for batch in data:
        observer.observe(values)            # any shape; channels on config.channel_axis
    observer.render()                       # config.set_scale_offset(...); the state is the pass's

=============== ==================================================================
algorithm       range
=============== ==================================================================
``minmax``      running min and max
``mean_minmax`` mean over samples of each sample's min and max (NNCF's default)
``percentile``  a percentile (99.99) of x (asymmetric) or |x| (symmetric), histogram
``kl``          TensorRT entropy calibration on a 2048-bin |x| histogram
``entropy``     alias of ``kl``
``mse``         smallest estimated squared quantization error, histogram
``search``      TPU-MLIR threshold tuning: KL, then candidates() / select() by the pass
``unit``        scale 1 (FP16/BF16 grids used as plain casts)
``auto``        mean_minmax and mse both kept; the calibration pass keeps the one whose quantized graph is
                closer to FP32 on held-aside calibration samples
=============== ==================================================================

Memory does not grow with the number of batches (see ``state_nbytes``);
observers of shards merge with :meth:`Observer.merge`.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from ppqlike.core.errors import QuantizationPolicyError

from .base import Observer
from .choice import ChoiceObserver
from .histogram import HistogramObserver, PercentileObserver, histogram_quantile
from .kl import KLObserver, SearchObserver, kl_best_bins, kl_divergences
from .mean_minmax import MeanMinMaxObserver
from .minmax import MinMaxObserver, UnitScaleObserver
from .mse import MSEObserver

__all__ = ["Observer", "HistogramObserver", "MinMaxObserver", "PercentileObserver", "KLObserver",
           "MSEObserver", "SearchObserver", "MeanMinMaxObserver", "ChoiceObserver", "OBSERVER_TYPES", "make_observer", "histogram_quantile",
           "kl_best_bins", "kl_divergences"]

OBSERVER_TYPES: Mapping[str, type] = MappingProxyType({
    "minmax": MinMaxObserver,
    "mean_minmax": MeanMinMaxObserver,
    "percentile": PercentileObserver,
    "kl": KLObserver,
    "entropy": KLObserver,
    "mse": MSEObserver,
    "search": SearchObserver,
    "auto": ChoiceObserver,
    "unit": UnitScaleObserver,
})


def make_observer(config, **options) -> Observer:
    """The observer named by ``config.observer_algorithm`` (case-insensitive), built on ``config``.

    ``options`` go to the observer's constructor (e.g. ``percentile=99.9``,
    ``bins=4096``, ``num_candidates=40``).  An unknown name raises
    QuantizationPolicyError listing the valid ones.
    """
    name = str(config.observer_algorithm).strip().lower()
    cls = OBSERVER_TYPES.get(name)
    if cls is None:
        who = f"tensor {config.name!r}" if getattr(config, "name", "") else "unnamed tensor"
        valid = ", ".join(sorted(OBSERVER_TYPES))
        raise QuantizationPolicyError(f"{who}: unknown observer algorithm {config.observer_algorithm!r}; "
                                      f"expected one of {valid}")
    try:
        return cls(config, **options)
    except TypeError as exc:
        raise QuantizationPolicyError(f"observer {name!r}: bad options {sorted(options)}: {exc}") from None
