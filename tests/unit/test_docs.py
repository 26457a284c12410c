"""The docs cannot rot: the site builds with warnings as errors, the generated configuration
reference lists every field, and every example in the docs and the README still matches the
code (YAML validated by the job loader, ``--set`` keys resolved in the schema, Python compiled
with every ``raytrain_hetero`` name and keyword resolved, included files loaded), and every
Python block and included example file is RUN by a named test (``RUN_BLOCKS``,
``RUN_INCLUDED``: tests/integration/test_docs_examples.py trains on one shared Ray,
tests/unit/test_docs_examples_run.py runs the rest) or listed check-only with its reason.

No Ray is started. The build imports the package (autodoc), ~15 s on 2 cores.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import inspect
import re
import sys
import textwrap
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from raytrain_hetero.app.config import JobConfig, load_config, validate_config
from raytrain_hetero.config import HeteroModel

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def _extension(name: str) -> Any:
    """One of the docs' own Sphinx extensions (docs/_ext/, not part of the package), by path."""
    spec = importlib.util.spec_from_file_location(name, DOCS / "_ext" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


rh_docs = _extension("rh_docs")
rh_api = _extension("rh_api")

#: Every page of the site plus the README (the pages the user reads examples from).
PAGES = [*sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts), REPO / "README.md"]

FENCE = re.compile(
    r"^(?P<indent>[ ]*)(?P<fence>```+|~~~+)(?P<lang>[^\n`]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ ]*$",
    re.M | re.S,
)

#: Enough of a job for a fragment (``probe: {mode: probe}``) to validate as a whole file.
BASE_JOB: dict[str, Any] = {"data": {"root": "data/x"}, "workers": [{"name": "a"}, {"name": "b"}]}


def blocks(lang: str) -> list[tuple[str, str]]:
    """(``page:line``, code) of every fenced block of ``lang`` in the pages."""
    out = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            if match.group("lang").strip().lower() == lang:
                line = text.count("\n", 0, match.start()) + 1
                where = f"{page.relative_to(REPO)}:{line}"
                out.append((where, textwrap.dedent(match.group("body"))))
    return out


def _ids(items: list[tuple[str, str]]) -> list[str]:
    return [where for where, _ in items]


# ------------------------------------------------------------------------------ the build


def test_site_builds_with_warnings_as_errors() -> None:
    """A broken link or anchor, a page in no toctree, a bad directive, a config field without
    a docstring entry or a renamed function in the API reference fails the build.

    The HTML build (tests/unit/docs_site.py), once per session: tests/unit/test_docs_layout.py
    checks the pages it writes.
    """
    from docs_site import built_site

    built = built_site()
    assert built.returncode == 0, built.output[-6000:]


# ------------------------------------------------------------------ generated references


def test_config_reference_lists_every_field_of_every_group() -> None:
    """Every field of every config class a job file or the Python API takes is in the
    generated reference, with docstring text."""
    text = rh_docs.config_reference_rst()
    sections = rh_docs.walk_job_config()
    covered = {s.cls for s in sections}
    for section in sections:
        for name in rh_docs._field_names(section.cls):
            key = f"{section.key}.{name}" if section.key else name
            assert f"``{key}``" in text, f"{key} ({section.cls.__name__}) missing"
    import raytrain_hetero.config as config

    groups = [
        obj
        for obj in vars(config).values()
        if isinstance(obj, type) and issubclass(obj, HeteroModel) and obj is not HeteroModel
    ]
    extra = {s.cls for s in rh_docs.python_only_sections(covered)}
    for group in groups:
        if group in covered or group in extra:
            continue
        # A group the job extends (train: is a BatchConfig): its fields are the subclass's.
        sub = [c for c in covered if issubclass(c, group)]
        assert sub, f"{group.__name__} is in no section of the configuration reference"
        for name in group.model_fields:
            assert any(f".{name}``" in text or f"``{name}``" in text for _ in sub), name
    for section in rh_docs.python_only_sections(covered):
        for name in rh_docs._field_names(section.cls):
            assert f"``{name}``" in text
    assert rh_docs.undocumented_fields() == []


def test_attribute_docs_are_read_from_the_class_docstring() -> None:
    from raytrain_hetero.app.config import TrainConfig
    from raytrain_hetero.config import BatchConfig

    docs = rh_docs.attribute_docs(TrainConfig)
    assert docs["lr"] == "SGD learning rate."  # one line holding three fields, split
    assert docs["momentum"] == "SGD momentum."
    assert docs["min_slice"] == rh_docs.attribute_docs(BatchConfig)["min_slice"]  # inherited
    assert docs["global_batch_size"].startswith("As BatchConfig")  # the subclass's own wins


def test_cli_reference_covers_every_subcommand_and_option() -> None:
    from raytrain_hetero.app.cli import build_parser

    text = rh_docs.cli_reference_rst()
    parser = build_parser()
    for name, sub in rh_docs._subcommands(parser).items():
        assert f"``raytrain-hetero {name}``" in text
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for flag in action.option_strings:
                assert flag in text, f"{name} {flag}"


def test_api_reference_lists_every_public_name() -> None:
    import raytrain_hetero as rh

    listed = [entry.name for entries in rh_api.public_api().values() for entry in entries]
    assert sorted(listed) == sorted(name for name in rh.__all__ if not name.startswith("__"))


def test_api_reference_has_a_page_per_area() -> None:
    """Each area is a page under docs/reference/api/ that the API index lists."""
    index = (DOCS / "reference" / "api.rst").read_text()
    for area in rh_api.API_AREAS:
        page = DOCS / "reference" / "api" / f"{area.page}.rst"
        assert page.is_file(), f"no page {page.relative_to(REPO)} for area {area.page}"
        assert f".. public-api:: {area.page}\n" in page.read_text()
        assert f"   api/{area.page}\n" in index


def test_internal_paths_resolve_to_the_public_entry() -> None:
    """A docstring's :class:`~raytrain_hetero.driver.trainer.HeteroTrainer` links to the
    entry of ``raytrain_hetero.HeteroTrainer`` (wherever the class is defined)."""
    import raytrain_hetero as rh

    trainer = f"{rh.HeteroTrainer.__module__}.HeteroTrainer"
    assert rh_api.public_target(trainer) == "raytrain_hetero.HeteroTrainer"
    assert rh_api.public_target(f"{trainer}.fit") == "raytrain_hetero.HeteroTrainer.fit"
    report = f"{rh.report.__module__}.report"
    assert rh_api.public_target(report) == "raytrain_hetero.report"
    strategy = f"{rh.lightning.__name__}.HeteroDDPStrategy"
    assert rh_api.public_target(strategy) == "raytrain_hetero.lightning.HeteroDDPStrategy"
    assert rh_api.public_target("raytrain_hetero.core.allocation") is None  # not public


def test_worker_table_in_get_started_has_the_real_header() -> None:
    from raytrain_hetero.app.outputs import format_worker_table

    real = format_worker_table([{"rank": 0, "worker": "w", "device": "cpu"}]).splitlines()[0]
    text = (DOCS / "get-started" / "index.md").read_text()
    shown = text.split("```text\n", 1)[1].splitlines()[0]
    assert shown.split() == real.split()


# ----------------------------------------------------------------------------- YAML blocks

YAML_BLOCKS = blocks("yaml")


def test_docs_have_yaml_examples() -> None:
    assert len(YAML_BLOCKS) >= 5


@pytest.mark.parametrize(("where", "code"), YAML_BLOCKS, ids=_ids(YAML_BLOCKS))
def test_yaml_example_validates_as_a_job(where: str, code: str) -> None:
    """A YAML block with a job key is a job file or a fragment of one: merged over a minimal
    job it must validate through the real loader; other YAML (Ray cluster configs, KubeRay
    manifests) is left to tests/integration/test_deploy.py, which checks the files in deploy/."""
    data = yaml.safe_load(code)
    if not isinstance(data, dict) or not set(data) & set(JobConfig.model_fields):
        pytest.skip("not a job file (cluster or Kubernetes YAML)")
    unknown = set(data) - set(JobConfig.model_fields)
    assert not unknown, f"{where}: not job sections: {sorted(unknown)}"
    validate_config(_merged(BASE_JOB, _no_ellipsis(data)), source=where)


def _no_ellipsis(data: Any) -> Any:
    """Drop ``...`` keys: a block written ``data: {source: ray_data, ...}`` elides the rest."""
    if isinstance(data, dict):
        return {k: _no_ellipsis(v) for k, v in data.items() if k != "..."}
    return data


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def _included(suffix: str) -> list[tuple[str, Path]]:
    out = []
    for page in PAGES:
        for match in re.finditer(r"```\{(?:literalinclude|include)\}\s+(\S+)", page.read_text()):
            path = (page.parent / match.group(1)).resolve()
            if path.suffix == suffix:
                out.append((f"{page.relative_to(REPO)} -> {match.group(1)}", path))
    return out


@pytest.mark.parametrize(("where", "path"), _included(".yaml"), ids=_ids(_included(".yaml")))
def test_included_job_files_load(where: str, path: Path) -> None:
    load_config(path)


# ------------------------------------------------------------------------ --set overrides


def _schema_has(cls: Any, keys: list[str]) -> bool:
    """Whether a dotted override path names a field of the job schema (list items by index,
    mapping values by any key)."""
    if not keys:
        return True
    origin = typing.get_origin(cls)
    args = typing.get_args(cls)
    if origin is typing.Annotated:
        return _schema_has(args[0], keys)
    if origin in (typing.Union, __import__("types").UnionType):
        return any(_schema_has(a, keys) for a in args if a is not type(None))
    if origin in (list, tuple):
        return keys[0].isdigit() and any(_schema_has(a, keys[1:]) for a in args if a is not ...)
    if origin is dict:
        return _schema_has(args[1], keys[1:])
    fields = rh_docs._field_names(cls) if isinstance(cls, type) else []
    if keys[0] not in fields:
        return False
    hints = typing.get_type_hints(cls, include_extras=True)
    return _schema_has(hints[keys[0]], keys[1:])


def _set_keys() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(r"--set[ =]+([A-Za-z_][\w.]*)=", text):
            if "." not in match.group(1) and match.group(1) not in JobConfig.model_fields:
                continue  # a placeholder: --set key=value, --set KEY=VALUE
            line = text.count("\n", 0, match.start()) + 1
            out.append((f"{page.relative_to(REPO)}:{line}", match.group(1)))
    return out


SET_KEYS = _set_keys()


@pytest.mark.parametrize(("where", "key"), SET_KEYS, ids=[f"{w} {k}" for w, k in SET_KEYS])
def test_set_override_keys_exist(where: str, key: str) -> None:
    assert _schema_has(JobConfig, key.split(".")), f"{where}: --set {key}: no such config key"


# --------------------------------------------------------------------------- Python blocks


def _resolve(dotted: str) -> Any:
    """The object a dotted ``raytrain_hetero...`` path names (module, then attributes)."""
    parts = dotted.split(".")
    obj: Any = None
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)  # AttributeError: a renamed or removed name
        return obj
    raise ModuleNotFoundError(dotted)


def _accepted(obj: Any) -> tuple[set[str], bool]:
    """Keyword names ``obj`` accepts and whether it takes any (``**kwargs``; a ``**unknown``
    that exists only to reject misspelt names does not count)."""
    signature = inspect.signature(obj)
    names = {p.name for p in signature.parameters.values() if p.kind != p.VAR_KEYWORD}
    open_kwargs = any(
        p.kind == p.VAR_KEYWORD and p.name != "unknown" for p in signature.parameters.values()
    )
    if isinstance(obj, type) and issubclass(obj, HeteroModel):
        names, open_kwargs = set(obj.model_fields), False
    return names, open_kwargs


def check_python(code: str, where: str) -> int:
    """Compile ``code``; resolve every import it makes and every ``raytrain_hetero`` attribute
    and keyword it uses. Returns how many names were checked.

    A snippet may use ``rh`` / ``raytrain_hetero`` and the package's public class names without
    importing them (``import raytrain_hetero as rh`` is assumed, as in the docs' prose); names
    bound by ``x = rh.something`` are followed too.
    """
    import raytrain_hetero

    tree = ast.parse(code, filename=where)
    compile(tree, where, "exec")
    assigned = {
        t.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name)
    } | {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.ClassDef)}
    # local name -> dotted raytrain_hetero path
    bound: dict[str, str] = {"rh": "raytrain_hetero", "raytrain_hetero": "raytrain_hetero"}
    bound.update({n: f"raytrain_hetero.{n}" for n in raytrain_hetero.__all__ if n[0].isupper()})
    for name in assigned:
        bound.pop(name, None)
    checked = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)
                checked += 1
                if alias.name.split(".")[0] == "raytrain_hetero":
                    bound[alias.asname or "raytrain_hetero"] = (
                        alias.name if alias.asname else "raytrain_hetero"
                    )
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                checked += 1
                if node.module.startswith("raytrain_hetero"):
                    _resolve(f"{node.module}.{alias.name}")
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                else:
                    getattr(importlib.import_module(node.module), alias.name)

    def dotted(expr: ast.expr) -> str | None:
        if isinstance(expr, ast.Name):
            return bound.get(expr.id)
        if isinstance(expr, ast.Attribute):
            base = dotted(expr.value)
            return f"{base}.{expr.attr}" if base else None
        return None

    for node in ast.walk(tree):  # aliases: rhl = rh.lightning
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and (path := dotted(node.value))
        ):
            bound[node.targets[0].id] = path
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (path := dotted(node)):
            _resolve(path)
            checked += 1
        if isinstance(node, ast.Call) and (path := dotted(node.func)):
            obj = _resolve(path)
            checked += 1
            if callable(obj):
                names, open_kwargs = _accepted(obj)
                for kw in node.keywords:
                    if kw.arg is not None and not open_kwargs:
                        assert kw.arg in names, f"{where}: {path}() takes no keyword {kw.arg!r}"
                        checked += 1
    return checked


PY_BLOCKS = blocks("python")


@pytest.mark.parametrize(("where", "code"), PY_BLOCKS, ids=_ids(PY_BLOCKS))
def test_python_example_matches_the_api(where: str, code: str) -> None:
    assert check_python(code, where) > 0, f"{where}: uses nothing the test can check"


@pytest.mark.parametrize(("where", "path"), _included(".py"), ids=_ids(_included(".py")))
def test_included_python_files_match_the_api(where: str, path: Path) -> None:
    assert path.is_relative_to(REPO / "examples"), f"{where}: include examples from examples/"
    assert check_python(path.read_text(), str(path)) > 0


_INTEG = "tests/integration/test_docs_examples.py"
_UNIT = "tests/unit/test_docs_examples_run.py"

#: Where each Python block of the pages RUNS, by (page, a text only that block of the page
#: holds): the test that executes it. Pages that include a file from examples/ instead
#: (``literalinclude``) are covered by the test that runs that file (test_docs_examples_run).
RUN_BLOCKS: dict[tuple[str, str], str] = {
    ("README.md", "def train_loop"): f"{_INTEG}::test_readme_example_trains",
    ("docs/how-to/python-api.md", "def train_loop"): (
        f"{_UNIT}::test_python_api_page_builds_its_trainer_and_trains_the_readme_loop"
    ),
    ("docs/reliability/guards.md", "prepare_model"): (
        f"{_INTEG}::test_loop_fragments_run_inside_a_training_loop"
    ),
    ("docs/how-to/heterogeneous-workers.md", "micro_batches"): (
        f"{_INTEG}::test_loop_fragments_run_inside_a_training_loop"
    ),
    ("docs/how-to/model-parallelism.md", "prepare_model_parallel"): (
        f"{_INTEG}::test_model_parallel_page_example_trains"
    ),
    ("docs/how-to/model-parallelism.md", "split_conv_layers("): (
        f"{_UNIT}::test_model_parallel_fragments_run_on_a_gloo_group"
    ),
    ("docs/how-to/model-parallelism.md", "BranchPipeline("): (
        f"{_UNIT}::test_model_parallel_fragments_run_on_a_gloo_group"
    ),
    (
        "docs/reliability/faults.md",
        "FaultSpec(",
    ): f"{_UNIT}::test_fault_injection_page_builds_its_trainer",
    ("docs/how-to/torchgeo.md", "batch_size=64)  # batch_size: validation"): (
        f"{_INTEG}::test_torchgeo_page_example_trains"
    ),
}

#: Blocks that are only compiled and name-checked (test_python_example_matches_the_api), with
#: why they cannot sensibly run in the suite. Keep this short: a new block must run.
CHECK_ONLY: dict[tuple[str, str], str] = {
    ("docs/how-to/ray-cluster.md", "JobSubmissionClient"): (
        "submits a job to a running cluster's Jobs API with its auth token (the dashboard's "
        "job server); the job it submits is examples/configs/eurosat_local_cluster.yaml, "
        "loaded by test_included_job_files_load"
    ),
    ("docs/how-to/torchgeo.md", "in_channels=13, num_classes=10)\n    trainer"): (
        "the overview's abridged copy of the Python section's program, which runs "
        "(test_torchgeo_page_example_trains)"
    ),
    ("docs/how-to/torchgeo.md", "L7IrishDataModule(paths="): (
        "a second Lightning worker group would cost ~30 CPU-s more; its calls are the Python "
        "section's (which runs) with torchgeo's L7IrishDataModule and SemanticSegmentationTask, "
        "which tests/integration/test_lightning.py trains through the same raytrain_hetero."
        "lightning calls"
    ),
    ("docs/reliability/preemption.md", "raytrain_hetero.checkpoint_due()"): (
        "a fragment of the user's own loop (its step is '...'); the same two calls "
        "(checkpoint_due, report with a checkpoint) run in tests/integration/test_preemption.py's "
        "loop (tests/integration/train_loops.py), through a real drain with a deadline"
    ),
}

#: Files under examples/ that pages include, and the test that runs each ("": check-only).
RUN_INCLUDED: dict[str, str] = {
    "examples/train_ray_data.py": f"{_INTEG}::test_ray_data_example_trains",
    "examples/measure_file_check.py": f"{_UNIT}::test_measure_file_check_example_runs",
    "examples/predict_distributed.py": "",
}

#: Included example files only compiled and name-checked, with why.
CHECK_ONLY_INCLUDED = {
    "examples/predict_distributed.py": (
        "trains a job, then runs three Ray Data predict passes (~3 min on 2 cores); its calls "
        "(run_job, predictor_spec, measure_worker_speeds, run_predict) run in "
        "tests/integration/test_inference.py"
    ),
}


def _block_key(where: str, code: str) -> list[tuple[str, str]]:
    page = where.rsplit(":", 1)[0]
    return [key for key in {**RUN_BLOCKS, **CHECK_ONLY} if key[0] == page and key[1] in code]


@pytest.mark.parametrize(("where", "code"), PY_BLOCKS, ids=_ids(PY_BLOCKS))
def test_every_python_block_runs_or_says_why_not(where: str, code: str) -> None:
    """A new Python block in the docs fails here until a test runs it (RUN_BLOCKS) or it is
    listed, with the reason, as check-only (CHECK_ONLY)."""
    keys = _block_key(where, code)
    assert len(keys) == 1, (
        f"{where}: {len(keys)} entries of RUN_BLOCKS/CHECK_ONLY match this block ({keys}); run "
        "it in tests/integration/test_docs_examples.py (trains) or tests/unit/"
        "test_docs_examples_run.py, or include it from a file under examples/ that a test runs"
    )


def test_run_blocks_name_existing_blocks_and_tests() -> None:
    for key, test in {**RUN_BLOCKS, **dict.fromkeys(CHECK_ONLY, "")}.items():
        assert sum(bool(_block_key(w, c) == [key]) for w, c in PY_BLOCKS) == 1, key
        if test:
            path, name = test.split("::")
            tree = ast.parse((REPO / path).read_text())
            assert any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body), test


@pytest.mark.parametrize(("where", "path"), _included(".py"), ids=_ids(_included(".py")))
def test_every_included_example_file_runs_or_says_why_not(where: str, path: Path) -> None:
    name = str(path.relative_to(REPO))
    assert name in RUN_INCLUDED, f"{where}: add a test that runs {name} to RUN_INCLUDED"
    test = RUN_INCLUDED[name]
    if not test:
        assert name in CHECK_ONLY_INCLUDED
        return
    file, func = test.split("::")
    text = (REPO / file).read_text()
    assert path.name in text, f"{test} does not run {name}"
    tree = ast.parse(text)
    assert any(isinstance(n, ast.FunctionDef) and n.name == func for n in tree.body), test


def test_python_checker_fails_on_a_renamed_name_or_keyword() -> None:
    good = "import raytrain_hetero as rh\nrh.BatchConfig(global_batch_size=8)\n"
    assert check_python(good, "good") >= 2
    with pytest.raises(AttributeError):
        check_python("import raytrain_hetero as rh\nrh.prepare_modle(m)\n", "renamed")
    with pytest.raises(AssertionError, match="global_batch"):
        check_python("from raytrain_hetero import BatchConfig\nBatchConfig(global_batch=8)\n", "kw")
    with pytest.raises(AssertionError, match="batch_size"):
        check_python(
            "from raytrain_hetero import HeteroTrainer\nHeteroTrainer(f, batch_size=8)\n", "kw"
        )


# --------------------------------------------------------------------------------- README


def test_readme_is_short_and_starts_with_the_two_commands() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    commands = [body.strip() for where, body in blocks("bash") if where.startswith("README")]
    assert commands[:2] == [
        "pip install -e . && raytrain-hetero train --config examples/configs/eurosat_local.yaml",
        'pip install -e ".[test]" && python -m pytest -q tests',
    ]


#: A Markdown link ``[text](target)`` (images aside).
MD_LINK = re.compile(r"(?<!!)\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s]+)\)")


def _page_links() -> list[tuple[str, str, str]]:
    """(``page:line``, text, target) of each link to a page or a section of the site."""
    out = []
    for page in PAGES[:-1]:  # the site's pages (the README is read on GitHub)
        text = page.read_text()
        for match in MD_LINK.finditer(text):
            target = match.group("target")
            if not re.match(r"^[^:#]*\.(md|rst)(#|$)|^#", target):
                continue  # a URL, a file download, an image
            where = f"{page.relative_to(REPO)}:{text.count(chr(10), 0, match.start()) + 1}"
            out.append((where, match.group("text"), target))
    return out


PAGE_LINKS = _page_links()


def _looks_like_a_path(text: str) -> bool:
    return bool(re.fullmatch(r"[\w.-]+(/[\w.-]*)*", text)) and (
        "/" in text or text.endswith((".md", ".rst"))
    )


def test_link_text_names_the_page_not_its_path() -> None:
    """``[docs/how-to/ray-data.md](ray-data.md)`` shows a repository path where the reader
    wants the page's name: write ``[](ray-data.md)`` (MyST puts in the page's or section's
    title) or words. A link to its own page goes to one of its sections (``[](#predict)``)."""
    assert len(PAGE_LINKS) >= 30
    paths = [f"{w}: [{t}]({g})" for w, t, g in PAGE_LINKS if _looks_like_a_path(t)]
    own = [
        f"{w}: [{t}]({g})"
        for w, t, g in PAGE_LINKS
        if g.split("#")[0]
        and (REPO / w.split(":")[0]).parent.joinpath(g.split("#")[0]).resolve()
        == (REPO / w.split(":")[0]).resolve()
    ]
    assert not paths, "links whose text is a path:\n" + "\n".join(paths)
    assert not own, "links to their own page (link a section: [](#anchor)):\n" + "\n".join(own)
    assert _looks_like_a_path("docs/reliability/") and _looks_like_a_path("admission.md")
    assert not _looks_like_a_path("torchgeo / Lightning") and not _looks_like_a_path("")


def test_readme_links_resolve() -> None:
    text = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for link in links:
        if re.match(r"^[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = REPO / path
        assert target.exists(), f"README links to missing {path}"
        if anchor and target.suffix == ".md":
            slugs = {
                re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.*)$", target.read_text(), re.M)
            }
            assert anchor in slugs, f"README links to missing heading {link}"


# ------------------------------------------------------------------ config keys in prose

#: Keys the docs show misspelt on purpose (the loader's "did you mean" message).
MISSPELT_ON_PURPOSE = {"train.learning_rate"}


def _prose_keys() -> list[tuple[str, str]]:
    """``section.field`` code spans of the pages (``probe.roles: auto``, ``workers[].count``),
    skipping Ray's own Python names (``ray.train.report``) and file names (``model.pt``)."""
    from raytrain_hetero.app.config import RayConfig

    out = []
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(r"`([a-z_]+(?:\.[\w\[\]]+)+)(?::[^`]*)?`", text):
            key = match.group(1)
            parts = [p for p in re.split(r"\.|\[\]", key) if p]
            if parts[0] not in JobConfig.model_fields or key in MISSPELT_ON_PURPOSE:
                continue
            if parts[0] == "ray" and parts[1] not in RayConfig.model_fields:
                continue
            if re.search(r"\.(pt|pth|py|yaml|json|csv|png|txt|md)$", key):
                continue
            line = text.count("\n", 0, match.start()) + 1
            out.append((f"{page.relative_to(REPO)}:{line}", key))
    return out


PROSE_KEYS = _prose_keys()


def test_docs_name_config_keys_in_prose() -> None:
    assert len(PROSE_KEYS) >= 50


@pytest.mark.parametrize(("where", "key"), PROSE_KEYS, ids=[f"{w} {k}" for w, k in PROSE_KEYS])
def test_config_keys_named_in_prose_exist(where: str, key: str) -> None:
    """A renamed or removed config field fails here wherever the docs mention it."""
    parts = [p for p in re.split(r"\.|\[\]", key) if p]
    assert _schema_has(JobConfig, _with_item_index(parts)), f"{where}: `{key}` is no config key"


def _with_item_index(parts: list[str]) -> list[str]:
    """``workers.count`` / ``workers[].count`` name a list item's field: insert index 0."""
    out: list[str] = []
    cls: Any = JobConfig
    for i, part in enumerate(parts):
        if part.isdigit():
            continue  # the index written out (workers.0.name): already added below
        hints = typing.get_type_hints(cls, include_extras=True) if isinstance(cls, type) else {}
        out.append(part)
        tp = hints.get(part)
        while typing.get_origin(tp) is typing.Annotated:
            tp = typing.get_args(tp)[0]
        if typing.get_origin(tp) in (list, tuple):
            out.append(parts[i + 1] if i + 1 < len(parts) and parts[i + 1].isdigit() else "0")
            tp = typing.get_args(tp)[0]
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        cls = tp if isinstance(tp, type) else (args[0] if args else None)
    return out


def test_schema_walk_refuses_a_renamed_key() -> None:
    assert _schema_has(JobConfig, _with_item_index(["scheduler", "policy", "window_steps"]))
    assert _schema_has(JobConfig, _with_item_index(["workers", "count"]))
    assert _schema_has(JobConfig, _with_item_index(["workers", "2", "emulated_slowdown"]))
    assert _schema_has(JobConfig, _with_item_index(["tune", "search_space", "lr", "loguniform"]))
    assert not _schema_has(JobConfig, _with_item_index(["train", "learning_rate"]))
    assert not _schema_has(JobConfig, _with_item_index(["workers", "speed"]))


# ------------------------------------------------------------- Python names in prose

#: ``raytrain_hetero.*`` spans that are not Python attributes, with why.
NOT_ATTRIBUTES = {
    "raytrain_hetero.search": "an MLflow tag name",
    "raytrain_hetero.run": "an MLflow tag name",
    "raytrain_hetero.SceneSegmentationDataModule": "a data.datamodule value the loader resolves",
}


def _prose_names() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(r"`(?:raytrain_hetero|rh)((?:\.\w+)+)(?![\w*])", text):
            path = "raytrain_hetero" + match.group(1)
            if path not in NOT_ATTRIBUTES:
                line = text.count("\n", 0, match.start()) + 1
                out.append((f"{page.relative_to(REPO)}:{line}", path))
    return out


PROSE_NAMES = _prose_names()


@pytest.mark.parametrize(("where", "path"), PROSE_NAMES, ids=[f"{w} {p}" for w, p in PROSE_NAMES])
def test_python_names_in_prose_exist(where: str, path: str) -> None:
    """`rh.update_plan`, `raytrain_hetero.driver.roles.node_roles`: renamed -> fails here."""
    _resolve(path)


def test_docs_paths_named_anywhere_exist() -> None:
    """``docs/how-to/ray-data.md`` in a docstring, an example or a results README: a page
    moved or renamed without updating its mentions fails here."""
    missing = []
    for path in REPO.rglob("*"):
        if path.suffix not in {".py", ".md", ".yaml", ".toml", ".txt", ".rst"} or any(
            # A virtual environment inside the checkout (.venv is common) holds other projects'
            # docs paths.
            part in {".git", "_build", "node_modules", ".venv", "venv", "site-packages"}
            for part in path.parts
        ):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in re.finditer(r"(?<![\w./-])docs/[\w./-]+\.(?:md|rst)", text):
            if not (REPO / match.group(0)).exists():
                missing.append(f"{path.relative_to(REPO)}: {match.group(0)}")
    assert not missing, "\n".join(missing)


def test_code_references_in_docstrings_must_exist() -> None:
    """With ``nitpicky`` on, a ``:func:`raytrain_hetero....``` reference to a name that is no
    longer in the code is left unresolved, which warns and fails the -W build."""
    assert rh_docs._importable("raytrain_hetero.worker.api.prepare_model")
    assert rh_docs._importable("raytrain_hetero.config.BatchConfig.min_slice")  # a field
    assert rh_docs._importable("raytrain_hetero.core.policy.PolicyConfig.window_steps")
    assert not rh_docs._importable("raytrain_hetero.worker.api.prepare_modle")
    assert not rh_docs._importable("raytrain_hetero.config.BatchConfig.min_slise")
