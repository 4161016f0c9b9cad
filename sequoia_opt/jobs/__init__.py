"""The jobs the CLI runs, as library functions: load a model pair (``load.py``), run trees and policies against plain
decoding (``run.py``), compare drafters (``compare.py``), plan and run grafted trees (``graft.py``), the demo
(``demo.py``). ``cli/`` is a thin layer over these; scripts and notebooks call them directly.
"""
