"""Build benchmarks/data/code-heldout.jsonl: more Python code prompts of the demo sets' kind, from standard-library
folders that no training data of the project ever read, for benchmarks/prediction_splits.py's larger splits.

The shipped ``profile.jsonl`` and ``eval.jsonl`` hold 64 prompts: code prefixes of Python standard-library files
(``sequoia_opt.distill.data.build_prompts``, one prefix of 64-200 target tokens per file). The draft model and the
EAGLE-3 head train on the other standard-library files, but never on the folders in
``sequoia_opt.distill.data.EXCLUDED_DIRS``. Of those, ``idlelib``, ``lib2to3``, ``turtledemo`` and ``ensurepip``
hold ordinary library code (the rest are tests, codec tables, pydoc's data or build configuration); this script
makes one prompt per file of theirs (at least 2,000 bytes, no test folder or test file), the same way and with the
same seed as the shipped sets. The prompts are disjoint from the shipped sets and from every training file.

    python benchmarks/make_code_prompts.py     # -> benchmarks/data/code-heldout.jsonl (Python 3.11's Lib: 99 prompts)

The shipped file was made with Python 3.11.7 (3.13 has no ``lib2to3``: another Python makes another set, so
give it ``--out``).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OUT = Path(__file__).parent / "data" / "code-heldout.jsonl"
#: The library folders that :data:`sequoia_opt.distill.data.EXCLUDED_DIRS` keeps out of training and that hold
#: ordinary library code.
HELD_OUT_DIRS = ("ensurepip", "idlelib", "lib2to3", "turtledemo")


def held_out_files(stdlib: Path, *, min_bytes: int = 2000) -> list[str]:
    """Sorted ``.py`` paths (relative to ``stdlib``, POSIX separators) under :data:`HELD_OUT_DIRS` of at least
    ``min_bytes``, skipping any path with ``test`` in it (``idle_test``, ``lib2to3/tests``)."""
    out = []
    for d in HELD_OUT_DIRS:
        for p in sorted((stdlib / d).rglob("*.py")):
            rel = p.relative_to(stdlib).as_posix()
            if "test" not in rel and p.stat().st_size >= min_bytes:
                out.append(rel)
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT, help=f"the JSONL written (default {OUT.relative_to(ROOT)}; "
                    "another Python's library makes another set: write it elsewhere)")
    ap.add_argument("--stdlib", type=Path, default=None, help="the standard library folder (default this Python's)")
    args = ap.parse_args(argv)

    from sequoia_opt.distill.cli import _load_target
    from sequoia_opt.distill.data import EXCLUDED_DIRS, build_prompts, default_stdlib_root, write_jsonl

    assert set(HELD_OUT_DIRS) <= EXCLUDED_DIRS, "a held-out folder must be one that training skips"
    stdlib = args.stdlib or default_stdlib_root()
    files = held_out_files(stdlib)
    if not files:
        print(f"error: no file of {', '.join(HELD_OUT_DIRS)} under {stdlib}", file=sys.stderr)
        return 2
    _, _, tok = _load_target(None)
    prefix = f"python{sys.version_info.major}.{sys.version_info.minor}"
    rows = build_prompts(stdlib, files, tok.encode, seed=0, n=len(files), source_prefix=prefix)
    write_jsonl(args.out, rows)
    print(f"wrote {len(rows)} prompts from {len(files)} files to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
