"""Write the editing workload of benchmarks/schedules.py: requests to rewrite a given function with a small
change, whose answers copy long runs of the prompt (where n-gram drafting accepts far more than on fresh code).

Each prompt shows a function, states the edit, and opens the edited function; a model continues by copying the
body with the edit applied. Twelve functions (written for this set), two edits each (a rename, a docstring
added); the first four functions' prompts are the profile split (acceptance is measured on them), the other
eight functions' the eval split (the benchmark decodes them), so no function is in both.

    python benchmarks/make_edit_prompts.py      # -> benchmarks/data/edit-profile.jsonl, edit-eval.jsonl
"""

from __future__ import annotations

import json
from pathlib import Path

FUNCTIONS = [
    ("running_mean", "average", '''def running_mean(values, window):
    out = []
    total = 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out
'''),
    ("parse_pairs", "read_pairs", '''def parse_pairs(text, sep="="):
    result = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition(sep)
        result[key.strip()] = value.strip()
    return result
'''),
    ("chunked", "batches", '''def chunked(items, size):
    if size < 1:
        raise ValueError("size must be at least 1")
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
'''),
    ("merge_sorted", "merge_lists", '''def merge_sorted(left, right):
    i = j = 0
    merged = []
    while i < len(left) and j < len(right):
        if left[i] <= right[j]:
            merged.append(left[i])
            i += 1
        else:
            merged.append(right[j])
            j += 1
    merged.extend(left[i:])
    merged.extend(right[j:])
    return merged
'''),
    ("count_words", "word_counts", '''def count_words(text):
    counts = {}
    for word in text.lower().split():
        word = word.strip(".,;:!?")
        if word:
            counts[word] = counts.get(word, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
'''),
    ("clamp_all", "clip_values", '''def clamp_all(values, low, high):
    if low > high:
        raise ValueError("low must not exceed high")
    clamped = []
    for v in values:
        if v < low:
            clamped.append(low)
        elif v > high:
            clamped.append(high)
        else:
            clamped.append(v)
    return clamped
'''),
    ("find_duplicates", "repeated_items", '''def find_duplicates(items):
    seen = set()
    repeated = []
    for item in items:
        if item in seen and item not in repeated:
            repeated.append(item)
        seen.add(item)
    return repeated
'''),
    ("flatten", "flatten_nested", '''def flatten(nested):
    flat = []
    stack = [iter(nested)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, (list, tuple)):
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat
'''),
    ("binary_search", "bisect_index", '''def binary_search(sorted_items, target):
    low, high = 0, len(sorted_items) - 1
    while low <= high:
        mid = (low + high) // 2
        if sorted_items[mid] == target:
            return mid
        if sorted_items[mid] < target:
            low = mid + 1
        else:
            high = mid - 1
    return -1
'''),
    ("format_table", "render_rows", '''def format_table(rows, headers):
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(str(cell)))
    lines = [" | ".join(h.ljust(w) for h, w in zip(headers, widths))]
    lines.append("-+-".join("-" * w for w in widths))
    for row in rows:
        lines.append(" | ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    return "\\n".join(lines)
'''),
    ("retry_call", "call_with_retries", '''def retry_call(func, attempts=3, delay=0.5):
    import time

    last_error = None
    for attempt in range(attempts):
        try:
            return func()
        except Exception as err:
            last_error = err
            time.sleep(delay * (2 ** attempt))
    raise last_error
'''),
    ("normalize_path", "clean_path", '''def normalize_path(path):
    parts = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
    return "/" + "/".join(parts)
'''),
]


def prompts_for(name: str, new_name: str, code: str) -> list[dict]:
    """The two editing requests of one function: a rename, and a docstring added."""
    sig = code.split("\n", 1)[0]
    renamed = sig.replace(f"def {name}(", f"def {new_name}(", 1)
    return [
        {"prompt": f"# Before:\n{code}\n# After (the same function, renamed from {name} to {new_name}; nothing "
                   f"else changes):\n{renamed}\n", "source": f"edit:{name}:rename"},
        {"prompt": f"# Before:\n{code}\n# After (the same code with a one-line docstring added):\n{sig}\n"
                   f'    """{name.replace("_", " ").capitalize()}."""\n', "source": f"edit:{name}:docstring"},
    ]


def main() -> None:
    out = Path(__file__).parent / "data"
    out.mkdir(exist_ok=True)
    for split, funcs in (("profile", FUNCTIONS[:4]), ("eval", FUNCTIONS[4:])):
        rows = [p for f in funcs for p in prompts_for(*f)]
        (out / f"edit-{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"{out / f'edit-{split}.jsonl'}: {len(rows)} prompts")


if __name__ == "__main__":
    main()
