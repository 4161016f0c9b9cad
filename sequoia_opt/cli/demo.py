"""``treeopt demo``: the main job on the bundled demo pair (profile, solve, run, plot) on this device, and every
shipped drafter's best tree side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from typing_extensions import Annotated

from ..errors import TreeoptError
from .common import (BackendOpt, DeviceOpt, DtypeOpt, JsonOpt, WeightsOpt, _check_results_dir, _check_run_options,
                     app, handle_errors, note, progress_bar)
from .render import render

@app.command("demo")
@handle_errors
def demo_cmd(
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    weights: WeightsOpt = "float32",
    max_new_tokens: Annotated[Optional[int], typer.Option(
        "--max-new-tokens", help="Tokens per evaluation prompt (default 64; 16 with --quick).")] = None,
    num_prompts: Annotated[Optional[int], typer.Option(
        "--num-prompts", help="Evaluation prompts, held out from profiling (default 6; 2 with --quick).")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Smaller profiles and runs (a smoke test of the pipeline).")] = False,
    out_dir: Annotated[Path, typer.Option("--out-dir", help="Where profiles, the tree, results and plots go.")] = Path("results/demo"),
    self_layers: Annotated[Optional[str], typer.Option(
        "--self-layers", help="Also compare the self layer-skip drafter (self:L): 'auto' (3 L spread over the "
        "target's layers) or L values, comma-separated (6,12,24). Off by default: on the demo pair no L pays and "
        "the sweep takes minutes.")] = None,
    backend: BackendOpt = "auto",
    as_json: JsonOpt = False,
) -> None:
    """The main job on the bundled demo pair: profile this device and the pair, solve, run on held-out
    prompts, and print predicted against measured figures; every shipped drafter (the draft model, prompt
    lookup, the EAGLE-3 head; self:L with its best L with --self-layers) with its own best tree, side by side
    against one plain baseline, on code and on chat prompts."""
    from ..jobs.demo import DemoSettings, run_demo
    from ..model.tuned_linear import check_precision
    from ..jobs.load import parse_device

    check_precision(weights)
    for name, value in (("--max-new-tokens", max_new_tokens), ("--num-prompts", num_prompts)):
        if value is not None and value < 1:
            raise TreeoptError(f"{name} must be at least 1, got {value}")
    _check_run_options(backend, parse_device(device))
    _check_results_dir(out_dir, "--out-dir")
    settings = DemoSettings.quick() if quick else DemoSettings()
    if self_layers is not None:
        text = self_layers.strip().lower()
        if text != "auto":
            try:
                settings.self_layers = tuple(int(x) for x in text.split(","))
            except ValueError:
                raise TreeoptError(f"--self-layers takes 'auto' or L values like 6,12,24, got {self_layers!r}") from None
        else:
            settings.self_layers = "auto"
    with progress_bar() as progress:
        result = run_demo(device=device, dtype=dtype, max_new_tokens=max_new_tokens, num_prompts=num_prompts,
                          out_dir=out_dir, backend=backend, progress=progress, settings=settings,
                          weights=weights, log=note)
    report = result.report
    render(report, as_json)
    if result.greedy_ok is False:
        raise typer.Exit(1)

