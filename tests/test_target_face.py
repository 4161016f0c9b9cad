"""A target face written outside the bundled model: a pure-torch Llama-style LM with its own growing per-row KV
(no RowCache, no Transformer), plugged into the one loop through :class:`TargetFace` alone. Greedy output equals
plain decoding with it (and the bundled model's, whose weights it reads) for a static tree, prompt lookup, a draft
model, a batch of 3 prompts of different lengths and rows joining; sampling is reproducible with a generator; what
the protocol requires of a face is refused at construction, not met with wrong tokens."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from tiny_pair import noisy_copy, random_model  # noqa: E402

from sequoia_opt.decoding import Decoder, Room, TargetFace, autoregressive_generate  # noqa: E402
from sequoia_opt.drafting.drafters import ModelDrafter, PromptLookupDrafter  # noqa: E402
from sequoia_opt.drafting.policies import ChainPolicy, StaticTreePolicy  # noqa: E402
from sequoia_opt.errors import DecodingError  # noqa: E402
from sequoia_opt.tree import Tree  # noqa: E402

PROMPT = [5, 17, 250, 3, 99, 42, 7, 7, 8]
BATCH = [[5, 17, 250], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [200, 201, 5, 17, 250, 3, 99]]
TREE = Tree.from_choices([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
M = 24


class TinyLM:
    """The Llama arithmetic in plain torch over a state dict: RMSNorm, rotary (pairs i, i + D/2), GQA, SwiGLU."""

    def __init__(self, model):
        c = model.config
        self.w = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.L, self.H, self.Hkv, self.D, self.eps = c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.norm_eps
        self.context, self.vocab = c.max_position_embeddings, c.vocab_size
        self.inv_freq = (1.0 / c.rope_theta ** (torch.arange(0, self.D, 2, dtype=torch.float64) / self.D)).float()

    def _norm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def _rope(self, x, pos):  # x (H, T, D)
        ang = pos.float()[:, None] * self.inv_freq
        x1, x2 = x.chunk(2, -1)
        return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()], -1)

    def __call__(self, tokens, pos, past, mask):
        """(T,) tokens at (T,) positions after ``past`` (per layer (k, v), (Hkv, P, D) each), ``mask`` (T, T) among
        them. Returns (T, V) logits and the new tokens' (k, v) per layer."""
        w, T, new = self.w, tokens.shape[0], []
        x = w["embed_tokens.weight"][tokens]
        for i, (pk, pv) in enumerate(past):
            p = f"layers.{i}."
            h = self._norm(x, w[p + "input_layernorm.weight"])
            proj = lambda name, heads: (h @ w[p + name].T).view(T, heads, self.D).transpose(0, 1)  # noqa: E731
            q = self._rope(proj("self_attn.q_proj.weight", self.H), pos)
            k = self._rope(proj("self_attn.k_proj.weight", self.Hkv), pos)
            v = proj("self_attn.v_proj.weight", self.Hkv)
            new.append((k, v))
            rep = self.H // self.Hkv
            K, V = torch.cat([pk, k], 1).repeat_interleave(rep, 0), torch.cat([pv, v], 1).repeat_interleave(rep, 0)
            seen = torch.cat([torch.ones(T, pk.shape[1], dtype=torch.bool), mask], 1)
            att = ((q @ K.transpose(1, 2)) / math.sqrt(self.D)).masked_fill(~seen, float("-inf")).softmax(-1)
            x = x + (att @ V).transpose(0, 1).reshape(T, -1) @ w[p + "self_attn.o_proj.weight"].T
            h = self._norm(x, w[p + "post_attention_layernorm.weight"])
            x = x + (F.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)) \
                @ w[p + "mlp.down_proj.weight"].T
        return self._norm(x, w["norm.weight"]) @ w["lm_head.weight"].T, new


class ForeignTarget(TargetFace):
    """TinyLM as the loop's target: per row, per layer, the committed (k, v), grown at commit by the path's."""

    def __init__(self, lm: TinyLM, max_batch: int = 3):
        self.lm, self.vocab_size, self.device = lm, lm.vocab, torch.device("cpu")
        self.context = self.max_len = lm.context  # no static slots: a row holds what the context allows
        self.max_batch, self.name = max_batch, "the foreign target"
        self.kv, self.pending, self.verified = [], [], 0

    def _prompt(self, p):
        empty = torch.zeros(self.lm.Hkv, 0, self.lm.D)
        past = [(empty, empty)] * self.lm.L
        T = len(p) - 1
        return self.lm(torch.tensor(p[:-1]), torch.arange(T), past, torch.ones(T, T, dtype=torch.bool).tril())[1] \
            if T else past

    def prefill(self, prompts):
        self.kv, self.pending = [self._prompt(list(p)) for p in prompts], [None] * len(prompts)

    def join(self, state, prompts):
        self.kv += [self._prompt(list(p)) for p in prompts]
        self.pending += [None] * len(prompts)

    def room(self, state, want):
        return [Room(self.max_len - r.cached, self.context - 1 - r.cached) for r in state.rows]

    def verify(self, state, trees):
        self.verified += 1
        out = []
        for b, (row, t) in enumerate(zip(state.rows, trees)):
            pos = torch.tensor(t.depth, dtype=torch.int64) + row.cached
            logits, self.pending[b] = self.lm(t.tokens.cpu(), pos, self.kv[b], torch.from_numpy(t.ancestors()))
            out.append(logits)
        return out

    def commit(self, state, paths):
        for b, p in enumerate(paths):
            idx = torch.tensor(list(p), dtype=torch.int64)
            self.kv[b] = [(torch.cat([k, nk[:, idx]], 1), torch.cat([v, nv[:, idx]], 1))
                          for (k, v), (nk, nv) in zip(self.kv[b], self.pending[b])]

    def keep(self, rows):
        self.kv, self.pending = [self.kv[b] for b in rows], [self.pending[b] for b in rows]


@pytest.fixture(scope="module")
def pair():
    target = random_model(0)
    return target, noisy_copy(target, 0.05, 1), TinyLM(target)


def _plain(lm, prompt):
    return Decoder(ForeignTarget(lm)).generate(prompt, M).tokens


def test_the_foreign_target_decodes_as_the_bundled_model(pair):
    target, _, lm = pair
    face = ForeignTarget(lm)
    res = Decoder(face).generate(PROMPT, M)
    assert res.tokens == autoregressive_generate(target, PROMPT, M).tokens
    assert res.num_steps == face.verified == M and res.tokens_per_step == 1.0


@pytest.mark.parametrize("make", [lambda d: StaticTreePolicy(d, TREE), lambda d: StaticTreePolicy(
    PromptLookupDrafter(257), TREE), lambda d: ChainPolicy(PromptLookupDrafter(257), 4),
    lambda d: ChainPolicy(ModelDrafter(d), 4)], ids=["tree-draft", "tree-lookup", "chain-lookup", "chain-draft"])
def test_every_policy_on_the_foreign_target_keeps_its_greedy_output(pair, make):
    _, draft, lm = pair
    face = ForeignTarget(lm)
    res = Decoder(face, make(draft)).generate(PROMPT, M)
    assert res.tokens == _plain(lm, PROMPT)
    assert res.num_steps == face.verified and sum(s.accepted_len for s in res.steps) == M
    assert res.tokens_per_step == pytest.approx(M / res.num_steps)
    assert all(s.verify_ms > 0 and s.draft_ms >= 0 for s in res.steps)


@pytest.mark.parametrize("drafter", ["draft", "lookup"])
def test_a_batch_of_prompts_of_different_lengths_and_joiners(pair, drafter):
    _, draft, lm = pair
    make = lambda: StaticTreePolicy(draft if drafter == "draft" else PromptLookupDrafter(257), TREE)  # noqa: E731
    want = [_plain(lm, p) for p in BATCH]
    res = Decoder(ForeignTarget(lm), make(), max_batch=3).generate_batch(BATCH, M)
    assert [r.tokens for r in res.results] == want
    assert res.steps[0].batch == 3 and sum(sum(s.emitted) for s in res.steps) == 3 * M
    dec = Decoder(ForeignTarget(lm), make(), max_batch=3)  # continuous batching: two rows join after 3 steps
    state = dec.start_batch(BATCH[:1], M)
    for _ in range(3):
        dec.step(state)
    dec.join(state, BATCH[1:], M)
    while not state.finished:
        dec.step(state)
    assert [r.tokens for r in state.results] == want


def test_sampling_on_the_foreign_target_follows_the_generator(pair):
    _, draft, lm = pair
    run = lambda seed: Decoder(ForeignTarget(lm), StaticTreePolicy(draft, TREE), temperature=0.8,  # noqa: E731
                               generator=torch.Generator().manual_seed(seed)).generate(PROMPT, M).tokens
    a = run(0)
    assert a == run(0) and len(a) == M and a != run(1)


def test_a_face_without_keep_is_refused_for_a_batch(pair):
    """Rows finish at different steps: a face keeping the finished rows verified the next row against the finished
    row's cache (wrong tokens, no error). The decoder refuses it; a batch of one never needs keep."""
    _, draft, lm = pair

    class NoKeep(ForeignTarget):
        keep = TargetFace.keep

    with pytest.raises(DecodingError, match=r"does not implement keep\(rows\)"):
        Decoder(NoKeep(lm), StaticTreePolicy(draft, TREE), max_batch=3)
    assert Decoder(NoKeep(lm), StaticTreePolicy(draft, TREE)).generate(PROMPT, M).tokens == _plain(lm, PROMPT)
    with pytest.raises(DecodingError, match="cannot drop finished rows"):
        NoKeep(lm).keep([0])


def test_the_backend_argument_with_a_face(pair):
    """A face has no attention backend of the decoder's to take: the argument is still checked, and it is the one the
    policy's model drafters run with (they ran with 'torch' whatever was asked)."""
    _, draft, lm = pair
    with pytest.raises(DecodingError, match="unknown attention backend 'flash'"):
        Decoder(ForeignTarget(lm), StaticTreePolicy(draft, TREE), backend="flash")
    with pytest.raises(DecodingError, match="needs CUDA tensors"):
        Decoder(ForeignTarget(lm), StaticTreePolicy(draft, TREE), backend="cuda")
    drafter = ModelDrafter(draft)
    Decoder(ForeignTarget(lm), StaticTreePolicy(drafter, TREE), backend="torch")
    assert drafter.settings.backend == "torch"

    class WithBackend(ForeignTarget):
        backend = "cuda"  # the face's own wins (a face on a GPU that built the kernel)

    drafter = ModelDrafter(draft)
    Decoder(WithBackend(lm), StaticTreePolicy(drafter, TREE))
    assert drafter.settings.backend == "cuda"


def test_max_len_is_the_faces_own(pair):
    """``max_len`` sizes a Transformer target's cache; with a face it was ignored (the face's own was used, for model
    drafters too), so a caller asking for fewer slots got more. Another value is refused, the face's own accepted."""
    _, draft, lm = pair
    with pytest.raises(DecodingError, match=r"max_len=5 sizes the cache of a Transformer target; the foreign target "
                                            r"has its own: max_len=512"):
        Decoder(ForeignTarget(lm), StaticTreePolicy(draft, TREE), max_len=5)
    assert Decoder(ForeignTarget(lm), max_len=512).max_len == 512
