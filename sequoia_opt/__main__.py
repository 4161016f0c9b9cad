"""``python -m sequoia_opt`` is the ``treeopt`` command."""

from .cli import app

app(prog_name="treeopt")
