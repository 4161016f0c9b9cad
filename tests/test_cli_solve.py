"""`treeopt solve` through typer's CliRunner: exit codes, files written or not, --json."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from sequoia_opt import __version__
from sequoia_opt.cli import app
from sequoia_opt.tree import load_tree

EXAMPLES = Path(__file__).resolve().parents[1] / "profiles" / "example"
ACC = str(EXAMPLES / "acceptance.yaml")
LAT = str(EXAMPLES / "latency.yaml")
runner = CliRunner()


def _acc(tmp_path: Path, vec) -> str:
    p = tmp_path / "acc.yaml"
    p.write_text(yaml.safe_dump({"format": "treeopt-acceptance/1", "acceptance": vec}))
    return str(p)


def test_version():
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and __version__ in r.output


def test_solve_with_latency_writes_tree(tmp_path):
    out = tmp_path / "tree.yaml"
    r = runner.invoke(app, ["solve", "-a", ACC, "-l", LAT, "--budget", "128", "--max-depth", "8", "-o", str(out)])
    assert r.exit_code == 0, r.output
    tree, meta = load_tree(out)
    assert 1 < tree.size <= 128 and tree.tree_depth <= 8
    assert meta.predicted_speedup > 1
    assert meta.latency_profile == "example-synthetic-gpu"
    assert meta.expected_tokens_per_step == pytest.approx(tree.expected_tokens([0.62, 0.11, 0.05, 0.03, 0.02, 0.015, 0.01, 0.008]))
    assert "predicted speedup" in r.output


def test_solve_json_without_latency(tmp_path):
    r = runner.invoke(app, ["solve", "-a", ACC, "--budget", "32", "--max-depth", "6", "--json", "--compare"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["latency_profile"] is None
    assert doc["choice"]["nodes"] <= 32
    assert any("no --latency" in n for n in doc["notes"])
    names = [b["name"] for b in doc["baselines"]]
    assert names == ["chain", "k-ary", "specinfer", "best-first"]
    assert all(b["expected_tokens_per_step"] <= doc["choice"]["expected_tokens_per_step"] + 1e-9 for b in doc["baselines"])


def test_solve_json_with_latency_and_compare():
    r = runner.invoke(app, ["solve", "-a", ACC, "-l", LAT, "--budget", "256", "--max-depth", "10", "--json", "--compare"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert len(doc["alternatives"]) == 5
    assert doc["choice"]["speedup"] >= max(b["speedup"] for b in doc["baselines"]) - 1e-9


@pytest.mark.parametrize("fmt", ["json", "medusa"])
def test_other_formats(tmp_path, fmt):
    out = tmp_path / f"tree.{fmt}"
    r = runner.invoke(app, ["solve", "-a", ACC, "--budget", "16", "--max-depth", "4", "-o", str(out), "--format", fmt])
    assert r.exit_code == 0, r.output
    assert out.read_text().strip()


def test_a_json_output_file_gets_the_json_export(tmp_path):
    """-o tree.json without --format wrote YAML into a file named .json; now its suffix chooses the JSON export
    (the same text --format json writes), and a grafted tree (YAML only) is refused before solving."""
    by_name, by_format = tmp_path / "tree.json", tmp_path / "explicit.json"
    args = ["solve", "-a", ACC, "--budget", "16", "--max-depth", "4", "-o"]
    assert runner.invoke(app, args + [str(by_name)]).exit_code == 0
    assert runner.invoke(app, args + [str(by_format), "--format", "json"]).exit_code == 0
    doc, explicit = json.loads(by_name.read_text()), json.loads(by_format.read_text())
    assert doc["format"] == "treeopt-tree/1" and len(doc["nodes"]) == 16 and doc["nodes"] == explicit["nodes"]
    assert load_tree(by_name)[0].size == 16  # and it loads back (tree, metadata)
    r = runner.invoke(app, ["solve", "-a", ACC, "-a", ACC, "-l", LAT, "-l", LAT, "--pair-acceptance", ACC, "-o",
                            str(tmp_path / "graft.JSON")])
    assert r.exit_code == 2 and not (tmp_path / "graft.JSON").exists(), r.output
    assert f"-o {tmp_path / 'graft.JSON'}: a grafted tree (treeopt-tree/2) is written as YAML only" in r.output


def test_output_dash_prints_the_tree_and_writes_no_file(tmp_path, monkeypatch):
    """-o - wrote a file named '-'; it is standard output, as --format without -o (a batch plan: refused)."""
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["solve", "-a", ACC, "--budget", "8", "--max-depth", "4", "-o", "-"])
    assert r.exit_code == 0 and not (tmp_path / "-").exists(), r.output
    assert yaml.safe_load(r.stdout)["format"] == "treeopt-tree/1" and len(yaml.safe_load(r.stdout)["nodes"]) == 8
    r = runner.invoke(app, ["solve", "-a", ACC, "-l", str(EXAMPLES / "tbn-roofline.csv"), "--batch", "1,4", "-o", "-"])
    assert r.exit_code == 2 and "-o -: a batch plan or a grafted tree is written to a file only" in r.output
    assert list(tmp_path.iterdir()) == []


def test_an_output_over_an_input_is_refused_and_the_input_kept(tmp_path):
    """solve -o onto its own -a or -l profile replaced the profile with the tree (exit 0); export-draft --gguf
    onto its --draft replaced the weights with a requantised copy. Now one line, exit 2, the input unchanged."""
    acc, lat = tmp_path / "acc.yaml", tmp_path / "lat.yaml"
    acc.write_text(Path(ACC).read_text())
    lat.write_text(Path(LAT).read_text())
    for out, flag in ((acc, "--acceptance"), (lat, "--latency"), (tmp_path / "sub" / ".." / "lat.yaml", "--latency")):
        r = runner.invoke(app, ["solve", "-a", str(acc), "-l", str(lat), "-n", "8", "-o", str(out)])
        assert r.exit_code == 2 and f"-o {out} is the {flag} input: write the output to another path" in r.output
    assert acc.read_text() == Path(ACC).read_text() and lat.read_text() == Path(LAT).read_text()
    gguf = tmp_path / "d.gguf"
    gguf.write_bytes(b"GGUF-not-read")
    r = runner.invoke(app, ["export-draft", "--draft", str(gguf), "--gguf", str(gguf), "--no-check"])
    assert r.exit_code == 2 and f"--gguf {gguf} is the --draft input" in r.output
    assert gguf.read_bytes() == b"GGUF-not-read"


@pytest.mark.parametrize(
    "vec, args, match",
    [
        ([0.5, float("nan")], [], "acceptance[1] is nan (a file holds finite numbers)"),
        ([0.5, -0.1], [], "negative"),
        ([0.7, 0.6], [], "sums to"),
        ([True, 0.1], [], "holds true / false where probabilities belong"),  # it said 'sums to 1.1'
        ([True, False], [], "holds true / false where probabilities belong"),  # it solved [1.0, 0.0]
        ([], [], "empty"),
        ([0.5], ["--budget", "0"], "--budget"),
        ([0.5], ["--max-depth", "0"], "--max-depth"),
        ([0.5], ["--format", "pdf"], "unknown --format"),
        ([0.5], ["-l", "BADLAT"], "unsupported unit"),
        ([0.5], ["-l", LAT, "--budget", "4096"], "extrapolate"),
    ],
)
def test_bad_input_exit_2_and_no_file(tmp_path, vec, args, match):
    bad_lat = tmp_path / "lat.yaml"
    doc = yaml.safe_load(Path(LAT).read_text())
    doc["step_overhead_s"] = doc.pop("step_overhead_ms")
    bad_lat.write_text(yaml.safe_dump(doc))
    args = [str(bad_lat) if a == "BADLAT" else a for a in args]
    out = tmp_path / "tree.yaml"
    r = runner.invoke(app, ["solve", "-a", _acc(tmp_path, vec), "-o", str(out), *args])
    assert r.exit_code == 2, r.output
    assert match in r.stderr
    assert "Traceback" not in r.output
    assert len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()
    assert not list(tmp_path.glob(".tree.yaml*"))


def test_bad_acceptance_schema(tmp_path):
    p = tmp_path / "a.yaml"
    p.write_text("format: treeopt-acceptance/7\nacceptance: [0.5]\n")
    r = runner.invoke(app, ["solve", "-a", str(p), "-o", str(tmp_path / "t.yaml")])
    assert r.exit_code == 2 and "treeopt-acceptance/1" in r.stderr
    assert not (tmp_path / "t.yaml").exists()


# ---------------------------------------------------------------------------------------------- usage errors
@pytest.mark.parametrize("args, names", [
    (["solve", "-a", ACC, "--budget", "abc"], "'--budget'"),
    (["solve", "-a", ACC, "--bogus"], "--bogus"),
    (["solve"], "'--acceptance'"),
    (["profile", "latency", "--max-tokens", "x"], "'--max-tokens'"),
    (["run", "--tree"], "--tree"),
])
def test_usage_errors_are_one_line_and_exit_2(args, names):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1, r.output
    assert lines[0].startswith("error: ") and names in lines[0] and "--help" in lines[0]
    assert "╭" not in r.output and "Usage:" not in r.output


def test_help_and_bare_command_still_show_help():
    r = runner.invoke(app, [])
    assert "Usage" in r.output and "solve" in r.output
    r = runner.invoke(app, ["solve", "--help"])
    assert r.exit_code == 0 and "--budget" in r.output


def test_unwrap_help_joins_a_paragraphs_lines_and_keeps_what_is_laid_out():
    from sequoia_opt.cli.common import unwrap_help

    assert unwrap_help("Find the tree\n    with the most tokens.\n\n    Second\n    paragraph.") == \
        "Find the tree with the most tokens.\n\nSecond paragraph."
    assert unwrap_help("Steps:\n- one\n- two") == "Steps:\n- one\n- two"  # a list stays a list
    assert unwrap_help("\bkeep\nas is") == "\bkeep\nas is"  # click's no-rewrap marker
    assert unwrap_help(None) is None


@pytest.mark.parametrize("group", [[], ["profile"]])
def test_the_command_lists_flow_to_the_width_of_their_column(group):
    """Each command's description wraps where the column is full, not at the docstring's source line breaks
    (rich kept those: half-empty lines at 100 columns)."""
    r = runner.invoke(app, group + ["--help"])
    assert r.exit_code == 0
    panel = r.output.split("Commands")[1].splitlines()[1:]
    rows = [ln[1:-1] for ln in panel if ln.startswith("\u2502")]  # inside the box's side bars
    assert len(rows) >= 5
    name, first = rows[0].split()[:2]
    start = rows[0].index(first, rows[0].index(name) + len(name))  # where the description column begins
    width = len(rows[0]) - start
    for cur, nxt in zip(rows, rows[1:]):
        if nxt[:start].strip():  # the next line starts another command
            continue
        text, first_word = cur[start:].rstrip(), nxt[start:].split()[0]
        assert len(text) + 1 + len(first_word) > width - 1, (cur, nxt)  # wrapped because the next word did not fit


# ---------------------------------------------------------------------------------------------- --format
@pytest.mark.parametrize("fmt", ["medusa", "tensorrt-llm", "trtllm", "vllm", "sglang"])
def test_format_without_output_prints_the_export_to_stdout(tmp_path, fmt):
    args = ["solve", "-a", ACC, "-l", LAT, "--budget", "32", "--max-depth", "6", "--format", fmt]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    out = tmp_path / "export.txt"
    assert runner.invoke(app, args + ["-o", str(out)]).exit_code == 0
    assert r.stdout == out.read_text()  # stdout carries the export alone, byte for byte what -o writes
    assert "predicted speedup" in r.stderr  # the report went to stderr


def test_yaml_format_without_output_is_a_loadable_tree(tmp_path):
    r = runner.invoke(app, ["solve", "-a", ACC, "--budget", "16", "--max-depth", "4", "--format", "yaml"])
    assert r.exit_code == 0, r.output
    path = tmp_path / "t.yaml"
    path.write_text(r.stdout)
    tree, meta = load_tree(path)
    assert tree.size == 16 and meta.budget == 16


def test_tensorrt_llm_warns_about_its_4_bit_ranks(tmp_path):
    acc = _acc(tmp_path, [0.05] * 20)  # every rank equally likely: the budget goes to 19 children of the root
    r = runner.invoke(app, ["solve", "-a", acc, "--budget", "20", "--max-depth", "1", "--format", "tensorrt-llm"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == [[i] for i in range(19)]
    assert "warning: rank 18 > 15 (3 nodes)" in r.stderr and "--max-branching 16" in r.stderr
    assert "Medusa's reference code" not in r.stderr  # Medusa's TOPK advice is for Medusa only
    r = runner.invoke(app, ["solve", "-a", acc, "--budget", "20", "--max-depth", "1", "--format", "medusa"])
    assert "rank 18 >= 10" in r.stderr and "4 bits" not in r.stderr
    r = runner.invoke(app, ["solve", "-a", acc, "--budget", "16", "--max-depth", "1", "--format", "tensorrt-llm",
                            "--json"])
    doc = json.loads(r.stdout)
    warnings = doc["export"]["warnings"]
    assert doc["export"]["format"] == "tensorrt-llm" and len(warnings) == 1  # no rank past 15: the release line only
    assert warnings[0].startswith("only TensorRT-LLM up to the 1.3 release candidates take a choice list")


def test_unknown_format_names_the_formats(tmp_path):
    out = tmp_path / "t.txt"
    r = runner.invoke(app, ["solve", "-a", ACC, "--format", "onnx", "-o", str(out)])
    assert r.exit_code == 2 and "tensorrt-llm" in r.output and not out.exists()



def test_an_empty_format_is_refused_not_the_default(tmp_path):
    """``--format ""`` (``--format "$FMT"`` with FMT unset) solved with the default format, YAML, and wrote it into
    ``-o tree.json``, a file its name says is JSON, where ``--format " "`` was refused as an unknown format. Now both
    are refused in one line, nothing written."""
    out = tmp_path / "tree.json"
    for fmt in ("", " "):
        r = runner.invoke(app, ["solve", "-a", ACC, "-l", LAT, "-n", "16", "--format", fmt, "-o", str(out)])
        assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
        assert r.output.startswith(f"error: unknown --format {fmt!r}; choose one of yaml, json,"), r.output
        assert not out.exists()


# ---------------------------------------------------------------------------------------------- profile sizes
def test_solve_refuses_a_profile_whose_width_disagrees_with_its_vector(tmp_path):
    p = tmp_path / "acc.yaml"
    p.write_text(yaml.safe_dump({"format": "treeopt-acceptance/1", "measured": {"width": 8},
                                 "acceptance": [0.5, 0.2, 0.1]}))
    r = runner.invoke(app, ["solve", "-a", str(p)])
    assert r.exit_code == 2
    assert "measured.width is 8 but 'acceptance' has 3 entries" in r.output


def test_solve_without_format_prints_the_report_on_stdout_and_no_export():
    r = runner.invoke(app, ["solve", "-a", ACC, "--budget", "5"])
    assert r.exit_code == 0, r.output
    assert "expected tokens / step" in r.stdout and "format: treeopt-tree/1" not in r.stdout
    assert "format: treeopt-tree/1" not in r.stderr


def test_solve_at_a_context_between_measured_ones_writes_the_tree(tmp_path):
    out = tmp_path / "t.yaml"
    r = runner.invoke(app, ["solve", "-a", ACC, "-l", LAT, "--context", "1000", "--budget", "20", "-o", str(out)])
    assert r.exit_code == 0, r.output  # was a yaml RepresenterError on an np.float64 speedup
    tree, meta = load_tree(out)
    assert type(meta.predicted_speedup) is float and meta.predicted_speedup > 1
    r = runner.invoke(app, ["solve", "-a", ACC, "-l", LAT, "--context", "100", "--budget", "20"])
    assert r.exit_code == 2 and "below the smallest measured context 512" in r.output


def test_context_without_a_latency_profile_is_refused():
    r = runner.invoke(app, ["solve", "-a", ACC, "--context", "512"])
    assert r.exit_code == 2 and "--context selects where to read the latency profile" in r.output
    r = runner.invoke(app, ["solve", "-a", ACC, "-l", LAT, "--context", "-5"])
    assert r.exit_code == 2 and "--context must be a number of tokens >= 0, got -5" in r.output


def test_solve_compare_scores_the_baselines_with_the_solved_trees_value_model(tmp_path):
    """A profile whose positional check failed is solved per depth; its baselines were scored with the pooled
    vector (a chain of gamma=2 at 1 + 0.5 + 0.25 where per depth it is 1 + 0.2 + 0.16)."""
    acc = tmp_path / "acc.yaml"
    acc.write_text("format: treeopt-acceptance/1\nid: runs\nmeasured: {mode: greedy, positional_consistent: false}\n"
                   "acceptance: [0.5, 0.1, 0.05]\nacceptance_by_depth:\n  1: [0.2, 0.1, 0.05]\n  2: [0.8, 0.05, 0.02]\n")
    r = runner.invoke(app, ["solve", "-a", str(acc), "--budget", "8", "--max-depth", "4", "--compare", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["acceptance_model"] == "by-depth"
    base = {b["name"]: b for b in doc["baselines"]}
    gamma = base["chain"]["params"]["gamma"]
    p1 = [0.2] + [0.8] * gamma  # per-depth p_1: depth 1, then depth 2 (and deeper, the last row)
    want = sum(float(np.prod(p1[:j])) for j in range(gamma + 1))
    assert base["chain"]["expected_tokens_per_step"] == pytest.approx(want, rel=1e-12)
    assert base["best-first"]["expected_tokens_per_step"] <= doc["choice"]["expected_tokens_per_step"] + 1e-12


def test_solve_default_budget_fits_the_latency_profile(tmp_path):
    """The default budget (128) was refused on a profile measured to 64 tokens; it is lowered to what the
    profile measured, with a note. An explicit --budget past it is still refused."""
    from sequoia_opt.profiles import LatencyCurve, save_latency

    lat = save_latency(tmp_path / "lat.yaml", LatencyCurve.synthetic(
        {1: 10.0, 8: 10.5, 16: 11.0, 32: 13.0, 64: 20.0}, {w: 1.0 for w in (1, 8, 16, 32, 64)}, id="to64"))
    r = runner.invoke(app, ["solve", "-a", ACC, "-l", str(lat), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["budget_limit"] == 64 and doc["choice"]["nodes"] <= 64
    assert ("budget 64 (the default is 128): latency profile 'to64' was measured up to 64 target tokens, and T(n) "
            "is never extrapolated (--budget sets it)") in doc["notes"]
    r = runner.invoke(app, ["solve", "-a", ACC, "-l", str(lat), "--budget", "128"])
    assert r.exit_code == 2
    assert f"{lat}: budget 128 exceeds the largest target token count 64" in " ".join(r.output.split())  # the file


def test_a_budget_past_the_latency_profile_is_refused_before_the_dp(tmp_path, monkeypatch):
    """--budget 50000 against a profile measured to 1024 tokens ran the DP for minutes before it was refused."""
    import sequoia_opt.solver.depth as depth

    monkeypatch.setattr(depth, "solve_profile", lambda *a, **k: pytest.fail("the DP ran"))
    r = runner.invoke(app, ["solve", "-a", ACC, "-l", LAT, "--budget", "50000", "-o", str(tmp_path / "t.yaml")])
    assert r.exit_code == 2 and "budget 50000 exceeds the largest target token count 1024" in r.output
    assert not (tmp_path / "t.yaml").exists()


def test_ctrl_c_is_one_line_and_exit_130_while_loading_and_in_any_command(monkeypatch, capsys):
    """Ctrl-C while torch imported printed a 58-line traceback, and in tune (not guarded) a cut-off report."""
    import builtins
    import signal

    import typer

    from sequoia_opt._entry import main
    from sequoia_opt.errors import Terminated
    from sequoia_opt.cli.common import handle_errors

    real_import = builtins.__import__

    def interrupted_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 1 and name == "cli":
            raise KeyboardInterrupt
        return real_import(name, globals, locals, fromlist, level)

    from sequoia_opt._entry import STOP_SIGNALS, install_sigterm

    monkeypatch.setattr(builtins, "__import__", interrupted_import)
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, *STOP_SIGNALS)}
    try:
        with pytest.raises(SystemExit) as exc:
            main()
        after = {sig: signal.getsignal(sig) for sig in kept}  # ignored: a second stop cannot cut the line off
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        install_sigterm()
        installed = signal.getsignal(signal.SIGTERM)
    finally:  # main installs its handlers for the process: not this test session's (pytest's own stays)
        for sig, h in kept.items():
            signal.signal(sig, h)
    assert exc.value.code == 130 and capsys.readouterr().err == "interrupted: no output file was written\n"
    assert set(after.values()) == {signal.SIG_IGN}
    monkeypatch.setattr(builtins, "__import__", real_import)
    with pytest.raises(Terminated):
        installed(signal.SIGTERM, None)

    mini = typer.Typer()

    @mini.command()
    @handle_errors
    def slow() -> None:
        raise KeyboardInterrupt

    r = runner.invoke(mini, [])
    assert r.exit_code == 130
    assert r.output.strip() == "interrupted: each output file is whole or absent (written atomically, last)"


def test_a_stop_while_typer_builds_the_command_is_one_line(monkeypatch, capsys):
    """Ctrl-C in typer's own set-up (get_command, before the root group's guard) printed a traceback through
    typer/main.py: it is one line and exit 130 now, and later stops are ignored."""
    import signal

    import typer.main

    import sequoia_opt.cli.common as common
    from sequoia_opt._entry import STOP_SIGNALS, main

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(typer.main, "get_command", interrupted)
    monkeypatch.setattr(common, "on_command_end", None)  # main sets it for the process
    monkeypatch.setattr("sys.argv", ["treeopt", "solve"])
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, *STOP_SIGNALS)}
    try:
        with pytest.raises(SystemExit) as exc:
            main()
        after = {sig: signal.getsignal(sig) for sig in kept}
    finally:  # main installs its handlers for the process: not this test session's
        for sig, h in kept.items():
            signal.signal(sig, h)
    assert exc.value.code == 130 and capsys.readouterr().err == "interrupted: no output file was written\n"
    assert set(after.values()) == {signal.SIG_IGN}


def test_the_outermost_command_end_is_told_once_and_a_stop_after_it_is_ignored(monkeypatch):
    """A second Ctrl-C while Python exited printed 'Exception ignored in atexit callback ... KeyboardInterrupt', and
    one landing after the outputs were written ended the run 130 with no line or with 'interrupted' (its files
    saved). handle_errors tells the entry point when the outermost command has ended (returned, failed or stopped),
    and the entry point ignores later stops from then on; SIGHUP stops a command as SIGTERM does (129)."""
    import signal
    import subprocess
    import sys

    import typer

    import sequoia_opt.cli.common as common
    from sequoia_opt.cli.common import handle_errors

    ended: list[str] = []
    monkeypatch.setattr(common, "on_command_end", lambda: ended.append("end"))
    mini = typer.Typer()

    @handle_errors
    def inner() -> None:
        ended.append("inner")

    @mini.command()
    @handle_errors
    def outer(stop: bool = False) -> None:
        inner()  # a command another runs ends inside it: not the end
        if stop:
            raise KeyboardInterrupt

    assert runner.invoke(mini, []).exit_code == 0 and ended == ["inner", "end"]
    ended.clear()
    r = runner.invoke(mini, ["--stop"])
    assert r.exit_code == 130 and ended == ["inner", "end"] and "interrupted:" in r.output
    code = ("import os, signal, sys\n"
            "from sequoia_opt._entry import install_sigterm, ignore_stops\n"
            "from sequoia_opt.errors import Terminated, stop_exit_code\n"
            "install_sigterm()\n"
            "try:\n"
            "    os.kill(os.getpid(), signal.SIGHUP); signal.pause()\n"
            "except Terminated as err:\n"
            "    print('stopped', err.signum, stop_exit_code(err))\n"
            "ignore_stops()\n"
            "for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP): os.kill(os.getpid(), sig)\n"
            "print('alive')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"stopped {int(signal.SIGHUP)} 129\nalive\n", "")


def test_a_python_warning_in_a_command_is_shown_once_and_the_command_ends(recwarn):
    """Any warning but treeopt's own (a torch or numpy UserWarning, a DeprecationWarning) made every command loop
    until the machine ran out of memory: handle_errors showed it while still recording, and each warning shown
    was recorded again into the list being shown. Now each is shown once, after the command, and it exits."""
    import warnings

    import typer

    from sequoia_opt.cli.common import handle_errors
    from sequoia_opt.errors import ProfileWarning

    mini = typer.Typer()

    @mini.command()
    @handle_errors
    def warns() -> None:
        warnings.warn("a library's warning", UserWarning)
        for _ in range(2):
            warnings.warn("the profile is old", ProfileWarning)
        typer.echo("done")

    r = runner.invoke(mini, [])
    assert r.exit_code == 0 and r.output.count("the profile is old") == 1 and "done" in r.output, r.output
    shown = [str(w.message) for w in recwarn.list]  # the library's warning reaches Python's own display
    assert shown == ["a library's warning"]


def test_a_path_is_shown_as_typed_not_as_rich_emoji(tmp_path):
    """rich replaced ':smile:' in a user's path or flag with an emoji (a😄b.yaml), so the message named a file
    that does not exist; the consoles now print text as typed."""
    missing = tmp_path / "a:smile:b.yaml"
    r = runner.invoke(app, ["solve", "-a", str(missing), "-n", "4"])
    assert r.exit_code == 2 and f"cannot read acceptance profile {missing}" in r.output, r.output
    r = runner.invoke(app, ["solve", "-a", ACC, "-n", "4", "-o", str(tmp_path / ":dog:.yaml")])
    assert r.exit_code == 0 and f"wrote yaml to {tmp_path / ':dog:.yaml'}" in r.output.replace("\n", ""), r.output


def test_a_table_where_a_profile_belongs_says_which_commands_read_tables():
    """solve -l TABLE.csv (no --batch) said 'a latency profile must be a YAML mapping with a format key'."""
    r = runner.invoke(app, ["solve", "-a", ACC, "-l", str(EXAMPLES / "tbn-roofline.csv"), "-n", "8"])
    assert r.exit_code == 2 and ("tbn-roofline.csv: a T(b, n) table, not a latency profile: treeopt tune and solve "
                                 "--batch read tables") in r.output.replace("\n", ""), r.output


def test_plot_names_a_wrong_run_file_and_a_file_as_out_dir(tmp_path):
    """plot --run TREE.json said 'run report has no summaries list' without the file; -o onto a file drew the
    PNGs first and then failed with 'File exists'."""
    tree = tmp_path / "t.json"
    assert runner.invoke(app, ["solve", "-a", ACC, "-n", "4", "-o", str(tree)]).exit_code == 0
    r = runner.invoke(app, ["plot", "--run", str(tree), "-o", str(tmp_path / "plots")])
    assert r.exit_code == 2 and f"{tree}: not a run results file (no 'summaries' list" in r.output.replace("\n", "")
    afile = tmp_path / "afile"
    afile.write_text("x")
    r = runner.invoke(app, ["plot", "-a", ACC, "-o", str(afile)])
    assert r.exit_code == 2 and f"--out-dir {afile}: it exists and is not a folder" in r.output.replace("\n", "")
    assert afile.read_text() == "x" and not (tmp_path / "plots").exists()


@pytest.mark.parametrize("seed, bound", [("18446744073709551616", "less than or equal to 18446744073709551615"),
                                         ("-9223372036854775809", "greater than or equal to -9223372036854775808")])
def test_a_seed_past_the_generators_range_is_one_line_before_loading(seed, bound):
    """--seed 2**64 crashed with 'Overflow when unpacking long long' after the models loaded (exit 1)."""
    r = runner.invoke(app, ["run", "--tree", "t.yaml", "--seed", seed])
    assert r.exit_code == 2 and f"Invalid value for '--seed': Input should be {bound}" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("command", [["run"], ["profile", "acceptance"], ["profile", "graft"]])
def test_the_seeds_range_is_not_drawn_in_the_help_type_column(command):
    """typer drew --seed's min / max as a 40-character '[-9223372036854775808<=x<=...]' type, which squeezed every
    description of run --help into 26 columns; the range is checked by a callback and said in the help."""
    r = runner.invoke(app, [*command, "--help"])
    out = r.output
    flowing = " ".join(out.replace("\u2502", " ").split())
    assert r.exit_code == 0 and "<=x<=" not in out and "-2^63 .. 2^64 - 1" in flowing


def test_export_draft_keeps_the_users_gguf_when_llama_cpp_refuses_the_new_one(tmp_path, monkeypatch):
    """export-draft wrote over --gguf, then deleted it when llama.cpp refused the new file: the user's old, good
    GGUF was gone. Now the new file is checked before it replaces anything: exit 2, the old bytes kept, no temp
    file left beside it."""
    import sequoia_opt.engines.llamacpp as llamacpp
    from sequoia_opt.engines import EngineError

    def refuse(path):
        raise EngineError(f"llama.cpp refuses {path}: tensor data ends early")

    monkeypatch.setattr(llamacpp, "check_gguf", refuse)
    gguf = tmp_path / "user.gguf"
    gguf.write_bytes(b"the user's good GGUF")
    r = runner.invoke(app, ["export-draft", "--gguf", str(gguf)])
    assert r.exit_code == 2, r.output
    assert f"llama.cpp refuses {gguf}: tensor data ends early" in r.output and ".tmp" not in r.output
    assert gguf.read_bytes() == b"the user's good GGUF"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["user.gguf"]
    monkeypatch.setattr(llamacpp, "check_gguf", lambda path: None)  # accepted: it replaces the old file
    r = runner.invoke(app, ["export-draft", "--gguf", str(gguf)])
    assert r.exit_code == 0 and "llama.cpp loads it" in r.output, r.output
    assert gguf.read_bytes()[:4] == b"GGUF" and sorted(p.name for p in tmp_path.iterdir()) == ["user.gguf"]
    # --json carries what the table shows (a script could not tell a checked file from --no-check)
    r = runner.invoke(app, ["export-draft", "--gguf", str(gguf), "--json"])
    doc = json.loads(r.stdout)
    assert doc["llama_cpp_loads"] is True and doc["name"] == "treeopt-smollm2-draft" and doc["parameters"] > 0
    assert doc["vocabulary"] == 49152
    doc = json.loads(runner.invoke(app, ["export-draft", "--gguf", str(gguf), "--json", "--no-check"]).stdout)
    assert doc["llama_cpp_loads"] is None
    # llama-cpp-python missing: written, said not checked (the typed EngineNotInstalled, not the message's words)
    from sequoia_opt.errors import EngineNotInstalled

    def missing(path):
        raise EngineNotInstalled("engine llama.cpp is not installed: pip install llama-cpp-python")

    monkeypatch.setattr(llamacpp, "check_gguf", missing)
    doc = json.loads(runner.invoke(app, ["export-draft", "--gguf", str(gguf), "--json"]).stdout)
    assert doc["llama_cpp_loads"] is None and doc["not_checked"].startswith("engine llama.cpp is not installed")
    monkeypatch.setattr(llamacpp, "check_gguf", lambda path: None)
    # a re-export keeps the source GGUF's general.name (it took the file's stem)
    from gguf import GGUFReader

    again = tmp_path / "again.gguf"
    r = runner.invoke(app, ["export-draft", "--draft", str(gguf), "--gguf", str(again), "--no-check"])
    assert r.exit_code == 0, r.output
    field = GGUFReader(str(again)).fields["general.name"]
    assert bytes(field.parts[field.data[0]]).decode() == "treeopt-smollm2-draft"
    again.unlink()
    # refused in folders it made for the file: none of them is left behind
    monkeypatch.setattr(llamacpp, "check_gguf", refuse)
    r = runner.invoke(app, ["export-draft", "--gguf", str(tmp_path / "new" / "sub" / "x.gguf")])
    assert r.exit_code == 2 and sorted(p.name for p in tmp_path.iterdir()) == ["user.gguf"], r.output


def test_plot_draws_a_grafted_trees_shape(tmp_path):
    """A tryout: plot --tree on the grafted tree solve --pair-acceptance writes was refused with the reader's
    internal hint ('use the multi-drafter path (load_drafter_tree)'); plot draws its shape."""
    from sequoia_opt.tree import DrafterTree, Tree, TreeMetadata, save_drafter_tree

    shape = Tree.from_choices([[0], [1], [0, 0]])
    path = save_drafter_tree(tmp_path / "graft.yaml", DrafterTree(shape, (0, 0, 1, 0), ("lookup:1-3", "draft")),
                             TreeMetadata())
    r = runner.invoke(app, ["plot", "--tree", str(path), "-o", str(tmp_path / "plots"), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["written"] == [str(tmp_path / "plots" / "tree.png")]
    assert (tmp_path / "plots" / "tree.png").stat().st_size > 1000


def test_plot_says_when_its_profiles_are_of_another_pair_than_the_run(tmp_path):
    """A tryout drew a demo-pair run against a tiny pair's predicted curve without a word (solve warns)."""
    from sequoia_opt.profiles import load_acceptance

    run = tmp_path / "run.json"
    run.write_text(json.dumps({"summaries": [], "settings": {"target": "another-target", "draft": "another-draft"}}))
    r = runner.invoke(app, ["plot", "--run", str(run), "-a", ACC, "-o", str(tmp_path / "plots"), "--json"])
    assert r.exit_code == 0, r.output
    measured = load_acceptance(ACC).measured
    warnings = json.loads(r.stdout)["warnings"]
    assert any(f"was measured with target {measured['target']!r}, but this run uses 'another-target'" in w
               for w in warnings), warnings


def test_solve_batch_refuses_the_options_it_had_dropped(tmp_path):
    """solve --batch took --width 3 against a profile of 8 entries, --policy and --plan graft, and printed the very
    table it prints without them (exit 0): the width check and the two other modes' options were dropped unsaid."""
    tbn = str(EXAMPLES / "tbn-roofline.csv")
    base = ["solve", "-a", ACC, "-l", tbn, "--batch", "1,4", "--budget", "8", "--max-depth", "4"]
    out = tmp_path / "plan.yaml"
    for args, message in ((["--width", "3"], "has 8 entries but --width 3 was asked for"),
                          (["--policy", "eagle"], "per batch size: drop --policy"),
                          (["--plan", "graft"], "per batch size: drop --plan")):
        r = runner.invoke(app, [*base, "-o", str(out), *args])
        assert r.exit_code == 2 and message in r.stderr and "Traceback" not in r.output, r.output
        assert len([ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]) == 1 and not out.exists()
    r = runner.invoke(app, [*base, "--width", "8", "-o", str(out)])  # the profile's own width: solved as before
    assert r.exit_code == 0 and out.is_file(), r.output


@pytest.mark.parametrize("make", ["too_long", "loop", "dangling"])
def test_an_output_path_the_os_cannot_look_up_is_refused_before_any_work(tmp_path, make):
    if make == "too_long":  # pathlib raised OSError: a traceback
        path, why = tmp_path / ("n" * 256), "File name too long"
    else:
        path, why = tmp_path / "a", "Too many levels of symbolic links"
        path.symlink_to(tmp_path / ("nowhere/res" if make == "dangling" else "b"))
        if make == "loop":  # solve failed with RuntimeError; run measured, then lost its results ("File exists")
            (tmp_path / "b").symlink_to(path)
        else:
            why = f"a symbolic link to {tmp_path / 'nowhere/res'}, which does not exist (make that folder, or give another)"
    if make != "dangling":  # a dangling -o is written through: its target is made
        r = runner.invoke(app, ["solve", "-a", ACC, "--budget", "8", "--max-depth", "3", "-o", str(path)])
        assert r.exit_code == 2 and f"cannot write {path}: {why}" in " ".join(r.output.split()), r.output
    r = runner.invoke(app, ["run", "--tree", str(tmp_path / "no-tree.yaml"), "--target", str(tmp_path / "t"),
                            "--draft", str(tmp_path / "d"), "--results-dir", str(path)])
    assert r.exit_code == 2 and f"--results-dir {path}: {why}" in " ".join(r.output.split()), r.output


def test_an_output_link_is_checked_where_its_file_goes(tmp_path):
    (tmp_path / "f").write_text("a file, not a folder")
    link = tmp_path / "tree.yaml"
    link.symlink_to(tmp_path / "f" / "tree.yaml")  # written through: the file would go under a file
    r = runner.invoke(app, ["solve", "-a", ACC, "--budget", "8", "--max-depth", "3", "-o", str(link)])
    # checked up front, as the link's own folder (was: the work done, then "cannot write ...: File exists")
    assert r.exit_code == 2 and f"{tmp_path / 'f'} is not a folder" in " ".join(r.output.split()), r.output
    assert link.is_symlink() and (tmp_path / "f").read_text() == "a file, not a folder"
    real = tmp_path / "real.yaml"
    link.unlink()
    link.symlink_to(real)
    r = runner.invoke(app, ["solve", "-a", ACC, "--budget", "8", "--max-depth", "3", "-o", str(link)])
    assert r.exit_code == 0 and link.is_symlink() and load_tree(real)[0].size >= 1, r.output


def test_a_tree_solved_at_one_top_p_is_flagged_when_run_sampling_at_another(tmp_path):
    """The nucleus cuts both models' distributions, so a sampled profile's acceptance holds for its top-p only: the
    tree records the profile's top_p and run's mismatch check compares it where both sample (it was dropped)."""
    from sequoia_opt.jobs.entries import tree_mismatch_warnings

    p = tmp_path / "acc.yaml"
    p.write_text(yaml.safe_dump({"format": "treeopt-acceptance/1", "acceptance": [0.6, 0.1, 0.05],
                                 "measured": {"mode": "sampling", "temperature": 1.0, "top_p": 0.9}}))
    out = tmp_path / "tree.yaml"
    r = runner.invoke(app, ["solve", "-a", str(p), "--budget", "8", "-o", str(out)])
    assert r.exit_code == 0, r.output
    _, meta = load_tree(out)
    assert meta.extra["profiled_temperature"] == 1.0 and meta.extra["profiled_top_p"] == 0.9
    kw = dict(device="cpu x", dtype="float32", target="t", draft="d")
    (w,) = tree_mismatch_warnings("tree", meta, temperature=1.0, top_p=1.0, **kw)
    assert w == ("tree 'tree' was solved from profiles measured with top_p 0.9, but this run uses 1.0: its "
                 "predicted figures describe that setting")
    assert tree_mismatch_warnings("tree", meta, temperature=1.0, top_p=0.9, **kw) == []
    # greedy reads no nucleus: only the temperature is said
    (w,) = tree_mismatch_warnings("tree", meta, temperature=0.0, top_p=1.0, **kw)
    assert "temperature 1.0" in w
    assert tree_mismatch_warnings("tree", meta, temperature=1.0, top_p=None, **kw) == []
