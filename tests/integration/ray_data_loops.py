"""Ray Data sources and the train loop of tests/integration/test_ray_data.py.

The sources are real Ray Data pipelines over files in their real formats: GeoTIFFs read as
bytes (``read_binary_files``) and decoded by rasterio in a ``map_batches`` (Ray Data tasks,
not the training processes), and parquet (local or in the S3 server's bucket).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from ledgers import record_checkpoint, record_restore, record_step

import raytrain_hetero as rh

BANDS, SIDE, CLASSES = 4, 8, 3


def write_geotiffs(root: Path, count: int) -> Path:
    """``count`` 4-band uint16 GeoTIFFs ``tile_<id>.tif`` (class = id % 3 sets the spectrum)."""
    import rasterio
    from rasterio.transform import from_origin

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        base = np.array([200, 400, 800, 1600])[np.roll(np.arange(BANDS), i % CLASSES)]
        pixels = (base[:, None, None] + rng.integers(0, 50, (BANDS, SIDE, SIDE))).astype(np.uint16)
        profile = {
            "driver": "GTiff",
            "height": SIDE,
            "width": SIDE,
            "count": BANDS,
            "dtype": "uint16",
            "crs": "EPSG:32632",
            "transform": from_origin(500000 + 80 * i, 4600000, 10, 10),
        }
        with rasterio.open(root / f"tile_{i}.tif", "w", **profile) as dst:
            dst.write(pixels)
    return root


def write_parquet(path: Path | str, count: int, files: int = 3, filesystem=None) -> None:
    """``count`` rows (id, x: 6 floats, label) in ``files`` parquet files under ``path``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(1)
    for f, ids in enumerate(np.array_split(np.arange(count), files)):
        x = rng.normal(size=(len(ids), 6)).astype(np.float32)
        table = pa.table(
            {"id": ids, "label": ids % CLASSES, **{f"x{j}": x[:, j] for j in range(6)}}
        )
        pq.write_table(table, f"{path}/part-{f}.parquet", filesystem=filesystem)


def decode_geotiffs(batch: dict) -> dict:
    """map_batches UDF: GeoTIFF bytes -> normalised float32 image, label, id, decoder's pid."""
    from rasterio.io import MemoryFile

    images, ids = [], []
    for data, path in zip(batch["bytes"], batch["path"], strict=True):
        with MemoryFile(bytes(data)) as memfile, memfile.open() as src:
            images.append(src.read().astype(np.float32) / 2000.0)
        ids.append(int(re.search(r"tile_(\d+)\.tif", str(path)).group(1)))
    ids = np.array(ids, dtype=np.int64)
    return {
        "image": np.stack(images),
        "label": ids % CLASSES,
        "id": ids,
        "decoded_by": np.full(len(ids), os.getpid()),
    }


def parquet_features(batch: dict) -> dict:
    """map_batches UDF: the x columns as one float32 matrix."""
    x = np.stack([batch[f"x{j}"] for j in range(6)], axis=1).astype(np.float32)
    return {"x": x, "label": batch["label"], "id": batch["id"]}


def fresh_model(column: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The loop's model before training (seeded: the same on every rank and in the test).

    The parquet features (``x``) go through a BatchNorm layer: the S3 fit trains it under
    ``batchnorm: ghost``."""
    torch.manual_seed(0)
    if column == "image":
        return torch.nn.Linear(BANDS * SIDE * SIDE, CLASSES).to(dtype)
    hidden = 8
    return torch.nn.Sequential(
        torch.nn.Linear(6, hidden),
        torch.nn.BatchNorm1d(hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, CLASSES),
    ).to(dtype)


def ray_data_loop(config: dict) -> None:
    """Records each rank's row ids per step; switches plan mid-epoch; fails once after the
    first epoch's checkpoint (when ``fail_once``); ranks write the validation ids they got and
    their final state dict (``final_rank<r>.pt``)."""
    column = config["column"]
    dtype = getattr(torch, config.get("dtype", "float32"))
    model = rh.prepare_model(fresh_model(column, dtype))
    optim = rh.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    checkpoint = __import__("ray").train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "model.pt"), weights_only=True)
        model.module.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
    shard = rh.get_dataset_shard("train")
    info = rh.get_rank_info()
    out = Path(config["out"])
    record_restore(out, info, shard.state.carver.global_step(shard.state.cursor), model)
    rank = info["rank"]
    with (out / f"ledger_rank{rank}_{info['group']}.jsonl").open("a") as ledger:
        for epoch in range(shard.epoch, config["epochs"]):
            for batch in shard.iter_torch_batches(dtypes={column: dtype}):
                step = rh.current_step_number()
                record_step(ledger, epoch, step, batch["id"].tolist(), info)
                if "decoded_by" in batch:
                    pids = sorted(set(batch["decoded_by"].tolist()))
                    with (out / f"decoders_rank{rank}.txt").open("a") as f:
                        f.write(f"{pids}\n")
                loss = F.cross_entropy(model(batch[column].flatten(1)), batch["label"])
                optim.zero_grad()
                loss.backward()
                optim.step()
                rh.log_step_metrics(loss=loss.item())
                if step == config["replan_at"]:
                    rh.update_plan(shares=config["new_shares"], reason="test switch")
            if config.get("val"):
                val = rh.get_dataset_shard("val")
                ids = [i for b in val.iter_batches(batch_size=7) for i in b["id"].tolist()]
                (out / f"val_rank{rank}_epoch{epoch}.json").write_text(json.dumps(ids))
            with tempfile.TemporaryDirectory() as d:
                torch.save(
                    {"model": model.module.state_dict(), "optim": optim.state_dict()},
                    os.path.join(d, "model.pt"),
                )
                resume_at = shard.state.carver.global_step(shard.state.cursor)
                if rank == 0:
                    record_checkpoint(out, info, resume_at, model)
                rh.report(
                    {"epoch": epoch},
                    checkpoint=__import__("ray").train.Checkpoint.from_directory(d),
                )
            marker = out / "failed_once"
            if config.get("fail_once") and not marker.exists():
                torch.distributed.barrier()
                if rank == 0:
                    marker.write_text("1")
                raise RuntimeError("injected failure after an epoch-end checkpoint")
    (out / f"pid_rank{rank}.txt").write_text(str(os.getpid()))
    # Every rank's final parameters and running statistics (the test compares them).
    torch.save(model.module.state_dict(), out / f"final_rank{rank}.pt")
