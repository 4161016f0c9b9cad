"""Test-session settings.

Most tests run tiny models, where one CPU thread is faster than several (OpenMP start-up and spinning cost
more than the matmuls), and CI machines are small and shared; so the whole session runs single-threaded.
"""

import torch

torch.set_num_threads(1)
