"""The loss curve: ``loss_curve.csv`` and ``loss_curve.png`` (train / held-out KL and agreement against step),
read back and continued across training stages (runs started with ``--init-from``)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Sequence

from .._io import atomic_write_text

CSV_FIELDS = ["step", "tokens", "lr", "train_kl", "train_ce", "train_agreement", "cont_kl", "cont_agreement",
              "val_kl", "val_agreement", "val_greedy_agreement", "elapsed_s", "stage"]


def read_curve(path: Path) -> list[dict]:
    """The rows of a ``loss_curve.csv`` written by :func:`write_curve`: numbers parsed (``step`` and ``tokens``
    as int), empty cells kept as ``""``, ``stage`` 1 where the file has no such column.

    Raises:
        OSError: the file cannot be read.
        ValueError: a cell is neither empty nor a number.
    """
    rows = []
    for raw in csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"), newline="")):
        row: dict = {}
        for k in CSV_FIELDS:
            v = raw.get(k) or ""
            row[k] = "" if v == "" else (int(float(v)) if k in ("step", "tokens", "stage") else float(v))
        row["stage"] = row["stage"] or 1
        rows.append(row)
    return rows


def continue_curve(earlier: list[dict], rows: list[dict]) -> list[dict]:
    """One curve over training stages: ``rows`` of a run started with ``--init-from`` appended after the
    ``earlier`` stages' rows, with step, tokens and elapsed seconds counted on from the earlier stages' last
    row and ``stage`` one past their last stage (1 when there are none)."""
    if not earlier:
        return [dict(r, stage=1) for r in rows]
    last = earlier[-1]
    stage = int(last["stage"] or 1) + 1
    return list(earlier) + [dict(r, step=r["step"] + last["step"], tokens=r["tokens"] + last["tokens"],
                                 elapsed_s=round(r["elapsed_s"] + last["elapsed_s"], 2), stage=stage)
                            for r in rows]


def _curve_panel(ax, rows: list[dict], train: Sequence[tuple[str, str, float]],
                 val: Sequence[tuple[str, str]], ylabel: str) -> None:
    """One panel of the loss curve: train series ``(key, label, alpha)`` as lines and held-out series
    ``(key, label)`` as points, each over the logged steps where it was measured (a series a stage did not
    log is left out there)."""
    def points(key: str) -> list[tuple[int, float]]:
        return [(r["step"], r[key]) for r in rows if r.get(key, "") != ""]

    for key, label, alpha in train:
        pts = points(key)
        if pts:
            ax.plot(*zip(*pts), label=label, alpha=alpha)
    for key, label in val:
        pts = points(key)
        if pts:
            ax.plot(*zip(*pts), "o-", label=label)
    for prev, r in zip(rows, rows[1:]):
        if r.get("stage", 1) != prev.get("stage", 1):  # a run continued with --init-from starts here
            ax.axvline(prev["step"], color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.legend()


def write_curve(rows: list[dict], out: Path) -> None:
    """``loss_curve.csv`` and ``loss_curve.png`` (train / validation KL and agreement against step), both
    written atomically."""
    from ..plots import _new_figure, _save

    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS)
    w.writeheader()
    for r in rows:
        w.writerow({k: r.get(k, "") for k in CSV_FIELDS})
    atomic_write_text(out / "loss_curve.csv", buf.getvalue())

    fig = _new_figure(10, 4)
    a, b = fig.subplots(1, 2)
    _curve_panel(a, rows, [("train_kl", "train top-k KL", 1.0), ("train_ce", "train next-token CE", 0.6),
                           ("cont_kl", "teacher-continuation top-k KL", 0.8)],
                 [("val_kl", "held-out top-k KL")], "nats / token")
    _curve_panel(b, rows, [("train_agreement", "train top-1 agreement", 1.0),
                           ("cont_agreement", "teacher-continuation top-1 agreement", 0.8)],
                 [("val_agreement", "held-out top-1 agreement (teacher-forced)"),
                  ("val_greedy_agreement", "greedy agreement, eval prompts")], "fraction")
    fig.suptitle("treeopt draft distilled from SmolLM2-135M-Instruct")
    _save(fig, out / "loss_curve.png")
