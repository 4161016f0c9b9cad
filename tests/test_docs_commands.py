"""Every command line the README and docs/*.md show (``treeopt ...``, ``python -m sequoia_opt ...``,
``python benchmarks/x.py ...``, ``bash benchmarks/x.sh``) names a subcommand that exists and only options that
subcommand (or script) takes, with a value its ``--engine`` / ``--shape`` / ``--format`` / ``--policy`` /
``--draft`` / ``--method`` / ``--acceptance-model`` accepts. Users copy these lines; an option renamed or dropped
in the code would leave the docs showing a command that exits 2. The model cards' training commands
(``python -m sequoia_opt.distill[.eagle3]``) are checked too.

Nothing is run: the ``treeopt`` commands are checked against the typer app's click commands, the benchmark
scripts against the ``add_argument`` calls in their source (most build their parser inside ``main``, after which
they import torch and load models)."""

from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest
import typer

from sequoia_opt.cli import app
from sequoia_opt.drafting import DRAFTERS, POLICIES
from sequoia_opt.engines import engine_name
from sequoia_opt.exports import normalise_format
from sequoia_opt.jobs.tune import TUNE_SHAPES, _engine as tune_engine
from sequoia_opt.plan_exports import VLLM_METHODS
from sequoia_opt.solver.depth import ACCEPTANCE_MODELS
from sequoia_opt.solver.schedule import CHAIN_ACCEPTANCE_MODELS

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "sequoia_opt" / "data").glob("*/*.md"))]  # the model cards: how each was trained
#: the ``python -m`` modules of the package besides the CLI, and the file whose ``add_argument`` calls they parse
MODULES = {"sequoia_opt.distill": "sequoia_opt/distill/cli.py",
           "sequoia_opt.distill.eagle3": "sequoia_opt/distill/eagle3.py"}
SUBCOMMANDS = ("solve", "run", "tune", "profile", "plot", "demo", "export-draft")
CODE_LANGS = ("", "bash", "sh", "shell", "console")


@dataclass(frozen=True)
class DocCommand:
    """One command line of a doc: ``where`` is ``file:line``, ``argv`` its words from the program on
    (``treeopt`` for ``python -m sequoia_opt``; ``python benchmarks/x.py`` as ``benchmarks/x.py``)."""

    where: str
    argv: tuple[str, ...]
    plugins: bool = False  # run with TREEOPT_PLUGINS=...: its --draft / --policy may name the plugins' kinds


def _inline_spans(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """(line, text) of every `code span` of a paragraph; a span may run over a line break, as Markdown allows."""
    text, starts = "", []
    for no, line in lines:
        starts.append((len(text), no))
        text += line + " "
    out = []
    for m in re.finditer(r"(`+)(.+?)\1", text):
        line = max(no for off, no in starts if off <= m.start())
        out.append((line, m.group(2).strip()))
    return out


def _segments(text: str) -> list[str]:
    """A shell line split into its commands: ``&&``, ``||``, ``;`` and ``|`` chains (a comment dropped)."""
    text = re.sub(r"(^|\s)#.*$", "", text)
    return [s.strip() for s in re.split(r"&&|\|\||;|\s\|\s", text) if s.strip()]


def _command(words: list[str], bare: bool = False) -> tuple[str, ...] | None:
    """The command a segment runs, past ``VAR=value`` (``VAR=$(mktemp -d)`` too), ``flock LOCK`` and
    ``timeout N`` prefixes; None when it is not one of treeopt's, the package's ``python -m`` modules or a
    benchmark script. ``bare``: also a treeopt command without its ``treeopt`` (``solve --format vllm``),
    as the docs' prose names them, when an option follows."""
    i = 0
    while i < len(words):
        w = words[i]
        if re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", w):
            depth = w.count("$(") - w.count(")")
            i += 1
            while depth > 0 and i < len(words):  # the words of a $(...) value
                depth += words[i].count("$(") - words[i].count(")")
                i += 1
        elif w == "flock":
            i += 2
        elif w == "timeout":
            i += 2
        else:
            break
    rest = words[i:]
    if rest[:1] == ["treeopt"]:
        return ("treeopt", *rest[1:])
    if rest[:2] in (["python", "-m"], ["python3", "-m"]) and len(rest) > 2 and rest[2].startswith("sequoia_opt"):
        return ("treeopt", *rest[3:]) if rest[2] == "sequoia_opt" else (f"-m {rest[2]}", *rest[3:])
    if bare and rest[:1] and rest[0] in SUBCOMMANDS and any(w.startswith("-") for w in rest[1:3]):
        return ("treeopt", *rest)
    if len(rest) >= 2 and rest[0] in ("python", "python3", "bash", "sh") and rest[1].startswith("benchmarks/"):
        return tuple(rest[1:])
    return None


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # an unbalanced quote in prose
        return text.split()


def doc_commands(paths: list[Path] = DOCS, root: Path = ROOT) -> list[DocCommand]:
    """Every treeopt / benchmark command line of ``paths``: in ``bash`` (or unlabelled) code blocks, in lines
    indented as code, and in `inline code` (continuations ``\\`` joined)."""
    found: list[DocCommand] = []
    for path in paths:
        name = path.relative_to(root).as_posix()
        lines = path.read_text(encoding="utf-8").splitlines()
        fence: str | None = None
        para: list[tuple[int, str]] = []
        pending: tuple[int, str] | None = None  # a code line continued by `\`: (its first line, its text)

        def flush_para() -> None:
            for no, span in _inline_spans(para):
                for seg in _segments(span):
                    cmd = _command(_split(seg), bare=True)
                    if cmd:
                        found.append(DocCommand(f"{name}:{no}", cmd, "TREEOPT_PLUGINS=" in seg))
            para.clear()

        for no, line in enumerate(lines, 1):
            stripped = line.strip()
            if stripped.startswith("```"):
                if fence is None:
                    flush_para()
                    fence = stripped[3:].strip().lower()
                else:
                    fence = None
                continue
            indented_code = fence is None and line.startswith("    ") and "`" not in line and re.match(
                r"(treeopt|python3? |flock |bash |[A-Z_]+=)", stripped)
            if (fence is not None and fence in CODE_LANGS) or indented_code:
                if pending is not None:
                    pending = (pending[0], pending[1] + " " + stripped)
                else:
                    pending = (no, stripped)
                if pending[1].endswith("\\"):
                    pending = (pending[0], pending[1][:-1].rstrip())
                    continue
                for seg in _segments(pending[1]):
                    cmd = _command(_split(seg))
                    if cmd:
                        found.append(DocCommand(f"{name}:{pending[0]}", cmd, "TREEOPT_PLUGINS=" in seg))
                pending = None
                continue
            if fence is not None:
                continue
            if stripped:
                para.append((no, stripped))
            else:
                flush_para()
        flush_para()
    return found


# ------------------------------------------------------------------------------------------- what the code takes


@lru_cache(maxsize=None)
def cli_root():
    """The click command of the typer app (a group: ``.commands`` by name; a command: ``.params``)."""
    return typer.main.get_command(app)


def _opts(command) -> set[str]:
    names = {"--help"}
    for p in command.params:
        names.update(p.opts)
        names.update(p.secondary_opts)
    return names


@lru_cache(maxsize=None)
def script_options(script: str) -> tuple[frozenset[str], dict[str, tuple[str, ...]]]:
    """The option strings of every ``add_argument`` call in a benchmark script, and the literal ``choices`` of
    those that have them."""
    tree = ast.parse((ROOT / script).read_text(encoding="utf-8"))
    opts, choices = {"--help", "-h"}, {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        names = [n for n in names if n.startswith("-")]
        opts.update(names)
        for kw in node.keywords:
            if kw.arg == "action" and isinstance(kw.value, ast.Attribute) and kw.value.attr == "BooleanOptionalAction":
                opts.update("--no-" + n[2:] for n in names if n.startswith("--"))
            if kw.arg == "choices" and isinstance(kw.value, (ast.Tuple, ast.List)):
                vals = tuple(e.value for e in kw.value.elts if isinstance(e, ast.Constant))
                for n in names:
                    choices[n] = vals
    return frozenset(opts), choices


def _is_placeholder(value: str) -> bool:
    return value in ("...", "…") or "<" in value or value.isupper() or value.startswith("$")


def _choice_problem(path: tuple[str, ...], flag: str, value: str, plugins: bool = False) -> str | None:
    """Why ``value`` is not accepted by ``flag`` of the treeopt command ``path`` (None: it is, or is a
    placeholder, or the option has no fixed set of values). ``--policy`` and ``--draft`` name a registered kind
    (``--draft`` may be a checkpoint path instead), but under ``plugins``."""
    if _is_placeholder(value):
        return None
    for v in value.split("|"):
        head = v.partition(":")[0]
        if flag == "--policy" and path == ("run",) and not plugins and head not in POLICIES:
            return f"--policy {v}: no policy {head!r}; the registered ones are {', '.join(POLICIES)}"
        if flag == "--draft" and not plugins and head not in DRAFTERS and not re.search(r"[/.]", v):
            return f"--draft {v}: no drafter {head!r} and not a checkpoint path"
        try:
            if flag in ("--engine", "-e") and path == ("tune",):
                tune_engine(v)
            elif flag == "--engine" and path == ("run",):
                if engine_name(v) not in ("treeopt", "llama.cpp"):
                    return f"run --engine {v}: run takes treeopt or llama.cpp"
            elif flag == "--engine":
                engine_name(v)
            elif flag == "--shape" and path == ("tune",):
                if v not in TUNE_SHAPES:
                    return f"--shape {v}: not one of {TUNE_SHAPES}"
            elif flag == "--acceptance-model":
                known = ACCEPTANCE_MODELS if path == ("solve",) else CHAIN_ACCEPTANCE_MODELS
                if v not in known:
                    return f"--acceptance-model {v}: not one of {known}"
            elif flag == "--method" and path == ("tune",):
                if v not in VLLM_METHODS:
                    return f"--method {v}: not one of {VLLM_METHODS}"
            elif flag in ("--format", "-f") and path == ("solve",):
                if v.lower() not in ("llama.cpp", "llamacpp", "llama-cpp"):
                    normalise_format(v)
        except Exception as err:  # noqa: BLE001 (the library's one-line refusal is the message)
            return f"{flag} {v}: {err}"
    return None


def _words(argv: tuple[str, ...]) -> list[str]:
    """The words of a command with the ``[ ... ]`` of optional parts shown in docs dropped."""
    out = []
    for w in argv:
        w = w.strip("[]")
        if w:
            out.append(w)
    return out


def problems(cmd: DocCommand) -> list[str]:
    """What is wrong with one doc command: an unknown subcommand, an option its command does not take, a
    value outside the option's choices; a missing benchmark script."""
    words = _words(cmd.argv)
    out: list[str] = []
    if words[0] != "treeopt":
        script = words[0]
        if script.startswith("-m "):
            if script[3:] not in MODULES:
                return [f"{cmd.where}: python {script}: no such module here (or add its parser's file to MODULES)"]
            script = MODULES[script[3:]]
        if not (ROOT / script).is_file():
            return [f"{cmd.where}: {script} does not exist"]
        if not script.endswith(".py"):  # a shell script: the options of the script it hands "$@" to
            passed = re.search(r"(benchmarks/\w+\.py)\"? \"\$@\"", (ROOT / script).read_text(encoding="utf-8"))
            if passed is None:
                flags = [w for w in words[1:] if w.startswith("-")]
                return [f"{cmd.where}: {script} takes no options ({' '.join(flags)})"] if flags else []
            script = passed.group(1)
        opts, choices = script_options(script)
        for i, w in enumerate(words[1:], 1):
            if not w.startswith("-") or w == "-" or re.fullmatch(r"-[\d.]+", w):
                continue
            flag, _, inline = w.partition("=")
            if flag not in opts:
                out.append(f"{cmd.where}: {script} has no option {flag}")
            elif flag in choices:
                value = inline or (words[i + 1] if i + 1 < len(words) else "")
                for v in value.split(","):
                    if v and not _is_placeholder(v) and v not in choices[flag]:
                        out.append(f"{cmd.where}: {script} {flag} {v}: not one of {choices[flag]}")
        return out
    command, path, i = cli_root(), (), 1
    while hasattr(command, "commands") and i < len(words) and not words[i].startswith("-"):
        if words[i] in ("...", "…"):
            return []
        if words[i] not in command.commands:
            return [f"{cmd.where}: treeopt {' '.join(path + (words[i],))}: no such command"]
        command, path, i = command.commands[words[i]], path + (words[i],), i + 1
    if hasattr(command, "commands"):
        return [] if len(words) == i else [f"{cmd.where}: treeopt {' '.join(path)} takes a subcommand, not {words[i]}"]
    opts = _opts(command)
    for j in range(i, len(words)):
        w = words[j]
        if not w.startswith("-") or w == "-" or re.fullmatch(r"-[\d.]+", w):
            continue
        flag, _, inline = w.partition("=")
        if flag not in opts:
            out.append(f"{cmd.where}: treeopt {' '.join(path)} has no option {flag}")
            continue
        value = inline or (words[j + 1] if j + 1 < len(words) else "")
        why = _choice_problem(path, flag, value, cmd.plugins) if value else None
        if why:
            out.append(f"{cmd.where}: treeopt {' '.join(path)} {why}")
    return out


# ------------------------------------------------------------------------------------------------------- tests

COMMANDS = doc_commands()


def test_the_docs_show_many_commands_of_every_kind():
    treeopt = [c for c in COMMANDS if c.argv[0] == "treeopt"]
    scripts = {c.argv[0] for c in COMMANDS if c.argv[0] != "treeopt"}
    subcommands = {c.argv[1] for c in treeopt if len(c.argv) > 1}
    assert len(COMMANDS) > 50 and len(treeopt) > 50, len(COMMANDS)
    assert {"solve", "run", "tune", "profile", "demo", "export-draft"} <= subcommands
    assert {"benchmarks/batch.py", "benchmarks/eagle3.py", "benchmarks/gpu_check.sh"} <= scripts
    # the extraction itself: a continuation, a flock prefix, a && chain and a span over a line break
    where = {(c.where, c.argv[:3]) for c in COMMANDS}
    assert ("docs/drafters.md:23", ("treeopt", "solve", "-a")) in where  # continued by `\` onto line 24
    assert ("README.md:33", ("treeopt", "run", "--threads")) in where  # the second command of an && chain
    assert any(c.argv[0] == "benchmarks/continuous_batching.py" and c.where.startswith("README.md") for c in COMMANDS)
    assert ("docs/measurements.md:11", ("treeopt", "demo")) in {(c.where, c.argv[:2]) for c in COMMANDS}


def test_the_checker_catches_what_it_is_for(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("Run `treeopt solve -a a.yaml --no-such-flag`, `treeopt tune --engine vlm` and\n"
                   "`flock /tmp/l python benchmarks/batch.py --bogus 1`.\n\n"
                   "```bash\nPYTHONPATH=. treeopt profile latncy && treeopt tune --engine sglang \\\n"
                   "  --shape envelope --max-draft 4\n"
                   "treeopt solve -a a.yaml --format sglnag  # comment --not-a-flag\n```\n"
                   "`run --policy shedule:p.yaml --draft lokup` and `TREEOPT_PLUGINS=p.py treeopt run --policy mine`\n"
                   "`bash benchmarks/gpu_check.sh --dryrun` `bash benchmarks/answer_length.sh -x`\n"
                   "`tune --method eagle4 --acceptance-model replay` `solve --acceptance-model replay`\n",
                   encoding="utf-8")
    cmds = doc_commands([doc], root=tmp_path)
    assert [c.argv[:3] for c in cmds] == [
        ("treeopt", "solve", "-a"), ("treeopt", "tune", "--engine"), ("benchmarks/batch.py", "--bogus", "1"),
        ("treeopt", "profile", "latncy"), ("treeopt", "tune", "--engine"), ("treeopt", "solve", "-a"),
        ("treeopt", "run", "--policy"), ("treeopt", "run", "--policy"),
        ("benchmarks/gpu_check.sh", "--dryrun"), ("benchmarks/answer_length.sh", "-x"),
        ("treeopt", "tune", "--method"), ("treeopt", "solve", "--acceptance-model")]
    assert cmds[4].argv[-2:] == ("--max-draft", "4")  # the continuation joined
    found = [problems(c) for c in cmds]
    assert "has no option --no-such-flag" in found[0][0]
    assert "--engine vlm" in found[1][0]
    assert found[2] == ["x.md:2: benchmarks/batch.py has no option --bogus"]
    assert found[3] == ["x.md:5: treeopt profile latncy: no such command"]
    assert found[4] == []
    assert len(found[5]) == 1 and "--format sglnag" in found[5][0]
    assert cmds[6].argv[:2] == ("treeopt", "run")  # a command named in prose without its `treeopt`
    assert len(found[6]) == 2 and "no policy 'shedule'" in found[6][0] and "no drafter 'lokup'" in found[6][1]
    assert found[7] == [] and cmds[7].plugins
    assert found[8] == ["x.md:10: benchmarks/gpu_stages.py has no option --dryrun"]  # gpu_check.sh runs it
    assert found[9] == ["x.md:10: benchmarks/answer_length.sh takes no options (-x)"]
    assert len(found[10]) == 1 and "--method eagle4" in found[10][0]  # replay: a chain model tune takes
    assert len(found[11]) == 1 and "--acceptance-model replay" in found[11][0]  # ... and solve does not


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: f"{c.where}:{' '.join(c.argv[:2])}")
def test_every_doc_command_exists_with_its_options(cmd):
    assert problems(cmd) == []

