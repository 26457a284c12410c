"""The project's own benchmark suite: scenarios, contenders, analysis and plots (not in the wheel).

Run from the repository root (it imports the installed ``raytrain_hetero``; nothing in
``raytrain_hetero`` imports it):

* ``python -m benchmarks SCENARIO [--output DIR] [--repeats N]``: a scenario, every contender
  alternating in one Ray session (:mod:`benchmarks.suite`; scenarios in
  :mod:`benchmarks.scenarios`: hetero2, hetero3, drift, homogeneous3, homogeneous2,
  cpu-gpu-shape, join, cpu-gpu, cpu-real3, conv-split, branches; the ``best-subset``
  contender searches its subset itself, :mod:`benchmarks.best_subset`);
  ``python -m benchmarks tune-sim``: the simulated Tune search on a mixed cluster
  (:mod:`benchmarks.tune_sim`, pure Python, no Ray); ``python -m benchmarks device --output
  DIR [--dry-run]``: the checks a lent GPU machine runs in one go (:mod:`benchmarks.device`);
* ``python -m benchmarks.<module>`` for the single-question benchmarks:
  ``probe_vs_equal``, ``replan_recovery``, ``memory_caps``, ``admission``, ``loader_speed``,
  ``bn_exchange``, ``bn_price``, ``bn_segments``, ``soak`` (fault injection) and
  ``tune_asha`` (a real ASHA search on a local labelled cluster: ``tune.allocation: auto`` vs
  ``fixed`` vs plain Ray Tune + ``TorchTrainer``);
* ``results/``: the measured figures the README and docs cite (``bench.json``, ``COMMAND``,
  tables and plots per run), kept as historical data. A ``COMMAND`` gives the command that
  reproduces its result today; a result recorded with an older form (``raytrain-hetero bench
  SCENARIO``, ``python -m raytrain_hetero.bench.<module>``) says so in its folder's
  ``README.md``.

A user comparing stock Ray Train with raytrain_hetero on their own job runs
``raytrain-hetero bench --config JOB.yaml`` instead (:mod:`raytrain_hetero.app.bench`).
"""
