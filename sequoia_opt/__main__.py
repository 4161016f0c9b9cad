"""``python -m sequoia_opt`` is the ``treeopt`` command."""

from ._entry import main

main()
