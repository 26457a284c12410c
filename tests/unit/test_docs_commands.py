"""Every command the docs and the benchmark results show still runs as written.

Sources: each ``benchmarks/results/**/COMMAND`` file, and the commands in the docs pages and
the README (shell blocks, and inline code spans such as ``Command: `python -m benchmarks
hetero3 ...``` in the benchmark pages). Only the project's own programs are checked: the
``raytrain-hetero`` console script, ``python -m benchmarks[.module]``, ``python -m
raytrain_hetero[.module]`` and ``python path/to/script.py`` of a file in this repository.

Each is DRY-RUN, in this process, through the program's real entry point: the module (or the
console script's function from pyproject.toml) runs as ``__main__`` with the command's argv
until its argument parser has parsed them, then stops (``argparse.ArgumentParser.parse_args``
is wrapped to raise once it has parsed). A moved module, a renamed option or subcommand, an
unknown scenario or a bad value fails here; so do the checks the program makes right after
parsing, which are repeated on the parsed namespace: a job command's config file (``--config``
or positional) must load with its ``--set`` overrides (``raytrain-hetero bench hetero3``
took ``hetero3`` for a config file and exited 2), and a ``python -m benchmarks SCENARIO``
command's options must pass the suite's own validation (contenders, ``--scheduler``,
``--configs``). No Ray is started (``ray.init`` is made to fail) and nothing is trained.

A COMMAND file records how a result is reproduced today; where a folder's result came from
an older form of the command, that form is in the folder's README (a comment, not a command).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import runpy
import shlex
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

COMMAND_FILES = sorted(REPO.glob("benchmarks/results/**/COMMAND"))
PAGES = [*sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts), REPO / "README.md"]

#: Fenced blocks whose lines are shell commands (``` with no language: the benchmark pages'
#: reproduce blocks; outputs in such blocks do not start with one of our programs).
SHELL_LANGS = {"", "bash", "sh", "shell", "console"}
FENCE = re.compile(
    r"^(?P<indent>[ ]*)(?P<fence>```+|~~~+)(?P<lang>[^\n`]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ ]*$",
    re.M | re.S,
)
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
#: Words that run the next word as the command (``flock LOCK python ...``), with how many of
#: their own arguments to skip.
WRAPPERS = {"flock": 1, "timeout": 1, "time": 0, "nohup": 0, "exec": 0}
#: A placeholder in a prose command: ``FILE``, ``JOB.yaml``, ``<scenario>``, ``[--repeats N]``,
#: ``...``, ``train|tune``.
PLACEHOLDER = re.compile(r"[<>\[\]{}|]|\.\.\.|…|^[A-Z][A-Z0-9_]*(\.ya?ml)?$|=[A-Z][A-Z0-9_]*$")


@dataclass(frozen=True)
class Command:
    """One invocation of one of our programs, as a page or a COMMAND file shows it."""

    where: str  # file:line
    program: str  # "raytrain-hetero", "-m benchmarks.tune_asha", "benchmarks/soak.py"
    args: tuple[str, ...]
    full: bool  # False: a mention in prose (no arguments, or placeholders): the program must exist

    @property
    def text(self) -> str:
        head = f"python {self.program}" if self.program.startswith("-m ") else self.program
        return " ".join([head, shlex.join(self.args)]).strip()


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(1-based line, line) with backslash continuations joined and ``$ `` prompts dropped."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if not pending:
            start = number
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        whole = (pending + stripped).strip()
        pending = ""
        if whole.startswith("$ "):
            whole = whole[2:]
        if whole:
            out.append((start, whole))
    return out


def _words(line: str) -> list[list[str]]:
    """The simple commands of a shell line (split at ``&&``, ``;``, ``|``, redirections cut),
    comments dropped."""
    # ``<scenario>`` is a placeholder, not a redirection: keep it one word ({scenario}).
    line = re.sub(r"<([A-Za-z][\w.-]*)>", r"{\1}", line)
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError:  # an unbalanced quote: not a command line
        return []
    commands: list[list[str]] = [[]]
    redirected = False
    for token in tokens:
        if token in {"&&", "||", ";", "|", "&", "(", ")"}:
            commands.append([])
            redirected = False
        elif (token and set(token) <= set("<>&")) or re.fullmatch(r"\d?[<>]+&?\d*", token):
            redirected = True  # `> log 2>&1`: the rest of this command is redirections
        elif not redirected:
            commands[-1].append(token)
    return [c for c in commands if c]


def _program(words: list[str]) -> tuple[str, list[str]] | None:
    """(program, its arguments) when ``words`` run one of our programs, else None."""
    i = 0
    while i < len(words):
        word = words[i]
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", word):
            i += 1
        elif word == "env":
            i += 1
            while i < len(words) and words[i].startswith("-"):
                i += 2 if words[i] in {"-u", "--unset"} else 1
        elif word in WRAPPERS:
            i += 1 + WRAPPERS[word]
        else:
            break
    if i >= len(words):
        return None
    head, rest = words[i], words[i + 1 :]
    if head == "raytrain-hetero":
        return head, rest
    if not re.fullmatch(r"python(3(\.\d+)?)?", head):
        return None
    while rest and rest[0].startswith("-") and rest[0] != "-m":
        rest = rest[1:]  # python -u, -X ...
    if len(rest) >= 2 and rest[0] == "-m":
        module = rest[1]
        if module.split(".")[0] in {"benchmarks", "raytrain_hetero"}:
            return f"-m {module}", rest[2:]
        return None
    if rest and rest[0].endswith(".py") and not PLACEHOLDER.search(rest[0]):
        return rest[0], rest[1:]
    return None


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def command_file_commands(path: Path) -> list[Command]:
    """Every command line of a COMMAND file (comments and blank lines aside)."""
    where_file = _shown(path)
    out = []
    for line_no, line in _logical_lines(path.read_text()):
        for words in _words(line):
            found = _program(words)
            if found:
                out.append(Command(f"{where_file}:{line_no}", found[0], tuple(found[1]), True))
    return out


def page_commands(path: Path, *, inline: bool = True) -> list[Command]:
    """The commands of a page: lines of shell blocks, and (``inline``) inline code spans that
    run one of our programs (outside code blocks)."""
    text = path.read_text()
    where_file = _shown(path)
    out: list[Command] = []
    spans: list[tuple[int, int]] = []
    for match in FENCE.finditer(text):
        spans.append(match.span())
        if match.group("lang").strip().lower() not in SHELL_LANGS:
            continue
        first = text.count("\n", 0, match.start("body")) + 1
        for offset, line in _logical_lines(match.group("body")):
            for words in _words(line):
                found = _program(words)
                if found:
                    program, args = found
                    full = not any(PLACEHOLDER.search(a) for a in [program, *args])
                    where = f"{where_file}:{first + offset - 1}"
                    out.append(Command(where, program, tuple(args), full))
    for match in INLINE.finditer(text if inline else ""):
        if any(a <= match.start() < b for a, b in spans):
            continue
        for words in _words(match.group(1)):
            found = _program(words)
            if found:
                program, args = found
                mention = len(args) <= 1  # `raytrain-hetero train`, `python -m benchmarks device`
                full = not mention and not any(PLACEHOLDER.search(a) for a in [program, *args])
                where = f"{where_file}:{text.count(chr(10), 0, match.start()) + 1}"
                out.append(Command(where, program, tuple(args), full))
    return out


COMMANDS = [c for path in COMMAND_FILES for c in command_file_commands(path)]
DOC_COMMANDS = [c for path in PAGES for c in page_commands(path)]
# A results folder's notes: their shell blocks say how to rerun; their prose may quote the
# command a result was recorded with (an older form), as its history.
DOC_COMMANDS += [
    c
    for path in sorted(REPO.glob("benchmarks/results/**/*.md"))
    for c in page_commands(path, inline=False)
]


def _ids(commands: list[Command]) -> list[str]:
    return [f"{c.where} {c.text[:60]}" for c in commands]


# ---------------------------------------------------------------------------- the dry run


class _Parsed(Exception):
    """Raised by the wrapped ``parse_args`` once a program's arguments have parsed."""

    def __init__(self, namespace: argparse.Namespace) -> None:
        super().__init__("parsed")
        self.namespace = namespace


def _console_script(name: str) -> Any:
    """The function pyproject.toml's ``[project.scripts]`` names for ``name``."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, attr = scripts[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def _program_exists(program: str) -> None:
    program = re.sub(r"\.\{\w+\}$", "", program)  # -m benchmarks.<module>: the package
    if program == "raytrain-hetero":
        _console_script(program)
    elif program.startswith("-m "):
        module = program[3:]
        assert importlib.util.find_spec(module) is not None, f"no module {module}"
    else:
        assert (REPO / program).is_file(), f"no file {program}"


def dry_run(command: Command, monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """Run ``command``'s program until its arguments have parsed; the namespace.

    Raises:
        AssertionError: The program cannot be found, its parser refuses the arguments, or it
            returned without parsing any.
    """
    original = argparse.ArgumentParser.parse_args

    def parse_args(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Parsed(original(self, *args, **kwargs))

    def no_ray(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"{command.text}: started Ray before parsing its arguments")

    import ray

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
    monkeypatch.setattr(ray, "init", no_ray)
    monkeypatch.chdir(REPO)
    program = command.program
    try:
        if program == "raytrain-hetero":
            monkeypatch.setattr(sys, "argv", [program, *command.args])
            _console_script(program)()
        elif program.startswith("-m "):
            module = program[3:]
            monkeypatch.setattr(sys, "argv", [module, *command.args])
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            path = REPO / program
            assert path.is_file(), f"{command.where}: no file {program}"
            assert "parse_args(" in path.read_text(), f"{program} parses no arguments"
            monkeypatch.setattr(sys, "argv", [str(path), *command.args])
            runpy.run_path(str(path), run_name="__main__")
    except _Parsed as parsed:
        return parsed.namespace
    except ImportError as exc:  # a module that moved or was removed
        raise AssertionError(f"{command.where}: `{command.text}`: {exc}") from exc
    except SystemExit as exc:
        raise AssertionError(f"{command.where}: `{command.text}` exits {exc.code}") from exc
    finally:
        monkeypatch.undo()
    raise AssertionError(f"{command.where}: `{command.text}` returned without parsing arguments")


def check_parsed(command: Command, namespace: argparse.Namespace) -> None:
    """The checks each program makes right after parsing, on the parsed namespace."""
    if command.program == "raytrain-hetero" and hasattr(namespace, "overrides"):
        from raytrain_hetero.app.config import load_config, parse_overrides

        path = namespace.config_flag or namespace.config_path
        if path is None:
            return
        assert path.suffix in {".yaml", ".yml"}, f"{command.where}: {path} is no YAML job file"
        if (REPO / path).is_file():
            load_config(REPO / path, parse_overrides(namespace.overrides))
        else:  # the reader's own job.yaml; a file of this repository must exist
            assert path.parts[0] not in {"examples", "benchmarks", "deploy"}, (
                f"{command.where}: no {path} in this repository"
            )
    elif command.program == "-m benchmarks" and hasattr(namespace, "scenario"):
        from benchmarks.arguments import scenario_options
        from benchmarks.mp_suite import mp_options
        from benchmarks.scenarios import MP_SCENARIOS, SCENARIOS

        if namespace.scenario in MP_SCENARIOS:
            options = mp_options(namespace.scenario, namespace)
        else:
            scenario = SCENARIOS[namespace.scenario]
            options = scenario_options(scenario, namespace)
            if not scenario.emulated:
                # Nothing to scale: a recorded --slowdown-scale changed nothing (it is refused
                # on such a scenario today).
                options.pop("slowdown_scale")
        _check_recorded_options(command, namespace, options)


def _results_folder(command: Command, namespace: argparse.Namespace) -> Path | None:
    """The results folder a benchmark command stands for: a COMMAND file's own folder, or
    the ``--output`` under ``benchmarks/results/`` of a documented command."""
    path = REPO / command.where.rsplit(":", 1)[0]
    if path.name == "COMMAND":
        return path.parent
    output = getattr(namespace, "output", None)
    if output is not None and (REPO / output).resolve().is_relative_to(REPO / "benchmarks/results"):
        return REPO / output
    return None


def _check_recorded_options(
    command: Command, namespace: argparse.Namespace, options: dict[str, Any]
) -> None:
    """A command standing for a result must reproduce it: every option its ``bench.json``
    recorded (contenders, repeats, sizes, seeds, scheduler, ...) is what the command gives
    today, defaults included (a scenario's default contenders change over time)."""
    folder = _results_folder(command, namespace)
    record = folder / "bench.json" if folder is not None else None
    if record is None or not record.is_file():
        return
    recorded = json.loads(record.read_text()).get("options") or {}
    differ = {
        key: (value, options[key])
        for key, value in recorded.items()
        if key in options and options[key] != value
    }
    assert not differ, (
        f"{command.where}: `{command.text}` would not reproduce {record.relative_to(REPO)}: "
        + "; ".join(f"{k}: recorded {v!r}, the command gives {w!r}" for k, (v, w) in differ.items())
    )


def _check(command: Command, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    if not command.full:
        _program_exists(command.program)
        if len(command.args) == 1 and not PLACEHOLDER.search(command.args[0]):
            # Prose naming a subcommand (`python -m benchmarks device`): the subcommand must
            # exist; the options a real run needs may be left out.
            try:
                dry_run(command, monkeypatch)
            except AssertionError as exc:
                err = capsys.readouterr().err
                if "the following arguments are required" not in err:
                    raise AssertionError(f"{exc}\n{err[-2000:]}") from None
        return
    try:
        namespace = dry_run(command, monkeypatch)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{capsys.readouterr().err[-2000:]}") from None
    check_parsed(command, namespace)


# --------------------------------------------------------------------------------- tests


def test_every_results_folder_command_is_found() -> None:
    """Each COMMAND file holds at least one command of ours (none is only prose)."""
    assert len(COMMAND_FILES) >= 28
    found = {c.where.split(":")[0] for c in COMMANDS}
    empty = [
        str(p.relative_to(REPO)) for p in COMMAND_FILES if str(p.relative_to(REPO)) not in found
    ]
    assert not empty, f"COMMAND files with no command of ours: {empty}"


@pytest.mark.parametrize("command", COMMANDS, ids=_ids(COMMANDS))
def test_command_file_runs(command: Command, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    _check(command, monkeypatch, capsys)


def test_docs_show_commands() -> None:
    """The extraction finds the benchmark pages' reproduce commands (a parser that silently
    found nothing would pass every test below)."""
    full = [c for c in DOC_COMMANDS if c.full]
    assert len(full) >= 40
    assert any(c.where.startswith("docs/benchmarks/performance.md") for c in full)
    assert any(c.program == "raytrain-hetero" for c in full)


@pytest.mark.parametrize("command", DOC_COMMANDS, ids=_ids(DOC_COMMANDS))
def test_documented_command_runs(
    command: Command, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    _check(command, monkeypatch, capsys)


# --------------------------------------------------------------- the checker can fail


@pytest.mark.parametrize(
    ("line", "error"),
    [
        # the stale form of issue 48: `hetero3` taken for a job file
        ("raytrain-hetero bench hetero3 --output benchmarks/results/hetero3", "no YAML job file"),
        ("python -m raytrain_hetero.bench.admission --output x", "No module named"),
        ("python -m benchmarks hetero9", "invalid choice: 'hetero9'"),
        ("python -m benchmarks drift --no-such-option", "unrecognized arguments"),
        ("`python -m benchmarks hetero9`", "invalid choice: 'hetero9'"),  # named in prose
        ("python -m benchmarks hetero2 --contenders stock,hetero-fast", "unknown contenders"),
        ("python -m benchmarks conv-split --configs hetero7", "unknown --configs"),
        (
            "raytrain-hetero train --config examples/configs/eurosat_local.yaml --set train.lr=-1",
            "lr",
        ),
        ("raytrain-hetero train --config examples/configs/no_such_job.yaml", "no examples/"),
        # the scenario's default contenders changed since this result was recorded
        (
            "python -m benchmarks homogeneous3 --output benchmarks/results/homogeneous3",
            "contenders",
        ),
    ],
)
def test_a_stale_command_fails(
    line: str, error: str, monkeypatch: pytest.MonkeyPatch, capsys: Any, tmp_path: Path
) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"Run {line} here.\n" if line.startswith("`") else f"```bash\n{line}\n```\n")
    (command,) = page_commands(page)
    with pytest.raises(Exception) as raised:  # its message is checked below
        _check(command, monkeypatch, capsys)
    assert error in str(raised.value)


def test_command_lines_are_parsed_like_a_shell() -> None:
    text = (
        "# a note\n"
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.2 python -m benchmarks hetero2 \\\n"
        "  --repeats 3   # trailing comment\n"
        "env -u X python -m benchmarks.probe_vs_equal --rounds 2 > log 2>&1\n"
        "flock /tmp/l python -m benchmarks join && echo done\n"
        "python -m pytest -q tests\n"
    )
    found = [_program(w) for _, line in _logical_lines(text) for w in _words(line)]
    assert [f for f in found if f] == [
        ("-m benchmarks", ["hetero2", "--repeats", "3"]),
        ("-m benchmarks.probe_vs_equal", ["--rounds", "2"]),
        ("-m benchmarks", ["join"]),
    ]
