"""Write the editing workload of benchmarks/schedules.py: requests to rewrite a given function with a small
change, whose answers copy long runs of the prompt (where n-gram drafting accepts far more than on fresh code).

Each prompt shows a function, states the edit, and opens the edited function; a model continues by copying the
body with the edit applied. Twenty functions (written for this set), two edits each (a rename, a docstring
added); the first four of ``FUNCTIONS`` and the eight of ``PROFILE_ONLY`` are the profile split (24 prompts,
acceptance is measured on them), the other eight functions the eval split (16 prompts, the benchmark decodes
them), so no function is in both.

    python benchmarks/make_edit_prompts.py      # -> benchmarks/data/edit-profile.jsonl, edit-eval.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sequoia_opt._io import atomic_write_text  # noqa: E402

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

#: more functions for the profile split only (written for this set, none like an eval function): with the first
#: four alone the profile was 8 prompts, and the model copies some functions from the answer's first token and
#: opens others with a preamble, so 8 prompts placed the rate 13-44 % off the eval requests
PROFILE_ONLY = [
    ("dedupe_keep_order", "unique_in_order", '''def dedupe_keep_order(items):
    seen = set()
    unique = []
    for item in items:
        if item not in seen:
            seen.add(item)
            unique.append(item)
    return unique
'''),
    ("transpose", "swap_axes", '''def transpose(matrix):
    if not matrix:
        return []
    rows, cols = len(matrix), len(matrix[0])
    result = [[None] * rows for _ in range(cols)]
    for i in range(rows):
        for j in range(cols):
            result[j][i] = matrix[i][j]
    return result
'''),
    ("group_by_key", "bucket_items", '''def group_by_key(records, key):
    groups = {}
    for record in records:
        value = record.get(key)
        if value is None:
            continue
        groups.setdefault(value, []).append(record)
    return groups
'''),
    ("is_palindrome", "reads_same_backwards", '''def is_palindrome(text):
    letters = [c.lower() for c in text if c.isalnum()]
    left, right = 0, len(letters) - 1
    while left < right:
        if letters[left] != letters[right]:
            return False
        left += 1
        right -= 1
    return True
'''),
    ("pairwise_sums", "adjacent_totals", '''def pairwise_sums(numbers):
    if len(numbers) < 2:
        return []
    sums = []
    previous = numbers[0]
    for current in numbers[1:]:
        sums.append(previous + current)
        previous = current
    return sums
'''),
    ("split_words", "tokenize_line", '''def split_words(line, keep_case=False):
    words = []
    current = []
    for ch in line:
        if ch.isalnum() or ch == "_":
            current.append(ch if keep_case else ch.lower())
        elif current:
            words.append("".join(current))
            current = []
    if current:
        words.append("".join(current))
    return words
'''),
    ("moving_max", "window_maximum", '''def moving_max(values, window):
    if window < 1:
        raise ValueError("window must be positive")
    result = []
    for end in range(window, len(values) + 1):
        best = values[end - window]
        for v in values[end - window + 1:end]:
            if v > best:
                best = v
        result.append(best)
    return result
'''),
    ("invert_mapping", "reverse_dict", '''def invert_mapping(mapping):
    inverted = {}
    for key, value in mapping.items():
        if value in inverted:
            raise ValueError(f"duplicate value: {value!r}")
        inverted[value] = key
    return inverted
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
    for split, funcs in (("profile", FUNCTIONS[:4] + PROFILE_ONLY), ("eval", FUNCTIONS[4:])):
        rows = [p for f in funcs for p in prompts_for(*f)]
        atomic_write_text(out / f"edit-{split}.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        print(f"{out / f'edit-{split}.jsonl'}: {len(rows)} prompts")


if __name__ == "__main__":
    main()
