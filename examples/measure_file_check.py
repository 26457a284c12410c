"""Seconds per 1000 files of the up-front EuroSAT bad-file check (docs/reliability/security.md).

Generates ``--samples-per-class`` 64x64x13 uint16 GeoTIFFs per class (10 classes) in a
temporary folder, then times ``find_unreadable_files`` over them, best of ``--repeats``::

    python examples/measure_file_check.py            # 1000 files, ~1 min on 2 cores
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from raytrain_hetero.workloads.data import generate_dataset
from raytrain_hetero.workloads.eurosat import EUROSAT_SPLITS, eurosat_datasets
from raytrain_hetero.workloads.file_checks import find_unreadable_files
from raytrain_hetero.workloads.registry import BadFileScan, DataSource, GenerateOptions


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples-per-class", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    # measure: start
    tmp = Path(tempfile.mkdtemp())
    options = GenerateOptions(samples_per_class=args.samples_per_class, size=64)
    src = DataSource("eurosat", tmp / "e", generate=options)
    generate_dataset(src)
    opened = eurosat_datasets(src.root, splits=EUROSAT_SPLITS, normalize=False)
    scan = BadFileScan.of_image_folders(opened.values())
    runs = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        assert find_unreadable_files(scan.files, scan.read) == []
        runs.append(time.perf_counter() - started)
    per_1000 = 1000 * min(runs) / len(scan.files)
    print(f"{per_1000:.2f} s per 1000 files")
    shutil.rmtree(tmp)
    # measure: end
    return per_1000


if __name__ == "__main__":
    main()
