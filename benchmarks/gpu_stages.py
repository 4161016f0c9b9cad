"""The stage runner behind ``benchmarks/gpu_check.sh``: every GPU measurement of the project in one command that
must return its figures on the first try (a lent GPU gives one command of at most 600 s and returns at most 8
files of ``$OUT``).

One deadline for the whole script (:data:`DEADLINE_S`, 540 s); each stage runs in its own process group with a
cap taken from the time left (:func:`stage_cap`: its own maximum, or what is left after the kill grace, the
final write and the time kept for later stages), is stopped at its cap (SIGTERM, then SIGKILL after
:data:`KILL_GRACE_S`) and skipped when less than its minimum is left. After every stage (and every
:data:`REFRESH_S` seconds during one) three files in ``$OUT`` are replaced atomically: ``gpu_check.tar.gz``
(everything the stages wrote: JSON, profiles, logs), ``gpu_check.log`` and ``summary.json`` (stage statuses,
toolchain, headline figures). A run killed at any point still returns what the stages before it measured.

Stages (GPU; ``--dry-run`` runs each on a CPU with tiny sizes, the graphed profiles expected to be refused):

==================== ==========================================================================================
preflight            CUDA_HOME holding ``include/cuda_runtime_api.h`` (torch guesses it from ``which nvcc``,
                     wrong when nvcc is a wrapper script), nvcc, ninja, c++, torch and the GPU, whether numba
                     imports against this numpy, which packages are missing (gguf is: nothing on the path
                     needs it; ``--dry-run`` hides it to prove that)
engines              SGLang / vLLM T(n) where installed (not on the lent machines: one line)
build                the tree-attention kernel for this GPU; a failed or interrupted build disables the kernel
                     for every later stage (no rebuild, no wait on torch's build lock)
kernel               correctness against float64 attention, every benchmark row's error, time against SDPA
                     with a mask and FlexAttention, fraction of copy bandwidth (``gpu_check.py``)
profile-7b-eager     T(n), c(w) of random-weight Llama-2-7B / JackFram-68M shapes, bf16, eager PyTorch, the
                     kernel asked for (``--backend cuda``) when it passed its check, else the torch reference
profile-7b-graphs    the same with ``--cuda-graphs``
profile-demo-eager   the demo pair's shapes (SmolLM2-135M target, the bundled draft), random weights
profile-demo-graphs  the same with ``--cuda-graphs``
figures              T(n)/T(1) eager and graphed; the demo pair's GPU speedup PREDICTED from the GPU curve and
                     the acceptance measured on CPU (``gpu_figures.py``)
offload              T(n) of the 7B shape streamed from pinned host memory, solved tree, greedy check
==================== ==========================================================================================

Exit status: 0 every stage ran and passed; 3 none failed but one was cut short or skipped for time; 1 a stage
failed; 2 a usage error.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
DEADLINE_S = 540.0  # the whole script; the device tool stops a command at 600 s
KILL_GRACE_S = 10.0  # a stage gets SIGTERM at its cap and SIGKILL this much later
FINAL_S = 5.0  # kept for the last archive, summary and table
REFRESH_S = 15.0  # $OUT refreshed this often during a long stage
OUT_FILES = ("gpu_check.tar.gz", "gpu_check.log", "summary.json")  # all that goes to $OUT
DEMO_DRAFT_CONFIG = "sequoia_opt/data/draft/config.json"  # the bundled draft's shape (its weights: 14 MB)
GPU_CONTEXTS, GPU_MAX_TOKENS, GPU_MAX_DRAFT_TOKENS = "512,1920", 128, 64  # the GPU profiles' grid


# ------------------------------------------------------------------------------------------------ deadline


@dataclass
class Stage:
    """One stage.

    Attributes:
        name, what: its name and one line saying what it measures.
        max_s: the most it may take; min_s: the least worth starting it with (else skipped).
        reserve_s: what earlier stages must leave for it.
        argv: the command, or a function of (cap in s, the run) returning it; None for an in-process stage.
        fn: an in-process stage: a function of (the run, its cap in s) returning (status, note); it keeps to
            its cap itself (no process to stop).
        rc_status: the status each exit code means (``{0: "ok", 3: "incomplete"}``); any other is "failed".
        skip: a function of the run returning why it must not run (None: run it).
    """

    name: str
    what: str
    max_s: float
    min_s: float
    reserve_s: float = 0.0
    argv: list[str] | Callable[[float, "Run"], list[str]] | None = None
    fn: Callable[["Run", float], tuple[str, str]] | None = None
    rc_status: dict[int, str] = field(default_factory=lambda: {0: "ok"})
    skip: Callable[["Run"], str | None] | None = None


def stage_cap(left_s: float, stage: Stage, later: list[Stage]) -> float:
    """Seconds ``stage`` may run when ``left_s`` remain before the deadline: its ``max_s``, or the time left
    after its kill grace (a stopped stage may take that long to die), the final write and what later stages
    keep (``reserve_s`` plus their own kill grace, for each that has a reserve), whichever is less (may be
    negative: nothing is left)."""
    kept = sum(s.reserve_s + KILL_GRACE_S for s in later if s.reserve_s > 0)
    return min(stage.max_s, left_s - KILL_GRACE_S - FINAL_S - kept)


def next_cap(left_s: float, stage: Stage, later: list[Stage]) -> tuple[float, str | None]:
    """The runner's rule for the next stage: (its cap, why it is skipped or None). Skipped when its cap is below
    its ``min_s``. A stage that runs ends by its cap plus :data:`KILL_GRACE_S`, so with ``left_s`` measured from
    the deadline the run ends :data:`FINAL_S` before it, whatever the stages do."""
    cap = stage_cap(left_s, stage, later)
    return cap, (None if cap >= stage.min_s else f"{max(cap, 0):.0f} s left for it, it needs {stage.min_s:.0f}")


# ------------------------------------------------------------------------------------------------ toolchain


def _run(cmd: list[str], timeout: float = 30.0, env: dict | None = None) -> tuple[int, str]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        return p.returncode, (p.stdout + p.stderr).strip()
    except (OSError, subprocess.SubprocessError) as err:
        return -1, f"{type(err).__name__}: {err}"


def cuda_home_ok(path: str | os.PathLike | None) -> bool:
    """A CUDA_HOME torch's extension builder can use: ``include/cuda_runtime_api.h`` and ``bin/nvcc``."""
    if not path:
        return False
    p = Path(path)
    return (p / "include" / "cuda_runtime_api.h").is_file() and (p / "bin" / "nvcc").exists()


def find_cuda_home(environ: dict[str, str] | None = None) -> tuple[str | None, str]:
    """The CUDA toolkit folder to export as CUDA_HOME, and how it was found. Tried in order: $CUDA_HOME and
    $CUDA_PATH; the ``TOP`` nvcc reports in a dry run (``nvcc --dryrun``: right even when ``nvcc`` on PATH is
    a wrapper script that execs the real one, where torch's guess, the folder above ``which nvcc``, has no
    headers); the folder above the resolved nvcc; /usr/local/cuda and /usr/local/cuda-*. Each must pass
    :func:`cuda_home_ok`. Returns (None, why) when none does."""
    env = dict(os.environ if environ is None else environ)
    tried = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            if cuda_home_ok(env[var]):
                return str(Path(env[var]).resolve()), f"${var}"
            tried.append(f"${var}={env[var]}")
    nvcc = shutil.which("nvcc", path=env.get("PATH"))
    if nvcc:
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "probe.cu"
            src.write_text("")
            rc, out = _run([nvcc, "--dryrun", "-c", str(src), "-o", str(Path(tmp) / "probe.o")], timeout=30, env=env)
        m = re.search(r"^#\$ TOP=(.+)$", out, re.MULTILINE)
        if m:
            top = Path(m.group(1).strip()).resolve()
            if cuda_home_ok(top):
                return str(top), f"nvcc --dryrun TOP ({nvcc})"
            tried.append(f"nvcc TOP {top}")
        real = Path(nvcc).resolve().parent.parent
        if cuda_home_ok(real):
            return str(real), f"the folder above {Path(nvcc).resolve()}"
        tried.append(str(real))
    for cand in [Path("/usr/local/cuda")] + sorted(Path("/usr/local").glob("cuda-*"), reverse=True):
        if cuda_home_ok(cand):
            return str(cand.resolve()), str(cand)
        tried.append(str(cand))
    return None, "no CUDA toolkit with include/cuda_runtime_api.h and bin/nvcc (tried " + ", ".join(tried) + ")"


def preflight(run: "Run", cap: float = 60.0) -> tuple[str, str]:
    """Log and record the toolchain; export CUDA_HOME for every later stage, within ``cap`` seconds (the Python
    probes run at once, each with a timeout under it). Returns (status, note)."""
    tc: dict[str, Any] = {}
    home, how = find_cuda_home(run.env)
    tc["cuda_home"], tc["cuda_home_found_by"] = home, how
    if home:
        run.env["CUDA_HOME"] = home
        run.env["PATH"] = f"{home}/bin{os.pathsep}{run.env.get('PATH', '')}"
    for tool, cmd in (("nvcc", ["nvcc", "--version"]), ("ninja", ["ninja", "--version"]), ("c++", ["c++", "--version"]),
                      ("nvidia-smi", ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                      "--format=csv,noheader"])):
        path = shutil.which(cmd[0], path=run.env.get("PATH"))
        if path is None:
            tc[tool] = None
            continue
        rc, out = _run([path] + cmd[1:], env=run.env)
        lines = [ln for ln in out.splitlines() if ln.strip()]
        pick = lines[-1] if tool == "nvcc" and lines else (lines[0] if lines else "")
        tc[tool] = {"path": path, "version": pick if rc == 0 else f"exit {rc}: {pick}"}
    py = run.python
    probes = {
        "torch": "import torch; print(torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.is_available(),"
                 " torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')",
        "numba": "import numpy, numba; print('numpy', numpy.__version__, 'numba', numba.__version__)",
        "treeopt": "import sequoia_opt.cli, sequoia_opt.model.gguf_loader as g; print('imports ok; gguf',"
                   " 'present' if g.gguf is not None else 'absent')",
    }
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(probes)) as pool:  # three interpreter starts at once, not one after another
        probe_s = max(5.0, cap - 15.0)
        done = dict(zip(probes, pool.map(lambda code: _run([py, "-c", code], timeout=probe_s, env=run.env),
                                         probes.values())))
    for name, (rc, out) in done.items():
        tc[name] = out.splitlines()[-1] if rc == 0 and out else f"FAILED (exit {rc}): {out[-400:]}"
    if home:
        tc["cudart"] = next((str(p) for p in (Path(home) / "lib64" / "libcudart.so", Path(home) / "lib" / "libcudart.so")
                             if p.exists()), "MISSING: no lib64/libcudart.so under CUDA_HOME (the link step needs it)")
    tc["packages_missing"] = [m for m in ("numpy", "numba", "yaml", "typer", "rich", "pandas", "safetensors",
                                          "tokenizers", "matplotlib", "triton", "gguf")
                              if importlib.util.find_spec(m) is None]
    if run.dry_run:
        tc["gguf"] = "hidden from every stage (--dry-run: the GPU machine has none)"
    run.toolchain = tc
    for k, v in tc.items():
        run.log(f"[preflight] {k}: {v}")
    bad = [k for k in ("torch", "numba", "treeopt") if str(tc.get(k, "")).startswith("FAILED")]
    if not run.dry_run and home is None:
        run.kernel_disabled = f"no usable CUDA_HOME ({how})"
    if bad:
        return "failed", "failed to import: " + ", ".join(bad)
    return "ok", f"CUDA_HOME={home} ({how})" if home else f"no CUDA_HOME: {how}"


# ------------------------------------------------------------------------------------------------ the run


@dataclass
class StageResult:
    name: str
    what: str
    status: str = "pending"  # running | ok | incomplete | failed | timeout | skipped | refused (expected)
    rc: int | None = None
    seconds: float = 0.0
    cap_s: float | None = None
    note: str = ""


class Run:
    """One run of the stages: the output folders, the environment the stages inherit, the log, the results."""

    def __init__(self, results: Path, out: Path | None, dry_run: bool, python: str, deadline_s: float) -> None:
        self.results, self.out, self.dry_run, self.python = results, out, dry_run, python
        self.deadline_s = deadline_s
        self.t0 = time.monotonic()
        self.started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.results.mkdir(parents=True, exist_ok=True)
        self.log_path = self.results / "gpu_check.log"
        self._log = open(self.log_path, "a", buffering=1)
        self._lock = threading.RLock()  # re-entered when SIGTERM arrives while the main thread logs
        self.env = self._stage_env()
        self.toolchain: dict[str, Any] = {}
        self.stages: list[StageResult] = []
        self.kernel_disabled: str | None = None
        self.current: subprocess.Popen | None = None
        self._last_refresh = 0.0

    def _stage_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("OUT", None)  # only this runner writes $OUT: at most three files
        paths = [str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        if self.dry_run:  # the GPU machine has no gguf: nothing on the check's path may need it
            block = Path(tempfile.mkdtemp(prefix="treeopt-no-gguf-"))
            (block / "gguf").mkdir()
            (block / "gguf" / "__init__.py").write_text(
                "raise ModuleNotFoundError(\"No module named 'gguf' (hidden by gpu_check.sh --dry-run: the GPU "
                "machine has no gguf)\", name='gguf')\n")
            paths.insert(0, str(block))
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["PYTHONUNBUFFERED"] = "1"
        if self.dry_run:
            env["OMP_NUM_THREADS"] = "1"  # a shared CPU: spinning OpenMP threads make tiny forwards 100x slower
        env.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "treeopt" / "torch_extensions"))
        env.setdefault("MAX_JOBS", str(os.cpu_count() or 4))
        return env

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.deadline_s - self.elapsed()

    def log(self, line: str) -> None:
        with self._lock:
            print(line, flush=True)
            self._log.write(line + "\n")

    # ---------------------------------------------------------------------------------------- $OUT
    def summary(self) -> dict[str, Any]:
        return {"script": "benchmarks/gpu_check.sh", "dry_run": self.dry_run, "started": self.started,
                "elapsed_s": round(self.elapsed(), 1), "deadline_s": self.deadline_s,
                "results_dir": str(self.results), "kernel_disabled": self.kernel_disabled,
                "toolchain": self.toolchain, "stages": [vars(s) for s in self.stages],
                "figures": collect_figures(self.results), "exit_code": self.exit_code()}

    def exit_code(self) -> int:
        states = {s.status for s in self.stages}
        if "failed" in states:
            return 1
        if states & {"timeout", "skipped", "incomplete", "running", "interrupted"}:
            return 3
        return 0

    def refresh(self, force: bool = True) -> None:
        """Write summary.json into the results, and replace the three $OUT files (temp file + rename each)."""
        now = time.monotonic()
        if not force and now - self._last_refresh < REFRESH_S:
            return
        self._last_refresh = now
        doc = json.dumps(self.summary(), indent=2, default=str) + "\n"
        _atomic_write(self.results / "summary.json", doc.encode())
        if self.out is None:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for p in sorted(self.results.rglob("*")):
                if p.is_file() and not p.name.startswith("."):
                    try:
                        tar.add(p, arcname=str(Path(self.results.name) / p.relative_to(self.results)))
                    except OSError:
                        pass  # a file a stage is replacing right now: the next refresh takes it
        _atomic_write(self.out / OUT_FILES[0], buf.getvalue())
        with self._lock:
            self._log.flush()
            _atomic_write(self.out / OUT_FILES[1], self.log_path.read_bytes())
        _atomic_write(self.out / OUT_FILES[2], doc.encode())

    # ---------------------------------------------------------------------------------------- stages
    def run_stage(self, st: Stage, later: list[Stage]) -> StageResult:
        res = StageResult(st.name, st.what)
        self.stages.append(res)
        why = st.skip(self) if st.skip else None
        cap, short = next_cap(self.left(), st, later)
        res.cap_s = round(cap, 1)
        why = why or short
        if why is not None:
            res.status, res.note = "skipped", why
            self.log(f"== [{self.elapsed():5.0f} s] {st.name}: SKIPPED ({why})")
            self.refresh()
            return res
        self.log(f"== [{self.elapsed():5.0f} s] {st.name} (cap {cap:.0f} s): {st.what}")
        res.status = "running"
        self.refresh()
        t = time.monotonic()
        if st.fn is not None:
            try:
                res.status, res.note = st.fn(self, cap)
            except Exception as err:  # noqa: BLE001 - a broken in-process stage must not stop the others
                res.status, res.note = "failed", f"{type(err).__name__}: {err}"
        else:
            argv = st.argv(cap, self) if callable(st.argv) else st.argv
            res.rc, timed_out = self._spawn([str(a) for a in argv], cap)
            if timed_out:
                res.status, res.note = "timeout", f"stopped at its {cap:.0f} s cap"
            else:
                res.status = st.rc_status.get(res.rc, "failed")
                if res.status == "failed":
                    res.note = f"exit {res.rc}"
        res.seconds = round(time.monotonic() - t, 1)
        self.log(f"== [{self.elapsed():5.0f} s] {st.name}: {res.status} in {res.seconds} s {res.note}")
        self.refresh()
        return res

    def _spawn(self, argv: list[str], cap: float) -> tuple[int | None, bool]:
        self.log(f"$ {' '.join(argv)}")
        proc = subprocess.Popen(argv, cwd=REPO, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent)
        self.current = proc
        reader = threading.Thread(target=self._pump, args=(proc.stdout,), daemon=True)
        reader.start()
        end = time.monotonic() + cap
        timed_out = False
        try:
            while True:
                try:
                    proc.wait(timeout=max(0.05, min(2.0, end - time.monotonic())))
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() >= end:
                        timed_out = True
                        self.log(f"[runner] cap of {cap:.0f} s reached: SIGTERM, SIGKILL after {KILL_GRACE_S:.0f} s")
                        _kill_group(proc, grace=KILL_GRACE_S)
                        break
                    self.refresh(force=False)
        finally:
            reader.join(timeout=5)
            self.current = None
        return proc.returncode, timed_out

    def _pump(self, stream) -> None:
        for raw in iter(stream.readline, b""):
            self.log(raw.decode(errors="replace").rstrip("\n"))
        stream.close()


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _die_with_parent() -> None:
    """In the stage's child: SIGKILL it when the runner dies (Linux PR_SET_PDEATHSIG), so a runner killed by the
    device tool leaves no stage running."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass


def _kill_group(proc: subprocess.Popen, grace: float) -> None:
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


# ------------------------------------------------------------------------------------------------ figures


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def collect_figures(results: Path) -> dict[str, Any]:
    """The headline figures from what the stages wrote (JSON only; absent ones are left out): the kernel's
    correctness verdict and error per benchmark row, its time against SDPA / FlexAttention and the fraction of
    copy bandwidth, T(n)/T(1) eager and graphed and the demo prediction (``figures.json``), the offload check."""
    fig: dict[str, Any] = {}
    ks = _read_json(results / "kernel" / "summary.json")
    if ks:
        c = ks.get("correctness") or {}
        fig["kernel"] = {"correctness": c.get("status"), "cases": f"{c.get('cases_passed')}/{c.get('cases_run')} of "
                         f"{c.get('cases_planned')}", "kernel_ok": ks.get("kernel_ok"), "why": ks.get("kernel_why"),
                         "copy_gb_per_s": (ks.get("copy_bandwidth") or {}).get("gb_per_s")}
        rows = ((ks.get("bench") or {}).get("rows")) or []
        fig["kernel"]["rows"] = [
            {"n": r.get("n"), "L": r.get("L"), "rel_err": r.get("ours_rel_err"),
             "us": r.get("ours", {}).get("ms") and r["ours"]["ms"] * 1e3,
             "sdpa_us": r.get("sdpa_best_ms") and r["sdpa_best_ms"] * 1e3,
             "flex_us": r.get("flex", {}).get("ms") and r["flex"]["ms"] * 1e3,
             "x_sdpa": r.get("speedup_vs_sdpa"), "x_flex": r.get("speedup_vs_flex"),
             "copy_fraction": r.get("copy_fraction"), "error": r.get("error")} for r in rows]
        fig["kernel"]["goals"] = ks.get("goals")
    f = _read_json(results / "figures.json")
    if f:
        fig["profiles"] = f.get("profiles")
        fig["predictions"] = f.get("predictions")
    o = _read_json(results / "offload" / "offload.json")
    if o:
        fig["offload"] = {"T_ms": o.get("T_ms"), "decode": o.get("decode"),
                          "attention": (o.get("offload") or {}).get("attention")}
    return fig


# ------------------------------------------------------------------------------------------------ the plan


def kernel_summary(run: Run) -> dict | None:
    return _read_json(run.results / "kernel" / "summary.json")


def kernel_ok(run: Run) -> bool:
    """Whether the profiles ask for the kernel: it built, and gpu_check.py's verdict (or, when its stage was cut
    short after the sweep, a sweep with no failure) says it computes what the reference does."""
    if run.kernel_disabled or run.dry_run:
        return False
    ks = kernel_summary(run)
    if not ks:
        return False
    if "kernel_ok" in ks:
        return bool(ks["kernel_ok"])
    c = ks.get("correctness") or {}
    return c.get("status") in ("PASS", "INCOMPLETE") and c.get("cases_run", 0) > 0


def _after_build(run: Run) -> None:
    """After a failed, stopped or skipped build (or no usable CUDA_HOME), disable the kernel for every later stage
    (``TREEOPT_DISABLE_CUDA_KERNEL=1``: no stage rebuilds it or waits on torch's build lock) and say so once."""
    build = next((s for s in run.stages if s.name == "build"), None)
    if build is not None and build.status != "ok" and not run.dry_run and not run.kernel_disabled:
        run.kernel_disabled = f"the kernel build {build.status} ({build.note}); later stages run the torch reference"
    if run.kernel_disabled and run.env.get("TREEOPT_DISABLE_CUDA_KERNEL") != "1":
        run.env["TREEOPT_DISABLE_CUDA_KERNEL"] = "1"
        run.log(f"[runner] kernel disabled for the later stages: {run.kernel_disabled}")


def _profile_argv(kind: str, graphs: bool) -> Callable[[float, Run], list[str]]:
    def argv(cap: float, run: Run) -> list[str]:
        out = run.results / "profiles" / f"{kind}-{'graphs' if graphs else 'eager'}.yaml"
        cmd = [run.python, "-m", "sequoia_opt", "profile", "latency", "--random-weights"]
        if run.dry_run:  # CPU, one thread, tiny grids; the demo stage reads the bundled draft's config.json
            arch = ["--arch", "tiny", "--draft-arch", "tiny"] if kind == "7b" else \
                ["--arch", DEMO_DRAFT_CONFIG, "--draft-arch", DEMO_DRAFT_CONFIG]
            cmd += arch + ["--device", "cpu", "--threads", "1", "--context", "32", "--max-tokens", "4",
                           "--max-draft-tokens", "2", "--rounds", "1", "--max-repeats", "3"]
        else:
            arch = ["--arch", "llama-2-7b", "--draft-arch", "llama-68m"] if kind == "7b" else \
                ["--arch", "smollm2-135m", "--draft-arch", DEMO_DRAFT_CONFIG]
            rounds, repeats = ("2", "20") if cap >= 60 else ("1", "10")
            # contexts: 1920 + 64 draft tokens fit JackFram-68M's and the bundled draft's 2048 positions
            cmd += arch + ["--device", "cuda", "--dtype", "bfloat16", "--context", GPU_CONTEXTS, "--max-tokens",
                           str(GPU_MAX_TOKENS), "--max-draft-tokens", str(GPU_MAX_DRAFT_TOKENS), "--rounds", rounds,
                           "--max-repeats", repeats]
            # the kernel when it passed its check (the bundled draft's head_dim 32 it cannot take: auto, recorded)
            ok = kernel_ok(run)
            cmd += ["--backend", ("cuda" if kind == "7b" else "auto") if ok else "torch"]
        return cmd + (["--cuda-graphs"] if graphs else []) + ["--output", str(out)]

    return argv


def plan(dry_run: bool) -> list[Stage]:
    """The stages in order (module docstring), with their caps."""
    refused = {0: "ok", 2: "refused (expected on a CPU)"} if dry_run else {0: "ok"}

    def kernel_skip(run: Run) -> str | None:
        _after_build(run)
        return run.kernel_disabled

    def after_build(run: Run) -> str | None:
        _after_build(run)
        return None

    dry = ["--dry-run"] if dry_run else []

    return [
        Stage("preflight", "toolchain and packages; CUDA_HOME exported", 60, 5, fn=preflight),
        Stage("engines", "SGLang / vLLM T(n) where installed", 30, 5,
              argv=lambda cap, run: [run.python, "benchmarks/gpu_engines.py", "--out", run.results / "engines"]),
        Stage("build", "the tree-attention kernel for this GPU (cached in $TORCH_EXTENSIONS_DIR)", 240, 60,
              argv=lambda cap, run: [run.python, "benchmarks/gpu_check.py", "--steps", "build", "--out",
                                     run.results / "kernel"] + dry,
              skip=lambda run: run.kernel_disabled),
        Stage("kernel", "correctness against float64, error per benchmark row, time against SDPA and FlexAttention",
              170, 45, rc_status={0: "ok", 3: "incomplete"}, skip=kernel_skip,
              argv=lambda cap, run: [run.python, "benchmarks/gpu_check.py", "--steps", "correctness,bench", "--out",
                                     run.results / "kernel", "--budget-s", f"{max(20.0, cap - 20.0):.0f}"] + dry
              + (["--reps", "3"] if dry_run else [])),
        Stage("profile-7b-eager", "T(n), c(w): Llama-2-7B / JackFram-68M shapes, random weights, bf16, eager", 100, 40,
              reserve_s=40, argv=_profile_argv("7b", False), skip=after_build),
        Stage("profile-7b-graphs", "the same, forwards replayed from CUDA graphs", 100, 40, reserve_s=40,
              argv=_profile_argv("7b", True), rc_status=refused, skip=after_build),
        Stage("profile-demo-eager", "T(n), c(w): the demo pair's shapes (SmolLM2-135M, bundled draft), eager", 60, 25,
              argv=_profile_argv("demo", False), skip=after_build),
        Stage("profile-demo-graphs", "the same, forwards replayed from CUDA graphs", 60, 25,
              argv=_profile_argv("demo", True), rc_status=refused, skip=after_build),
        Stage("figures", "T(n)/T(1) eager and graphed; the demo pair's GPU speedup PREDICTED", 30, 8, reserve_s=8,
              argv=lambda cap, run: [run.python, "benchmarks/gpu_figures.py", "--results", run.results]),
        Stage("offload", "T(n) of the 7B shape streamed from pinned host memory, solved tree, greedy check", 120, 45,
              argv=lambda cap, run: [run.python, "benchmarks/offload_gpu.py", "--out-dir", run.results / "offload",
                                     "--backend", "cuda" if kernel_ok(run) else ("auto" if dry_run else "torch")]
              + dry, skip=after_build),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="every stage on a CPU, tiny sizes, gguf hidden")
    ap.add_argument("--stages", help="comma-separated subset of the stages, in the plan's order (default: all)")
    ap.add_argument("--results-dir", type=Path,
                    help="where the stages write (default: results/gpu/<UTC time>; a temporary folder with --dry-run)")
    ap.add_argument("--deadline-s", type=float, default=DEADLINE_S, help=f"the whole run (default {DEADLINE_S:.0f})")
    args = ap.parse_args(argv)
    stages = plan(args.dry_run)
    if args.stages:
        names = [s.strip() for s in args.stages.split(",") if s.strip()]
        unknown = [n for n in names if n not in {s.name for s in stages}]
        if unknown:
            ap.error(f"unknown stage(s) {unknown}; the stages: {', '.join(s.name for s in stages)}")
        stages = [s for s in stages if s.name in names]
    if args.deadline_s <= 0 or args.deadline_s > DEADLINE_S:
        ap.error(f"--deadline-s must be in (0, {DEADLINE_S:.0f}]")
    # new_run_id's format (to the millisecond, a random suffix: two runs never share a folder), spelled out: the
    # runner imports nothing of the package, whose imports its preflight stage is there to check
    now = datetime.now(timezone.utc)
    stamp = f"{now.strftime('%Y%m%dT%H%M%S')}.{now.microsecond // 1000:03d}Z-{os.urandom(3).hex()}"
    results = args.results_dir or (Path(tempfile.mkdtemp(prefix=f"treeopt-gpu-dry-run-{stamp}-")) if args.dry_run
                                   else REPO / "results" / "gpu" / stamp)
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    run = Run(results.resolve(), out, args.dry_run, os.environ.get("PYTHON", sys.executable), args.deadline_s)

    def on_term(signum, frame):  # the device tool's stop: end the stage now, keep what was measured
        if run.current is not None:
            _kill_group(run.current, grace=0.5)
        for s in run.stages:
            if s.status == "running":
                s.status, s.note = "interrupted", f"signal {signum}"
        run.log(f"[runner] stopped by signal {signum} at {run.elapsed():.0f} s")
        run.refresh()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    return run_plan(run, stages)


def run_plan(run: Run, stages: list[Stage]) -> int:
    """Run ``stages`` in order under ``run``'s deadline, then print the table and write $OUT a last time.
    Returns the exit status (module docstring)."""
    run.log(f"== gpu_check.sh {'--dry-run ' if run.dry_run else ''}{run.started}: {len(stages)} stages, deadline "
            f"{run.deadline_s:.0f} s, results in {run.results}, $OUT {run.out or '(unset)'}")
    for i, st in enumerate(stages):
        run.run_stage(st, stages[i + 1:])
    run.log("")
    run.log(f"== {'stage':<20} {'status':<28} {'s':>6} {'cap':>6}  note")
    for s in run.stages:
        run.log(f"   {s.name:<20} {s.status:<28} {s.seconds:>6.1f} {s.cap_s or 0:>6.0f}  {s.note}")
    run.log(f"== done in {run.elapsed():.0f} s of {run.deadline_s:.0f}; exit {run.exit_code()}; "
            f"$OUT: {', '.join(OUT_FILES) if run.out else '(unset)'}")
    run.refresh()
    return run.exit_code()


if __name__ == "__main__":
    sys.exit(main())
