"""Test-session settings.

Most tests run tiny models, where one CPU thread is faster than several (OpenMP start-up and spinning cost
more than the matmuls), and CI machines are small and shared; so the whole session runs single-threaded.
"""

import torch

torch.set_num_threads(1)

import pytest


@pytest.fixture(autouse=True, scope="session")
def _linear_tuning_cache(tmp_path_factory):
    """Models loaded through the pipeline tune their CPU linears (sequoia_opt.model.tuned_linear) and cache
    the plan; the tests keep that cache in a session folder, never in the user's ~/.cache."""
    import os

    old = os.environ.get("TREEOPT_CACHE_DIR")
    os.environ["TREEOPT_CACHE_DIR"] = str(tmp_path_factory.mktemp("treeopt-cache"))
    yield
    if old is None:
        os.environ.pop("TREEOPT_CACHE_DIR", None)
    else:
        os.environ["TREEOPT_CACHE_DIR"] = old
