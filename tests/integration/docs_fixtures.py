"""The names the docs' Python examples assume but do not define (``build_model``,
``train_dataset``, ...), small enough to run, and the harness that runs a block.

Importable by reference on Ray workers (the tests' runtime env puts this folder on their
``PYTHONPATH``), so a loop executed from a docs block pickles these by name.
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import raytrain_hetero as rh

SAMPLES, CLASSES, CHANNELS, SIDE = 48, 4, 3, 8


def build_model() -> nn.Module:
    """A small CNN with the layer names the model-parallelism page splits (conv1, conv2)."""
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(CHANNELS, 8, 3, padding=1)
            self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
            self.head = nn.Linear(8, CLASSES)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = F.relu(self.conv2(F.relu(self.conv1(x))))
            return self.head(x.mean((2, 3)))

    return Net()


def _images() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(SAMPLES, CHANNELS, SIDE, SIDE, generator=g), torch.randint(
        0, CLASSES, (SAMPLES,), generator=g
    )


class DictDataset(torch.utils.data.Dataset):
    """``{"image", "label"}`` items, as the Python API page's loop reads them."""

    def __init__(self) -> None:
        self.x, self.y = _images()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"image": self.x[i], "label": self.y[i]}


train_dataset = DictDataset()
#: ``(image, label)`` items, as the model-parallel loop reads them.
dataset = torch.utils.data.TensorDataset(*_images())
x = dataset.tensors[0]


def load_checkpoint() -> dict[str, Any] | None:
    """A fresh run: nothing to resume from."""
    return None


def loop(config: dict[str, Any]) -> None:
    """The loop a block passes by name without showing it (faults.md)."""


#: Two local 1-CPU workers replace the cluster pools a block names (GPUs, label selectors).
LOCAL_WORKERS = [rh.WorkerSpec(name="fast"), rh.WorkerSpec(name="slow", emulated_slowdown=2.0)]


def fixture_namespace() -> dict[str, Any]:
    """What a block may use without importing it: the fixtures above and ``import
    raytrain_hetero as rh`` and the package's public classes (assumed in the docs' prose, as
    tests/unit/test_docs.py's name check assumes them), ``torch``, ``F``, ``nn``."""
    return {
        **{name: getattr(rh, name) for name in rh.__all__ if name[0].isupper()},
        "rh": rh,
        "raytrain_hetero": rh,
        "torch": torch,
        "F": F,
        "nn": nn,
        "build_model": build_model,
        "train_dataset": train_dataset,
        "dataset": dataset,
        "x": x,
        "load_checkpoint": load_checkpoint,
        "loop": loop,
        "LOCAL_WORKERS": LOCAL_WORKERS,
    }


class _Overrides(ast.NodeTransformer):
    """Swap keyword values of ``HeteroTrainer(...)`` calls: ``workers=`` becomes
    ``LOCAL_WORKERS`` (when the block runs, or its pools are elided), ``train_loop_config``
    gets the test's sizes merged in, and ``run_config=`` (tmp storage) is added if absent."""

    def __init__(self, loop_config: dict[str, Any], fit: bool) -> None:
        self.loop_config, self.fit = loop_config, fit

    def visit_Call(self, node: ast.Call) -> ast.Call:
        self.generic_visit(node)
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name != "HeteroTrainer":
            return node
        keywords = list(node.keywords)
        if not any(kw.arg == "run_config" for kw in keywords):  # results in tmp, not ~/
            keywords.append(ast.keyword("run_config", ast.Name("RUN_CONFIG", ast.Load())))
        for kw in keywords:
            # A run gets local workers; a trainer only built keeps the shown pools unless
            # they are elided (``workers=[...]``).
            if kw.arg == "workers" and (self.fit or _elided(kw.value)):
                kw.value = ast.Name("LOCAL_WORKERS", ast.Load())
        if self.loop_config:
            sizes = ast.parse(repr(self.loop_config), mode="eval").body
            shown = next((kw for kw in keywords if kw.arg == "train_loop_config"), None)
            if shown is None:
                keywords.append(ast.keyword("train_loop_config", sizes))
            else:  # {**shown, **sizes}: the test's sizes win
                shown.value = ast.Dict([None, None], [shown.value, sizes])
        node.keywords = keywords
        return node


def _elided(expr: ast.expr) -> bool:
    return any(isinstance(n, ast.Constant) and n.value is Ellipsis for n in ast.walk(expr))


class _NoFit(ast.NodeTransformer):
    """Drop the statements that call ``.fit()``, and those that use what they bound (a
    ``print(result.metrics)``): the trainer is built for real, not run."""

    def visit_Module(self, node: ast.Module) -> ast.Module:
        unbound: set[str] = set()
        kept = []
        for stmt in node.body:
            if _calls_fit(stmt):
                targets = getattr(stmt, "targets", [])
                unbound.update(
                    n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)
                )
                continue
            if any(isinstance(n, ast.Name) and n.id in unbound for n in ast.walk(stmt)):
                continue
            kept.append(stmt)
        node.body = kept
        return node


def _calls_fit(stmt: ast.stmt) -> bool:
    value = getattr(stmt, "value", None)
    return (
        isinstance(stmt, ast.Assign | ast.Expr)
        and isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr == "fit"
    )


def run_block(
    code: str,
    where: str,
    *,
    loop_config: dict[str, Any] | None = None,
    run_config: Any = None,
    fit: bool = True,
    extra: dict[str, Callable[..., Any] | Any] | None = None,
) -> dict[str, Any]:
    """Execute a docs block as shown, but for the :class:`_Overrides` (and without its
    ``.fit()`` calls when ``fit`` is false); returns its namespace.

    The namespace's ``__name__`` is no importable module, so Ray pickles the block's own
    functions (its ``train_loop``) by value and the fixtures they use by reference.
    """
    tree = _Overrides(loop_config or {}, fit).visit(ast.parse(code))
    if not fit:
        tree = _NoFit().visit(tree)
    tree = ast.fix_missing_locations(tree)
    namespace = {
        "__name__": "docs_block",
        "RUN_CONFIG": run_config,
        **fixture_namespace(),
        **(extra or {}),
    }
    exec(compile(tree, where, "exec"), namespace)
    return namespace


# ------------------------------------------------------------------------ the docs' blocks

REPO = Path(__file__).resolve().parents[2]
FENCE = re.compile(
    r"^(?P<indent>[ ]*)(?P<fence>```+)python\n(?P<body>.*?)^(?P=indent)(?P=fence)[ ]*$", re.M | re.S
)


def docs_block(page: str, marker: str) -> tuple[str, str]:
    """(``page:line``, code) of the one ``python`` block of ``page`` (relative to the repo)
    that contains ``marker``: found by content, so edits around it do not move it."""
    text = (REPO / page).read_text(encoding="utf-8")
    found = [m for m in FENCE.finditer(text) if marker in m.group("body")]
    assert len(found) == 1, f"{page}: {len(found)} python blocks contain {marker!r}"
    line = text.count("\n", 0, found[0].start()) + 1
    return f"{page}:{line}", textwrap.dedent(found[0].group("body"))


def fragment_loop(config: dict[str, Any]) -> None:
    """A worker loop that runs docs fragments written for the inside of a training loop:
    each ``(setup, code)`` of ``config["fragments"]`` runs in one namespace (the fixtures plus
    what the earlier fragments bound), then the loop reports once."""
    namespace: dict[str, Any] = {"__name__": "docs_fragment", **fixture_namespace()}
    for where, setup, code in config["fragments"]:
        exec(compile(setup, f"{where} (setup)", "exec"), namespace)
        exec(compile(code, where, "exec"), namespace)
    rh.report({"fragments": len(config["fragments"])})
