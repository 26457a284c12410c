#!/bin/bash
# Issue 35 item 5, the longer measurements: the EuroSAT job at 4x the data (2,800 training
# images, 600 validation: one image is 0.17 pt) and torchgeo's L7IrishDataModule (a
# GeoDataModule, unmodified) with SemanticSegmentationTask, per BatchNorm mode x 3 seeds.
# Run from the repository root of a clean clone, nothing else running.
set -u
export RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.2 CI=true
OUT=benchmarks/results/ghost_long
if [ -n "${WAIT_PID:-}" ]; then while kill -0 "$WAIT_PID" 2>/dev/null; do sleep 10; done; fi
mode_args() {
  case $1 in
    exact) echo "--set train.batchnorm=exact";;
    local) echo "--set train.batchnorm=local";;
    ghost*) echo "--set train.batchnorm=ghost --set train.ghost_size=${1#ghost}";;
  esac
}
# train JOB SEED MODE CONFIG...: one fit, its outputs in $OUT/JOB/sSEED-MODE.
train() {
  local job=$1 seed=$2 mode=$3; shift 3
  echo "=== $job seed $seed $mode $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  python -m raytrain_hetero train "$@" --set train.seed=$seed $(mode_args $mode) \
    --output $OUT/$job/s$seed-$mode --no-progress > $OUT/$job-s$seed-$mode.log 2>&1
  echo "rc $?"
}
EUROSAT="--config examples/configs/eurosat_local.yaml --set data.root=data/eurosat_synth400 --set data.generate.samples_per_class=400"
for seed in 0 1 2; do
  echo "=== eurosat400 seed $seed bench $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  python -m raytrain_hetero bench $EUROSAT --set train.seed=$seed --output $OUT/eurosat400/s$seed-bench --overwrite > $OUT/eurosat400-s$seed-bench.log 2>&1
  echo "rc $?"
  for mode in exact ghost16 ghost32 local; do train eurosat400 $seed $mode $EUROSAT; done
done
GDM="--config examples/configs/torchgeo_geodatamodule_local.yaml"
for seed in 0 1 2; do
  for mode in exact ghost2 ghost4 local; do train geodatamodule $seed $mode $GDM; done
done
echo "DONE $(date +%T)"
