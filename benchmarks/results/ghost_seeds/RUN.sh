#!/bin/bash
# Waits for the CI run, then: three scenarios x 5 contenders x 3 seeds, then the EuroSAT and
# hyperspectral jobs per BatchNorm mode x 3 seeds.
# (the script first waited for a CI run to end)
cd <a fresh clone>
export PYTHONPATH=<a fresh clone> RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.2 CI=true
C=stock,hetero,hetero-local,hetero-ghost16,hetero-ghost32
for sc in hetero2 hetero3 homogeneous3; do
  echo "=== $sc $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  python -m benchmarks $sc --repeats 3 --seed 0 --contenders $C --data-root data/bench --output benchmarks/results/ghost_seeds/$sc > benchmarks/results/ghost_seeds/$sc.log 2>&1
  echo "rc $? $(date +%T)"
done
for job in eurosat_local hyperspectral_local; do
  for seed in 0 1 2; do
    echo "=== $job seed $seed bench $(date +%T)"
    python -m raytrain_hetero bench --config examples/configs/$job.yaml --set train.seed=$seed --output benchmarks/results/ghost_seeds/$job/s$seed-bench --overwrite > benchmarks/results/ghost_seeds/$job-s$seed-bench.log 2>&1
    echo "rc $?"
    for mode in exact ghost16 ghost32 local; do
      case $mode in exact) extra="--set train.batchnorm=exact";; ghost16) extra="--set train.batchnorm=ghost --set train.ghost_size=16";; ghost32) extra="--set train.batchnorm=ghost --set train.ghost_size=32";; local) extra="--set train.batchnorm=local";; esac
      echo "=== $job seed $seed $mode $(date +%T)"
      python -m raytrain_hetero train --config examples/configs/$job.yaml --set train.seed=$seed $extra --output benchmarks/results/ghost_seeds/$job/s$seed-$mode --no-progress > benchmarks/results/ghost_seeds/$job-s$seed-$mode.log 2>&1
      echo "rc $?"
    done
  done
done
echo "DONE $(date +%T)"
