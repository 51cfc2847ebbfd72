"""Schedule search: `kiln.tune` measures candidate schedules of a model's kernels on this
machine and writes a tuning log; `kiln.build(mod, tuning_log=path)` builds with it.

- kiln/loops/tunable.py: search spaces (declared beside each schedule: gemm.py,
  conv_kernels.py) and the overrides a build takes knobs from;
- sites.py: a model's tunable kernels, and each one alone as a program;
- measure.py: compiling, checking and timing one candidate;
- tuner.py: the search and its budget;
- log.py: the log's format, reading and writing it.
"""

from kiln.tune.log import Entry, TuningLogError, overrides_from_log, read_log
from kiln.tune.tuner import KernelResult, TuneProgress, TuneResult, tune

__all__ = ["Entry", "KernelResult", "TuneProgress", "TuneResult", "TuningLogError",
           "overrides_from_log", "read_log", "tune"]
