#!/bin/bash
export RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.2
for arm in old0 new0 old1 new1 old2 new2; do
  case $arm in old*) d=<clone at 4af51e4 (per-worker cache)>;; new*) d=<clone at 928bb37 (per-node cache)>;; esac
  cd $d
  echo "=== $arm $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  s=$(date +%s.%N)
  CI=true PYTHONPATH=$d python -m raytrain_hetero train --config examples/configs/eurosat_local.yaml --output benchmarks/results/data_cache_mainjob/$arm > benchmarks/results/data_cache_mainjob/$arm.log 2>&1
  rc=$?
  e=$(date +%s.%N)
  echo "rc $rc wall $(python -c "print(round($e-$s,1))") $(date +%T)"
done
echo DONE
