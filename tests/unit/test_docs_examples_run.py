"""The docs' Python examples that need no Ray cluster run here (those that train run in
tests/integration/test_docs_examples.py; tests/unit/test_docs.py lists where each block runs).

* examples/measure_file_check.py (included by docs/reliability/security.md), on 30 files;
* the model-parallelism page's conv-split and branch fragments, on a real 2-rank gloo group;
* the Python API page's and the fault page's trainers, built for real (not fitted): the API
  page's loop is the README's, which the integration test trains.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from gloo_group import run_gloo_group

REPO = Path(__file__).resolve().parents[2]
sys.path.append(str(REPO / "tests" / "integration"))  # docs_fixtures: the names blocks assume

from docs_fixtures import docs_block, fixture_namespace, run_block


def test_measure_file_check_example_runs(tmp_path, monkeypatch, capsys):
    import runpy

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    module = runpy.run_path(str(REPO / "examples" / "measure_file_check.py"))
    per_1000 = module["main"](["--samples-per-class", "3", "--repeats", "1"])
    assert per_1000 > 0
    assert "s per 1000 files" in capsys.readouterr().out


def _loop_of(code: str) -> str:
    tree = ast.parse(code)
    (loop,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train_loop"]
    return ast.dump(loop)


def test_python_api_page_builds_its_trainer_and_trains_the_readme_loop():
    """The page's loop is the README's statement for statement (comments and layout aside),
    so the README's run in tests/integration/test_docs_examples.py trains it; its trainer,
    with the page's three pools and elastic settings, is built for real here."""
    where, code = docs_block("docs/how-to/python-api.md", "def train_loop")
    _, readme = docs_block("README.md", "def train_loop")
    assert _loop_of(code) == _loop_of(readme), f"{where}: the loop differs from the README's"
    trainer = run_block(code, where, fit=False)["trainer"]
    assert [w.name for w in trainer.workers] == ["a100", "l4", "cpu"]
    assert len(trainer.specs) == 7 and trainer.elastic.min_workers == 3


def test_fault_injection_page_builds_its_trainer():
    where, code = docs_block("docs/reliability/faults.md", "FaultSpec(")
    trainer = run_block(code, where, fit=False)["trainer"]
    assert len(trainer.faults.faults) == 5


def _run_fragments(rank: int, world_size: int, blocks: list[tuple[str, str]], tmp: str) -> Any:
    """On each rank of a gloo group: the page's fragments with the names they assume."""
    import torch.distributed as dist

    sys.path.append(str(REPO / "tests" / "integration"))
    from docs_fixtures import fixture_namespace

    torch.manual_seed(0)
    fusion_x = torch.randn(8, 12, 8, 8)  # TwoBranchFusionCNN(2, 10, 7): 2 + 10 channels
    names = {
        **fixture_namespace(),
        "group": dist.group.WORLD,
        "rank": rank,
        "input_shapes": {"conv1": (8, 3, 8, 8), "conv2": (8, 8, 8, 8)},
        "emulated_slowdown": 1.0 + rank,
        "path": f"{tmp}/model-{rank}.pt",
        "example_batch": fusion_x,
        "y": torch.arange(8) % 7,
    }
    out = {}
    for where, code in blocks:
        ns = dict(names, x=fusion_x) if "BranchPipeline" in code else dict(names)
        exec(compile(code, where, "exec"), ns)
        out[where] = (
            ns.get("step").loss if "step" in ns else sorted(ns["full_state_dict"](ns["model"]))
        )
    return out


def test_model_parallel_fragments_run_on_a_gloo_group(tmp_path):
    blocks = [
        docs_block("docs/how-to/model-parallelism.md", "split_conv_layers("),
        docs_block("docs/how-to/model-parallelism.md", "BranchPipeline("),
    ]
    results = run_gloo_group(_run_fragments, 2, blocks, str(tmp_path))
    conv, branches = blocks[0][0], blocks[1][0]
    # The unsplit model's state, the same on both ranks; the branch step's loss agreed.
    assert (
        results[0][conv]
        == results[1][conv]
        == ["conv1.bias", "conv1.weight", "conv2.bias", "conv2.weight", "head.bias", "head.weight"]
    )
    assert torch.isfinite(torch.tensor(results[0][branches]))
    assert (tmp_path / "model-0.pt").exists() and (tmp_path / "model-1.pt").exists()


def test_harness_swaps_only_what_a_laptop_lacks():
    """Local workers replace the pools only when the trainer runs or the pools are elided;
    the test's sizes are merged over the shown train_loop_config."""
    code = (
        "t = HeteroTrainer(loop, train_loop_config={'epochs': 5, 'lr': 0.1}, "
        "workers=[WorkerSpec(name='gpu', resources={'CPU': 2, 'GPU': 1})], batch={'global_batch_size': 8})"
    )
    built = run_block(code, "built", fit=False)["t"]
    assert built.workers[0].name == "gpu"
    ran = run_block(code, "ran", loop_config={"epochs": 1})["t"]
    assert [w.name for w in ran.workers] == [w.name for w in fixture_namespace()["LOCAL_WORKERS"]]
    assert ran.train_loop_config == {"epochs": 1, "lr": 0.1}


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
