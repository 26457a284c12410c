#!/bin/bash
cd <a fresh clone>
export PYTHONPATH=<a fresh clone> RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.2
for arm in none preload none preload; do
  i=$((i+1))
  if [ $arm = preload ]; then export RAY_preload_python_modules=torch,ray.train.torch,raytrain_hetero; else unset RAY_preload_python_modules; fi
  echo "=== $i $arm $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  python -m benchmarks join --repeats 1 --contenders hetero,stock --no-warmup --data-root data/bench --output benchmarks/results/join_preload/$i-$arm > /tmp/preload/$i-$arm.log 2>&1
  echo "rc $? $(date +%T)"
done
echo DONE
