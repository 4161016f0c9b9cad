"""``treeopt profile latency --batch 1,2,4,...`` (T(b, n) per batch size, :mod:`sequoia_opt.profiling.batch`)
and ``treeopt profile latency --offload`` (T(n) of a target streamed from pinned host memory, CUDA only,
:mod:`sequoia_opt.profiling.offload`): the two branches of ``profile latency`` that write other profiles."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from ..errors import TreeoptError
from ..report import Report
from .common import _check_writable, progress_bar
from .render import render


def check_batch_options(batch: Optional[str], offload: bool, device: torch.device,
                        draft: Optional[str]) -> list[int] | None:
    """Refuse bad ``--batch`` / ``--offload`` combinations before any model loads (one line, exit 2).
    Returns the batch sizes (None without ``--batch``)."""
    if batch is not None and offload:
        raise TreeoptError("--batch and --offload write different profiles: give one")
    if offload and device.type != "cuda":
        raise TreeoptError(f"--offload times weights streamed from pinned host memory to a GPU; device {device} is "
                           "not CUDA (run it on a machine with a GPU: --device cuda)")
    if offload and not torch.cuda.is_available():
        raise TreeoptError("--offload needs CUDA, but torch sees no CUDA device here")
    if batch is None:
        return None
    from ..jobs.load import parse_drafter_spec
    from ..profiles.batch import parse_batches

    batches = parse_batches(batch)
    entry = parse_drafter_spec(draft).entry if draft is not None else None
    if entry is not None and (not entry.loads_model or entry.reads_features):  # a head's c(b, w) would read 0 ms
        raise TreeoptError(f"--batch profiles the batched decoder, which drafts with a draft model; --draft {draft} "
                           "is not one (pass a draft checkpoint, or none for the bundled draft)")
    return batches


def profile_latency_batch_or_offload(batches, offload, *, tmodel, draft, tname, dname, dev, dt, grid, dgrid, contexts,
                                     rounds, paired, repeats, random_weights, base, output: Optional[Path],
                                     as_json: bool, loop: bool = False, weights: str = "float32") -> None:
    """Time and write the batch or the offload profile, then print its report (``loop``: with a draft model, each
    batch size's curve also times the decoding loop's own step at b rows; ``weights``: the weight precision,
    named with the dtype in the default file name (:func:`~sequoia_opt.jobs.load.precision_suffix`) and the id,
    as ``profile latency`` names its curve, so that a bfloat16 or int8 curve never lands where tune reads its
    float32 one)."""
    from ..jobs.load import drafter_slug, precision_suffix
    from ..device import device_slug
    from ..profiling.latency import method_text

    slug = device_slug(dev)
    dpart = f"__{drafter_slug(dname)}" if dname is not None else ""
    precision = precision_suffix(dt, weights)
    pid = f"{slug}_{base}{dpart}_{dt}".replace("torch.", "")
    if str(weights) != "float32":  # the dtype is in the id already; int8 / int4 weights are not
        pid += f"_{weights}"
    draft_model = draft if isinstance(draft, torch.nn.Module) else None
    timing = dict(min_repeats=min(5, repeats), max_repeats=repeats)
    report = Report(title="treeopt profile latency " + ("--offload" if offload else "--batch"))
    out = output or Path("profiles") / slug / (f"{base}{dpart}{precision}-"
                                               f"{'offload-latency' if offload else 'latency-batch'}.yaml")
    _check_writable(out)  # the default path too, before the minutes of timing
    if offload:
        from ..profiles import save_latency
        from ..profiling.offload import profile_offload

        if draft_model is not None:
            draft_model.to(dev)  # the draft stays resident on the device
        with progress_bar() as progress:
            curve, info = profile_offload(tmodel, draft_model, grid, dgrid, contexts[0], device=dev, target_name=tname,
                                          draft_name=dname, profile_id=f"{pid}_offload", dtype=dt, progress=progress,
                                          rounds=rounds, **timing)
        save_latency(out, curve)
        report.summary = {"device": curve.device.get("name"), "host->device (GB/s)": info["h2d_gbps"],
                          "layer bytes": info["layer_bytes"], "layers streamed": info["n_layers"],
                          "written": str(out)}
        report.tables.append(("offloaded target forward T(n)", ["tokens", "ms", "measured ms", "T(n)/T(1)"],
                              [[n, curve.target_ms(n), info["measured_ms"].get(n), curve.target_ms(n) / curve.target_ms(1)]
                               for n in grid]))
        report.data = {"profile": curve.to_dict(), "offload": info, "output": str(out)}
        render(report, as_json)
        return
    from ..profiles.batch import save_batch_latency
    from ..profiling.batch import profile_batches

    with progress_bar() as progress:
        prof = profile_batches(tmodel, draft_model, batches, grid, dgrid, contexts, target_name=tname,
                               draft_name=dname, profile_id=f"{pid}_batch", device=dev, dtype=dt,
                               random_weights=random_weights, method=method_text(rounds, paired, grid),
                               progress=progress, rounds=rounds, paired=paired,
                               loop="static" if loop and draft_model is not None else None, **timing)
    save_batch_latency(out, prof)
    ctx = contexts[0]
    rows = []
    for b in prof.batches:
        c = prof.curve(b)
        for n in grid:
            rows.append([b, n, b * n, c.target_ms(n, ctx), c.target_ms(n, ctx) / c.target_ms(1, ctx),
                         c.draft_ms(min(n, c.max_draft_tokens(ctx)), ctx) if draft_model is not None else None])
    report.summary = {"device": prof.device.get("name"), "dtype": str(dt).removeprefix("torch."),
                      "threads": torch.get_num_threads(), "target": tname, "draft": dname,
                      "batch sizes": ",".join(map(str, prof.batches)), "context (tokens)": ctx,
                      "step overhead per batch (ms)": {b: round(prof.curve(b).step_overhead_ms, 3) for b in prof.batches},
                      "written": str(out)}
    report.tables.append((f"T(b, n) at context {ctx} (n tokens per sequence)",
                          ["batch", "tokens/seq", "tokens fed", "target ms", "T(b,n)/T(b,1)", "draft ms c(b, n)"], rows))
    if draft_model is None:
        report.warnings.append("no draft profiled: draft cost recorded as 0 ms")
    if 1 not in prof.batches:  # measured, then refused where it is read: said while the timing is fresh
        report.warnings.append(f"batch size 1 is not in --batch {','.join(map(str, prof.batches))}: a plan starts "
                               "at batch 1, so solve --batch and tune refuse this profile; add 1 to --batch")
    report.data = {"profile": prof.to_dict(), "output": str(out)}
    render(report, as_json)
