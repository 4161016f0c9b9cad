"""What a command shows, as data: built by the library (e.g. :mod:`sequoia_opt.jobs.demo`), rendered by the CLI."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .tree import Tree


@dataclass
class Report:
    """What a command shows: a title, summary key/values, tables, notes, warnings and an optional tree.

    :func:`render` prints it as rich tables or as one JSON document (``data``), from the same content.
    """

    title: str
    summary: dict[str, Any] = field(default_factory=dict)
    tables: list[tuple[str, list[str], list[list[Any]]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    tree: Tree | None = None
    acceptance: Any = None
    data: dict[str, Any] = field(default_factory=dict)
