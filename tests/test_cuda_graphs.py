"""The CUDA-graph wrapper of the bundled decoder (sequoia_opt.model.graphs).

On a CPU the graph is replaced by one that re-runs the captured function into the same static output on
replay, which checks everything but the capture itself: the (T, S) whole-cache mask equals the eager prefix +
tree attention, the static buffers are reused, shapes are keyed, eager calls are counted by reason, the LRU
bound, the refusals, and the decoders running unchanged on the wrapper. On CUDA (-m gpu) the real graphs are
compared with eager forwards."""

from __future__ import annotations

import copy

import pytest
import torch

from sequoia_opt.attention import RowPrefix, TreeMask, causal_tree_mask
from sequoia_opt.decoding import AutoregressiveDecoder
from sequoia_opt.drafting import SpeculativeDecoder
from sequoia_opt.model import ModelConfig, Transformer
from sequoia_opt.model.graphs import GraphedTransformer, cuda_graphs, graphs_unsupported_reason
from sequoia_opt.model.offload import offload_layers
from sequoia_opt.tree import Tree


class ReplayGraph:
    """A stand-in for torch.cuda.CUDAGraph on a CPU: replay re-runs the captured function and writes its result
    into the output the capture returned (a real replay writes the same static tensor)."""

    def __init__(self) -> None:
        self.fn = None
        self.out = None
        self.replays = 0

    def capture(self, fn):
        self.fn = fn
        self.out = fn()
        return self.out

    def replay(self) -> None:
        self.out.copy_(self.fn())
        self.replays += 1


def tiny(seed: int = 0, **changes) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig.preset("tiny").with_(**changes)).eval()


def tree_mask(parents: list[int]) -> torch.Tensor:
    n = len(parents)
    dense = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(parents):
        dense[i, i] = True
        if p >= 0:
            dense[i] |= dense[p]
    return dense


def prefill(model: Transformer, cache, prompt: torch.Tensor) -> None:
    idx = torch.arange(len(prompt))
    with torch.inference_mode():
        model(prompt[None], idx, cache=cache, cache_slots=idx, prefix_len=0, tree_mask=causal_tree_mask(len(prompt)))


def verify_call(model, cache, L: int, tokens: torch.Tensor, depth: torch.Tensor, dense: torch.Tensor):
    n = tokens.shape[0]
    slots = torch.arange(L, L + n)
    with torch.inference_mode():
        return model(tokens[None], L + depth, cache=cache, cache_slots=slots, prefix_len=L,
                     tree_mask=TreeMask.from_dense(dense))


@pytest.fixture
def pair():
    model = tiny()
    return model, GraphedTransformer(model, graph_factory=ReplayGraph)


def test_graphed_verify_equals_eager_and_reuses_static_buffers(pair):
    model, g = pair
    parents = [-1, 0, 0, 1, 1, 2, 4]
    dense = tree_mask(parents)
    depth = dense.sum(1) - 1
    prompt = torch.randint(0, 256, (11,), generator=torch.Generator().manual_seed(1))
    ce, cg = model.new_cache(40), g.new_cache(40)
    prefill(model, ce, prompt)
    prefill(model, cg, prompt)
    gen = torch.Generator().manual_seed(2)
    outs, bufs = [], []
    for step in range(3):
        toks = torch.randint(0, 256, (len(parents),), generator=gen)
        ref = verify_call(model, ce, 11, toks, depth, dense)
        got = verify_call(g, cg, 11, toks, depth, dense)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        # the KV the graph wrote at the tree slots is the eager forward's
        torch.testing.assert_close(cg[1].k[:, :, 11:18], ce[1].k[:, :, 11:18], rtol=1e-6, atol=1e-6)
        outs.append(got)
        if g.num_graphs:
            (entry,) = g._graphs.values()
            bufs.append((entry.tokens.data_ptr(), entry.mask.data_ptr(), entry.logits.data_ptr()))
            assert got.data_ptr() != entry.logits.data_ptr()  # a copy: the next replay overwrites the static one
    assert g.stats.eager == {"first sighting": 1}  # step 0 eager, captured at step 1, replayed at step 2
    assert g.stats.captures == 1 and g.stats.replays == 2
    assert len(bufs) == 2 and bufs[0] == bufs[1]  # the same static buffers serve every replay
    assert not torch.equal(outs[1], outs[2])  # ... with this call's inputs, not the captured ones


def test_draft_level_shape_and_keys(pair):
    """A draft level (T queries, the last T of m tree slots) replays correctly; every part of the key counts."""
    model, g = pair
    prompt = torch.arange(3, 12)
    ce, cg = model.new_cache(32), g.new_cache(32)
    prefill(model, ce, prompt)
    prefill(model, cg, prompt)
    dense = tree_mask([-1, 0, 0, 1, 2])[2:]  # last 3 rows of a 5-node tree: (3, 5)
    toks = torch.tensor([5, 6, 7])
    slots = torch.arange(9 + 2, 9 + 5)
    pos = torch.tensor([10, 11, 11])
    for _ in range(3):
        with torch.inference_mode():
            ref = model(toks[None], pos, cache=ce, cache_slots=slots, prefix_len=9, tree_mask=TreeMask.from_dense(dense))
            got = g(toks[None], pos, cache=cg, cache_slots=slots, prefix_len=9, tree_mask=TreeMask.from_dense(dense))
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert g.stats.captures == 1
    base = dict(cache=cg, cache_slots=slots, prefix_len=9, tree_mask=TreeMask.from_dense(dense))
    with torch.inference_mode():
        for _ in range(2):
            g(toks[None], pos[None], **base)  # positions (B, T): another key
            g(toks[None], pos, num_layers=1, **base)  # the layer-skip draft: another key
            g(toks[None], pos, backend="torch", **base)  # another backend: another key
        other = g.new_cache(32)
        for _ in range(2):
            g(toks[None], pos, **{**base, "cache": other})  # a new cache: new addresses, another key
    assert g.stats.captures == 5 and g.num_graphs == 5
    with pytest.raises(ValueError, match="does not fit a cache of 32 slots"):
        with torch.inference_mode():
            g(toks[None], pos, **{**base, "prefix_len": 28})


def test_eager_reasons_and_lru_bound():
    model = tiny()
    g = GraphedTransformer(model, graph_factory=ReplayGraph, max_tokens=4, max_graphs=2)
    cache = g.new_cache(64, batch=2)
    with torch.inference_mode():
        g(torch.tensor([[1, 2, 3]]))  # no cache: plain causal attention
        idx = torch.arange(6)
        g(torch.arange(6)[None], idx, cache=cache.rows(0, 1), cache_slots=idx, prefix_len=0,
          tree_mask=causal_tree_mask(6))  # a 6-token prefill: over max_tokens
        rows = RowPrefix(6, torch.ones(2, 6, dtype=torch.bool))
        g(torch.tensor([[1], [2]]), torch.tensor([6]), cache=cache, cache_slots=torch.tensor([6]), prefix_len=rows,
          tree_mask=causal_tree_mask(1))
        for T in (1, 2, 3):  # three shapes, two graphs kept
            for _ in range(2):
                s = torch.arange(6, 6 + T)
                g(torch.ones(1, T, dtype=torch.long), s, cache=cache.rows(0, 1), cache_slots=s, prefix_len=6,
                  tree_mask=causal_tree_mask(T))
    assert g.stats.eager == {"no KV cache": 1, "more than 4 tokens": 1, "per-row prefix": 1, "first sighting": 3}
    assert g.stats.captures == 3 and g.stats.evictions == 1 and g.num_graphs == 2
    assert [k[1] for k in g._graphs] == [2, 3]  # the least recently used shape went first


def test_refusals():
    model = tiny()
    assert "CUDA device" in graphs_unsupported_reason(model)
    with pytest.raises(ValueError, match="needs? a model on a CUDA device"):
        cuda_graphs(model)
    g = GraphedTransformer(model, graph_factory=ReplayGraph)
    with pytest.raises(ValueError, match="already wrapped"):
        GraphedTransformer(g, graph_factory=ReplayGraph)
    with pytest.raises(ValueError, match="Transformer"):
        GraphedTransformer(torch.nn.Linear(2, 2), graph_factory=ReplayGraph)
    off = copy.deepcopy(model)
    offload_layers(off, "cpu")
    with pytest.raises(ValueError, match="offloaded"):
        GraphedTransformer(off, graph_factory=ReplayGraph)
    with pytest.raises(ValueError, match=">= 1"):
        GraphedTransformer(model, graph_factory=ReplayGraph, max_graphs=0)


def test_decoders_run_unchanged_on_the_wrapper():
    """Plain and tree decoding take the wrapper as a model and stay token-for-token exact (greedy)."""
    target, draft = tiny(0, n_layers=3), tiny(1, n_layers=1)
    prompt = [3, 14, 15, 92, 65, 35]
    plain = AutoregressiveDecoder(target, max_len=96).generate(prompt, 20).tokens
    gt = GraphedTransformer(target, graph_factory=ReplayGraph)
    gd = GraphedTransformer(draft, graph_factory=ReplayGraph)
    tree = Tree.from_choices([[0], [1], [0, 0], [0, 1], [0, 0, 0]])
    assert AutoregressiveDecoder(gt, max_len=96).generate(prompt, 20).tokens == plain
    assert SpeculativeDecoder(gt, gd, tree, max_len=96).generate(prompt, 20).tokens == plain
    assert gt.stats.replays > 10 and gd.stats.replays > 5  # verify and draft levels were replayed
    # each decoder's prefill and the first call of each repeated shape ran eagerly, nothing else did
    assert set(gt.stats.eager) == {"first sighting"} and gt.stats.eager["first sighting"] > gt.stats.captures >= 2


def test_cli_refuses_cuda_graphs_without_cuda():
    from typer.testing import CliRunner

    from sequoia_opt.cli import app

    runner = CliRunner()
    for args in (["profile", "latency", "--random-weights", "--arch", "tiny", "--cuda-graphs"],
                 ["run", "--tree", "t.yaml", "--cuda-graphs"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 2, res.output
        assert "--cuda-graphs captures CUDA graphs: it needs --device cuda" in res.output
    res = runner.invoke(app, ["profile", "latency", "--random-weights", "--arch", "tiny", "--cuda-graphs",
                              "--offload"])
    assert res.exit_code == 2


# ---------------------------------------------------------------------------------------------------------- CUDA
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_replay_matches_eager(dtype):
    if not torch.cuda.is_available():
        pytest.fail("-m gpu needs a CUDA device")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = Transformer(ModelConfig.preset("tiny").with_(dim=256, n_heads=4, n_kv_heads=2, n_layers=3),
                        device=dev, dtype=dtype).eval()
    g = cuda_graphs(model)
    dense = tree_mask([-1, 0, 0, 1, 1, 2, 4, 4, 6]).to(dev)
    depth = dense.sum(1) - 1
    prompt = torch.randint(0, 256, (70,), device=dev)
    ce, cg = model.new_cache(128), g.new_cache(128)
    prefill(model, ce, prompt)
    prefill(model, cg, prompt)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    for step in range(4):
        toks = torch.randint(0, 256, (9,), device=dev)
        ref = verify_call(model, ce, 70, toks, depth, dense)
        got = verify_call(g, cg, 70, toks, depth, dense)
        torch.testing.assert_close(got.float(), ref.float(), **tol)
    assert g.stats.captures == 1 and g.stats.replays == 3


@pytest.mark.gpu
def test_cuda_graph_decoding_is_exact():
    if not torch.cuda.is_available():
        pytest.fail("-m gpu needs a CUDA device")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    target = Transformer(ModelConfig.preset("tiny").with_(n_layers=3), device=dev, dtype=torch.float32).eval()
    draft = Transformer(ModelConfig.preset("tiny").with_(n_layers=1), device=dev, dtype=torch.float32).eval()
    prompt = [3, 14, 15, 92, 65, 35]
    plain = AutoregressiveDecoder(target, max_len=96).generate(prompt, 24).tokens
    gt, gd = cuda_graphs(target), cuda_graphs(draft)
    tree = Tree.from_choices([[0], [1], [0, 0], [0, 1], [0, 0, 0]])
    assert SpeculativeDecoder(gt, gd, tree, max_len=96).generate(prompt, 24).tokens == plain
    assert gt.stats.replays > 5
