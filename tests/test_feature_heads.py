"""Feature heads (EAGLE-3, EAGLE-1/2, Medusa): the target's hidden states, the strict loaders of the public layouts,
each head's forward against an independent reference, the drafters' cached decoding against the same reference
step by step, and exact decoding with every policy."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from feature_heads import (TARGET4, RefEagle, RefEagle3, eagle3_config, eagle3_tensors, eagle_config,  # noqa: E402
                           eagle_tensors, medusa_tensors, random_target, ref_medusa, write_eagle, write_eagle3,
                           write_head, write_medusa)

from sequoia_opt.decoding import Decoder  # noqa: E402
from sequoia_opt.decoding.state import DecodeState, DraftSettings, RowState  # noqa: E402
from sequoia_opt.decoding.stats import GenerationResult  # noqa: E402
from sequoia_opt.decoding.step_tree import StepTree, TreeBuffers  # noqa: E402
from sequoia_opt.decoding.target import TargetFace, TransformerTarget  # noqa: E402
from sequoia_opt.drafting.drafters import EagleDrafter, MedusaDrafter  # noqa: E402
from sequoia_opt.drafting.policies import ChainPolicy, DynamicPolicy, GraftPolicy, StaticTreePolicy  # noqa: E402
from sequoia_opt.drafting.policies.scheduler import GraftScheduler  # noqa: E402
from sequoia_opt.drafting.drafters import PromptLookupDrafter  # noqa: E402
from sequoia_opt.dynamic import parse_setting  # noqa: E402
from sequoia_opt.errors import CheckpointError, DecodingError  # noqa: E402
from sequoia_opt.model.head_checkpoints import (check_eagle_head, load_eagle_head, load_medusa_heads,  # noqa: E402
                                                read_medusa_config, save_eagle_head, save_medusa_heads)
from sequoia_opt.tree import Tree  # noqa: E402

DRAFT_IDS = sorted(torch.randperm(257, generator=torch.Generator().manual_seed(3))[:120].tolist())
PROMPT = [5, 17, 250, 3, 99, 42, 7, 7, 8]


@pytest.fixture(scope="module")
def target():
    return random_target()


@pytest.fixture(scope="module")
def heads(tmp_path_factory, target):
    root = tmp_path_factory.mktemp("heads")
    return {"eagle3": write_eagle3(root / "e3", draft_ids=DRAFT_IDS, ids=(0, 1, 2)),
            "eagle3-full": write_eagle3(root / "e3full", ids=(2, 0, 1), seed=1),
            "eagle": write_eagle(root / "e1"),
            "medusa": write_medusa(root / "md")}


def _tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    f = folder / "model.safetensors"
    return load_file(str(f)) if f.exists() else torch.load(folder / "pytorch_model.bin")


def _ref_features(target, seq, layers):
    """(len(seq), k, H) the target's hidden states of a whole sequence, by running its blocks by hand: index i <
    n_layers is the input of block i, n_layers the final norm's output."""
    x = target.embed_tokens(torch.tensor([seq]))
    T = len(seq)
    ang = torch.arange(T).float().unsqueeze(-1) * target.inv_freq
    cos, sin = ang.cos()[None, None], ang.sin()[None, None]
    keep = {}
    for i, blk in enumerate(target.layers):
        keep[i] = x
        x = blk(x, cos, sin, None, None, 0, None, "torch")
    keep[len(target.layers)] = target.norm(x)
    return torch.stack([keep[i][0] for i in layers], 1)


# ---------------------------------------------------------------------------------------------- the target's side
def test_transformer_keeps_the_hidden_states_asked_and_the_default_path_is_unchanged(target):
    toks = torch.tensor([PROMPT])
    plain = target(toks)
    logits, h = target(toks, hidden_layers=(4, 0, 2))
    assert torch.equal(logits, plain)
    ref = _ref_features(target, PROMPT, (4, 0, 2))
    assert h.shape == (1, len(PROMPT), 3, 64) and torch.allclose(h[0], ref, atol=1e-5)
    assert torch.equal(h[0, :, 1], target.embed_tokens(toks)[0])  # index 0: the embeddings
    with pytest.raises(ValueError, match=r"0\.\.4"):
        target(toks, hidden_layers=(5,))


def test_the_face_keeps_prefill_and_committed_path_states(target):
    face = TransformerTarget(target, max_len=64)
    face.request_hidden((4, 1))
    face.request_hidden((2,))
    assert face.hidden_layers == (1, 2, 4)
    face.prefill([PROMPT])
    ref = _ref_features(target, PROMPT, (2, 4))
    assert torch.allclose(face.prefill_hidden(0, (2, 4)), ref[:-1], atol=1e-5)
    row = RowState(seq=list(PROMPT), cached=len(PROMPT) - 1, max_new_tokens=8, result=GenerationResult([], 9))
    state = DecodeState(rows=[row], results=[row.result])
    tree = StepTree.static(TreeBuffers.build(Tree.from_choices([[0], [1], [0, 0]]), "cpu"),
                           torch.tensor([PROMPT[-1], 11, 12, 13]))
    face.verify(state, [tree])
    face.commit(state, [[0, 1, 3]])  # root, node 1 (11), node 3 (13, child of 1)
    want = _ref_features(target, PROMPT + [11, 13], (4,))[-3:]
    assert torch.allclose(face.path_hidden(0, (4,)), want, atol=1e-5)
    with pytest.raises(DecodingError, match="not requested"):
        face.path_hidden(0, (3,))
    with pytest.raises(DecodingError, match="hidden states 0..4"):
        face.request_hidden((9,))


def test_a_face_without_hidden_states_refuses_a_feature_head(heads, target):
    class Chains(TargetFace):  # a face that cannot return hidden states (llama.cpp's, today)
        vocab_size, device, context, max_len = 257, torch.device("cpu"), 512, 64

        def prefill(self, prompts): ...
        def room(self, state, want): ...
        def verify(self, state, trees): ...
        def commit(self, state, paths): ...

    head, ids = load_eagle_head(heads["eagle3"], "eagle3", target)
    with pytest.raises(DecodingError, match="does not return hidden states"):
        Decoder(Chains(), StaticTreePolicy(EagleDrafter(head, 4, ids), Tree.chain(2)))


# ---------------------------------------------------------------------------------------------- forwards vs reference
def test_eagle3_forward_matches_the_reference(heads, target):
    head, ids = load_eagle_head(heads["eagle3"], "eagle3", target)
    assert ids.tolist() == DRAFT_IDS
    ref = RefEagle3(_tensors(heads["eagle3"]), target.embed_tokens.weight.detach())
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(6, 3, 64, generator=g)
    toks = torch.randint(0, 257, (6,), generator=g)
    logits, out = head(toks[None], head.fuse(feats[None]), torch.arange(6))  # no cache: causal attention
    seen = []
    for t in range(6):
        lg, r2, kv = ref.item(int(toks[t]), ref.fuse(feats[t]), t, seen)
        seen.append(kv)
        assert torch.allclose(logits[0, t], lg, atol=1e-4) and torch.allclose(out[0, t], r2, atol=1e-4)
    # a catch-up chunk reads only its last item: the MLP and LM head run on it alone, with the same values
    last_logits, last_out = head(toks[None], head.fuse(feats[None]), torch.arange(6), last_only=True)
    assert last_logits.shape == (1, 1, len(DRAFT_IDS)) and last_out.shape == (1, 1, 64)
    assert torch.allclose(last_logits[0, 0], lg, atol=1e-4) and torch.allclose(last_out[0, 0], r2, atol=1e-4)


def test_eagle_forward_matches_the_reference(heads, target):
    head, ids = load_eagle_head(heads["eagle"], "eagle", target)
    assert ids is None and head.config.fc_bias
    ref = RefEagle(_tensors(heads["eagle"]), target.embed_tokens.weight.detach(), target.lm_head.weight.detach())
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(5, 1, 64, generator=g)
    toks = torch.randint(0, 257, (5,), generator=g)
    logits, out = head(toks[None], head.fuse(feats[None]), torch.arange(5))
    seen = []
    for t in range(5):
        lg, x, kvs = ref.item(int(toks[t]), ref.fuse(feats[t]), t, seen)
        seen.append(kvs)
        assert torch.allclose(logits[0, t], lg, atol=1e-4) and torch.allclose(out[0, t], x, atol=1e-4)
    last_logits, last_out = head(toks[None], head.fuse(feats[None]), torch.arange(5), last_only=True)
    assert last_logits.shape == (1, 1, 257) and last_out.shape == (1, 1, 64)
    assert torch.allclose(last_logits[0, 0], lg, atol=1e-4) and torch.allclose(last_out[0, 0], x, atol=1e-4)


@pytest.mark.parametrize("weights, prefix", [("medusa_lm_head.pt", ""),
                                             ("medusa_lm_head.safetensors", "medusa_head.")])
def test_medusa_forward_matches_the_reference(tmp_path, target, weights, prefix):
    folder = write_medusa(tmp_path / "m", heads=3, layers=2, weights=weights, prefix=prefix)
    heads = load_medusa_heads(folder, target)
    h = torch.randn(64, generator=torch.Generator().manual_seed(2))
    want = ref_medusa(medusa_tensors(heads=3, layers=2, prefix=prefix), h, heads=3, layers=2, prefix=prefix)
    assert torch.allclose(heads(h), want, atol=1e-4)


@pytest.mark.parametrize("kind", ["eagle3", "eagle", "medusa"])
def test_a_head_loaded_as_a_drafter_runs_tuned_linears_with_the_same_output(heads, target, kind):
    """The drafter kind's loader tunes the head's linears for this CPU (as a draft model's): every linear gets
    a dispatch plan, and the tuned forward over 1 and 3 rows gives the untuned one's logits; an EAGLE-1/2 head
    runs the target's own LM head module (tuned with the target)."""
    from sequoia_opt.drafting.registry import DRAFTERS, parse_drafter_spec
    from sequoia_opt.model.llama import Linear

    spec = parse_drafter_spec(f"{kind}:{heads[kind]}")
    tuned = DRAFTERS[kind].load(spec, target)
    plain = load_medusa_heads(heads[kind], target) if kind == "medusa" else load_eagle_head(heads[kind], kind, target)
    mods = [tuned, plain] if kind == "medusa" else [tuned[0], plain[0]]
    linears = [m for m in mods[0].modules() if isinstance(m, Linear)]
    assert linears and all(m.dispatch is not None for m in linears)
    assert all(m.dispatch is None for m in mods[1].modules() if isinstance(m, Linear))
    if kind == "eagle":  # EAGLE reads its features with the target's own LM head module, never a saved copy
        assert mods[0]._target_lm == (target.lm_head,)
        assert not [k for k in mods[0].state_dict() if "lm_head" in k]
    g = torch.Generator().manual_seed(3)
    with torch.inference_mode():
        for rows in (1, 3):
            if kind == "medusa":
                h = torch.randn(rows, 64, generator=g)
                a, b = mods[0](h), mods[1](h)
            else:
                feats = torch.randn(1, rows, 3 if kind == "eagle3" else 1, 64, generator=g)
                toks = torch.randint(0, 257, (1, rows), generator=g)
                a = mods[0](toks, mods[0].fuse(feats), torch.arange(rows))[0]
                b = mods[1](toks, mods[1].fuse(feats), torch.arange(rows))[0]
            assert a.shape == b.shape and torch.allclose(a, b, atol=1e-4)


def test_saved_heads_load_back_equal(tmp_path, heads, target):
    head, ids = load_eagle_head(heads["eagle3"], "eagle3", target)
    save_eagle_head(head, tmp_path / "again", draft_ids=ids)
    head2, ids2 = load_eagle_head(tmp_path / "again", "eagle3", target)
    assert torch.equal(ids, ids2)
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), head2.state_dict().values()))
    med = load_medusa_heads(heads["medusa"], target)
    save_medusa_heads(med, tmp_path / "m2", base_model="tiny4")
    med2 = load_medusa_heads(tmp_path / "m2", target)
    assert all(torch.equal(a, b) for a, b in zip(med.state_dict().values(), med2.state_dict().values()))


# ---------------------------------------------------------------------------------------------- strict loaders
def _e3(tmp_path, drop=None, add=None, **over):
    t = eagle3_tensors(draft_ids=DRAFT_IDS)
    if drop:
        t.pop(drop)
    t.update(add or {})
    cfg = eagle3_config(Vd=len(DRAFT_IDS))
    for k, v in over.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return write_head(tmp_path / "bad", cfg, t)


@pytest.mark.parametrize("make, message", [
    (lambda p: _e3(p, drop="midlayer.self_attn.k_proj.weight"), "model.safetensors: missing tensor "
                                                                 "midlayer.self_attn.k_proj.weight"),
    (lambda p: _e3(p, add={"midlayer.extra.weight": torch.zeros(2)}), "unexpected tensor midlayer.extra.weight"),
    (lambda p: _e3(p, add={"fc.weight": torch.zeros(64, 96)}), "tensor fc.weight has shape (64, 96)"),
    (lambda p: _e3(p, architectures=["MysteryForCausalLM"]), "is not an EAGLE-3 head"),
    (lambda p: _e3(p, vocab_size=32000), "config.json: vocab_size = 32000 but the target's vocabulary has 257"),
    (lambda p: _e3(p, hidden_size=128), "config.json: hidden_size = 128 but the target's hidden size is 64"),
    (lambda p: _e3(p, target_hidden_size=4096), "config.json: target_hidden_size = 4096"),
    (lambda p: _e3(p, eagle_config={"use_aux_hidden_state": True}),
     "config.json: eagle_config.eagle_aux_hidden_state_layer_ids is missing"),
    (lambda p: _e3(p, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 16, 29]}),
     "eagle_aux_hidden_state_layer_ids = [1, 16, 29] must be 3 layer indices in 0..2 (the target has 4 layers"),
    # the engines capture each listed layer once (`if i in layers_to_capture`): fc would get 2 features for 3
    (lambda p: _e3(p, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 0, 1]}),
     "eagle_aux_hidden_state_layer_ids = [1, 0, 1] names layer 1 twice"),
    (lambda p: _e3(p, add={"d2t": torch.full((len(DRAFT_IDS),), 300)}),
     "model.safetensors: d2t[0] = 300 maps draft token 0 to target id 300, outside the target vocabulary"),
    (lambda p: _e3(p, add={"t2d": torch.ones(257, dtype=torch.bool)}), "t2d[0] disagrees with d2t"),
    (lambda p: _e3(p, drop="d2t"), "missing tensor d2t"),
    # the whole vocabulary without d2t: a t2d that leaves an id out contradicts it
    (lambda p: write_head(p / "full", eagle3_config(), dict(eagle3_tensors(), t2d=torch.arange(257) != 5)),
     "model.safetensors: t2d[5] is false, but without d2t the draft vocabulary is the target's whole vocabulary"),
    (lambda p: _e3(p, num_hidden_layers=2), "config.json: num_hidden_layers = 2; an EAGLE-3 head has one"),
    # treeopt's trainer records its target's layer count: a head trained on a 6-layer target loaded on this one
    (lambda p: _e3(p, treeopt={"target_num_hidden_layers": 6}), "config.json: treeopt.target_num_hidden_layers = 6 "
                                                               "but the target has 4 layers (a head for another target)"),
    (lambda p: _e3(p, treeopt={"target_num_hidden_layers": "4"}), "config.json: treeopt.target_num_hidden_layers = '4' must be "
                                                                 "an integer >= 1"),
    # a break-it pass: values a float() / bool() / int() took (or raised a traceback on)
    (lambda p: _e3(p, rms_norm_eps="abc"), "config.json: rms_norm_eps = 'abc' must be a positive number"),
    (lambda p: _e3(p, rms_norm_eps=[1]), "config.json: rms_norm_eps = [1] must be a positive number"),
    (lambda p: _e3(p, rms_norm_eps=0), "config.json: rms_norm_eps = 0 must be a positive number"),
    (lambda p: _e3(p, rms_norm_eps=float("nan")), "config.json: rms_norm_eps = nan must be a positive number"),
    (lambda p: _e3(p, head_dim=-64), "config.json: head_dim = -64 must be an integer >= 0"),
    (lambda p: _e3(p, head_dim="16"), "config.json: head_dim = '16' must be an integer >= 0"),
    (lambda p: _e3(p, norm_before_residual="no"), "config.json: norm_before_residual = 'no' must be true or false"),
    (lambda p: _e3(p, bias="false"), "config.json: bias = 'false' must be true or false"),
    (lambda p: _e3(p, rope_theta="x"), "config.json: rope_theta = 'x' is not a positive number"),
    (lambda p: _e3(p, max_position_embeddings=0), "config.json: max_position_embeddings = 0 must be an integer >= 1"),
    (lambda p: _e3(p, add={"fc.weight": torch.ones(64, 192, dtype=torch.bool)}),
     "model.safetensors: tensor fc.weight is BOOL; the layout stores it as F16 or BF16 or F32 or F64"),
    (lambda p: _e3(p, add={"fc.weight": torch.ones(64, 192, dtype=torch.complex64)}), "tensor fc.weight is C64"),
    (lambda p: _e3(p, add={"d2t": torch.zeros(len(DRAFT_IDS), dtype=torch.float32)}),
     "tensor d2t is F32; the layout stores it as I64 or I32"),
    # a second break-it pass: messages in treeopt's names ("dim 64 is not divisible by n_heads 5"), an eagle_config
    # that is not an object read as missing, a missing draft_vocab_size blamed on lm_head's rows
    (lambda p: _e3(p, head_dim=None, num_attention_heads=5),
     "config.json: hidden_size = 64 is not divisible by num_attention_heads = 5 (and no head_dim is given)"),
    (lambda p: _e3(p, num_key_value_heads=3),
     "config.json: num_key_value_heads = 3, which does not divide num_attention_heads = 4"),
    (lambda p: _e3(p, eagle_config="[0, 1, 2]"), "config.json: eagle_config = '[0, 1, 2]' must be an object"),
    (lambda p: _e3(p, draft_vocab_size=None),
     f"config.json: draft_vocab_size = 257 (missing: the whole vocabulary) but model.safetensors's d2t maps "
     f"{len(DRAFT_IDS)} draft ids"),
])
def test_eagle3_loader_is_strict(tmp_path, make, message):
    folder = make(tmp_path)
    with pytest.raises(CheckpointError) as err:
        check_eagle_head(folder, "eagle3", TARGET4)
    assert message in str(err.value) and str(folder) in str(err.value)


def test_an_eagle3_head_may_say_llamas_architecture_as_published_heads_do(tmp_path):
    """EAGLE-3 heads are published with architectures LlamaForCausalLM (vLLM's EAGLEConfig renames it by the
    method the user names); named eagle3:PATH, its layout decides."""
    folder = _e3(tmp_path, architectures=["LlamaForCausalLM"])
    assert check_eagle_head(folder, "eagle3", TARGET4).aux_layers == (0, 1, 2)


def test_a_null_in_eagle_config_reads_as_absent_as_in_the_engines(tmp_path):
    """eagle_config.eagle_aux_hidden_state_layer_ids: null beside a top-level list: the list (the null won, and the
    head was refused as naming no layers)."""
    folder = _e3(tmp_path, eagle_config={"eagle_aux_hidden_state_layer_ids": None},
                 eagle_aux_hidden_state_layer_ids=[0, 1, 2])
    assert check_eagle_head(folder, "eagle3", TARGET4).aux_layers == (0, 1, 2)


def test_a_bin_holding_other_objects_than_tensors_is_named_so_without_torchs_ansi_advice(tmp_path):
    """torch.load(weights_only=True) refuses a pickled object with a paragraph in ANSI bold advising to unpickle
    anyway; the loader printed its first 200 characters, escapes included."""
    folder = tmp_path / "obj"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(eagle3_config()))
    torch.save({"fc.weight": torch.zeros(2), "note": Path("x")}, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError) as err:
        check_eagle_head(folder, "eagle3", TARGET4)
    assert str(err.value) == (f"{folder / 'pytorch_model.bin'}: holds objects other than tensors, which "
                              "torch.load(weights_only=True) refuses to unpickle: save a state dict of tensors (or "
                              "model.safetensors)")


def test_eagle3_fuses_its_layers_in_the_targets_order(tmp_path, target):
    # SGLang and vLLM append a captured layer's features as their layer loop passes it, so fc reads the layers
    # ascending whatever the config's order: a head listing [2, 0, 1] is the head listing [0, 1, 2]
    listed = _e3(tmp_path, eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 0, 1]})
    assert check_eagle_head(listed, "eagle3", TARGET4).aux_layers == (0, 1, 2)
    head, _ = load_eagle_head(listed, "eagle3", target)
    assert head.config.aux_layers == (0, 1, 2)
    assert head.config.feature_layers(4) == (1, 2, 3)  # the residual stream entering blocks 1..3: layers 0..2 out
    # a config built by hand (the trainer's) is checked too
    for bad in ((2, 0, 1), (0, 1, 1)):
        with pytest.raises(ValueError, match="must be ascending and distinct"):
            replace(head.config, aux_layers=bad)


def test_a_whole_vocabulary_eagle3_head_may_bring_a_t2d_marking_every_id(tmp_path, target):
    every = torch.ones(257, dtype=torch.bool)
    folder = write_head(tmp_path / "full", eagle3_config(), dict(eagle3_tensors(), t2d=every))
    assert check_eagle_head(folder, "eagle3", TARGET4).draft_vocab_size == 257
    assert load_eagle_head(folder, "eagle3", target)[1] is None  # its logits are target ids: no map to apply


def test_eagle_and_medusa_loaders_are_strict(tmp_path):
    t = eagle_tensors()
    t["layers.0.input_layernorm.weight"] = torch.ones(64)  # EAGLE's first layer has no input norm
    write_head(tmp_path / "e", eagle_config(), t, "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pytorch_model.bin: unexpected tensor layers.0.input_layernorm"):
        check_eagle_head(tmp_path / "e", "eagle", TARGET4)
    write_medusa(tmp_path / "m", V=32000)
    with pytest.raises(CheckpointError, match=r"medusa_lm_head.pt: 0.1.weight has shape \(32000, 64\) "
                                              r"but the target's vocabulary x hidden size is \(257, 64\)"):
        read_medusa_config(tmp_path / "m", TARGET4)  # the file's own name (Medusa's files carry no prefix)
    write_medusa(tmp_path / "mh", hidden_size=4096)  # a config that names the hidden size: the field, first
    with pytest.raises(CheckpointError, match=r"mh/config.json: hidden_size = 4096 but the target's is 64"):
        read_medusa_config(tmp_path / "mh", TARGET4)
    write_medusa(tmp_path / "mv", vocab_size=32000)
    with pytest.raises(CheckpointError, match=r"mv/config.json: vocab_size = 32000 but the target's is 257"):
        read_medusa_config(tmp_path / "mv", TARGET4)
    assert read_medusa_config(write_medusa(tmp_path / "mok", hidden_size=64, vocab_size=257), TARGET4).num_heads == 3
    write_medusa(tmp_path / "m2", architectures=["LlamaForCausalLM"])
    with pytest.raises(CheckpointError, match="config.json: architectures .* are not Medusa heads"):
        read_medusa_config(tmp_path / "m2", TARGET4)
    write_head(tmp_path / "m3", {"medusa_num_layers": 1}, medusa_tensors())
    with pytest.raises(CheckpointError, match="config.json: medusa_num_heads is missing"):
        read_medusa_config(tmp_path / "m3", TARGET4)
    write_medusa(tmp_path / "m4", heads=2)  # two heads' tensors, a config naming three
    (tmp_path / "m4" / "config.json").write_text('{"medusa_num_heads": 3, "medusa_num_layers": 1}')
    with pytest.raises(CheckpointError, match=r"m4/config.json: medusa_num_heads = 3 but the weight file holds 2 "
                                              r"heads \(indices 0..1\)"):
        read_medusa_config(tmp_path / "m4", TARGET4)
    # a count of 10**9 built 10**9 placeholder modules (minutes, gigabytes) before any name was compared
    (tmp_path / "m4" / "config.json").write_text('{"medusa_num_heads": 1000000000, "medusa_num_layers": 1}')
    with pytest.raises(CheckpointError, match="medusa_num_heads = 1000000000 but the weight file holds 2 heads"):
        read_medusa_config(tmp_path / "m4", TARGET4)
    (tmp_path / "m4" / "config.json").write_text('{"medusa_num_heads": 2, "medusa_num_layers": 3000000}')
    with pytest.raises(CheckpointError, match="medusa_num_layers = 3000000 but the weight file's head 0 holds 1 "
                                              "residual blocks before its LM head"):
        read_medusa_config(tmp_path / "m4", TARGET4)
    write_head(tmp_path / "e2", dict(eagle_config(), num_hidden_layers=100000), eagle_tensors(), "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"e2/config.json: num_hidden_layers = 100000 but the weight file "
                                              r"holds 2 decoder layers \(indices 0..1\)"):
        check_eagle_head(tmp_path / "e2", "eagle", TARGET4)
    pt = write_medusa(tmp_path / "m5") / "medusa_lm_head.pt"  # cut short: torch's own line spoke of mmap
    pt.write_bytes(pt.read_bytes()[:200])
    with pytest.raises(CheckpointError, match=re.escape(f"{pt}: not a PyTorch checkpoint torch.load reads (a zip "
                                                        "archive, or the format before 1.6): truncated, corrupt")):
        read_medusa_config(tmp_path / "m5", TARGET4)
    legacy = write_medusa(tmp_path / "m6") / "medusa_lm_head.pt"  # torch.save's format before 1.6 still loads
    torch.save(torch.load(legacy), legacy, _use_new_zipfile_serialization=False)
    old, new = read_medusa_config(tmp_path / "m6", TARGET4), read_medusa_config(write_medusa(tmp_path / "m7"), TARGET4)
    assert replace(old, name=new.name) == new


def test_an_eagle3_head_narrower_than_its_target_brings_its_own_embedding(tmp_path, target):
    """An EAGLE-3 head of hidden size 32 over a target of 64 (``target_hidden_size`` 64: fc reads 3 x 64) cannot
    read the target's (V, 64) token embedding. Without ``embed_tokens.weight`` it passed every check, loaded, and
    its first draft failed in RMSNorm (a torch RuntimeError, exit 1, after the target had loaded and run); it is
    refused by the header check, naming the file and the tensor. With its own (V, 32) embedding it decodes."""
    t = eagle3_tensors(H=32, Ht=64, hd=8)
    cfg = eagle3_config(H=32, hd=8, target_hidden_size=64)
    folder = write_head(tmp_path / "narrow", cfg, t)
    with pytest.raises(CheckpointError) as err:
        check_eagle_head(folder, "eagle3", TARGET4)
    assert str(err.value) == (f"{folder / 'model.safetensors'}: missing tensor embed_tokens.weight: the head's "
                              "hidden size (32) is not the target's (64), so it cannot read the target's token "
                              "embedding and must bring its own (257, 32)")
    emb = torch.randn(257, 32, generator=torch.Generator().manual_seed(0))
    folder = write_head(tmp_path / "own", cfg, dict(t, **{"embed_tokens.weight": emb}))
    head, ids = load_eagle_head(folder, "eagle3", target)
    assert ids is None and torch.equal(head.embedding, emb)
    out = Decoder(target, StaticTreePolicy(EagleDrafter(head, 4, ids), Tree.chain(3))).generate(PROMPT, 12)
    assert out.tokens == _greedy(target, PROMPT, 12) and max(s.tree_depth for s in out.steps) >= 1


def test_loader_messages_name_the_files_own_tensors_and_refuse_nan_anywhere(tmp_path, target):
    """A tryout's break-it pass: an unprefixed Medusa file (Medusa's own medusa_lm_head layout) was refused with
    names it does not hold (``medusa_head.foo`` for its ``foo``); a file mixing prefixed and bare names read as a
    wrong head count; an EAGLE-3 head's own NaN ``embed_tokens.weight`` loaded silently and drafted garbage."""
    cases = {"shape": lambda t: t.update({"1.0.linear.weight": torch.zeros(64, 32)}),
             "extra": lambda t: t.update({"foo": torch.zeros(2)}),
             "missing": lambda t: t.pop("1.0.linear.bias")}
    for name, edit in cases.items():
        t = medusa_tensors()
        edit(t)
        write_head(tmp_path / name, {"medusa_num_heads": 3, "medusa_num_layers": 1}, t, "medusa_lm_head.safetensors")
    want = {"shape": "tensor 1.0.linear.weight has shape (64, 32), the layout needs (64, 64)",
            "extra": "unexpected tensor foo", "missing": "missing tensor 1.0.linear.bias"}
    for name, message in want.items():
        with pytest.raises(CheckpointError) as err:
            read_medusa_config(tmp_path / name, TARGET4)
        assert str(err.value) == f"{tmp_path / name / 'medusa_lm_head.safetensors'}: {message}"
    t = medusa_tensors()
    t = {("medusa_head." + k if k.startswith("0.") else k): v for k, v in t.items()}  # head 0 prefixed, 1-2 bare
    write_head(tmp_path / "mixed", {"medusa_num_heads": 3, "medusa_num_layers": 1}, t, "medusa_lm_head.safetensors")
    with pytest.raises(CheckpointError, match=r"mixed/medusa_lm_head.safetensors: tensor 1.0.linear.bias has no "
                                              r"'medusa_head.' prefix where others have it"):
        read_medusa_config(tmp_path / "mixed", TARGET4)
    # NaN in the head's own embedding (optional in the layout) is refused as NaN in any other tensor
    t = eagle3_tensors(draft_ids=DRAFT_IDS)
    for key, where in (("embed_tokens.weight", "embed_tokens.weight"), ("fc.weight", "fc.weight")):
        bad = dict(t, **{"embed_tokens.weight": torch.zeros(257, 64)})
        bad[key] = torch.full_like(bad[key], float("nan"))
        folder = write_head(tmp_path / f"nan-{where}", eagle3_config(Vd=len(DRAFT_IDS)), bad)
        with pytest.raises(CheckpointError, match=re.escape(f"model.safetensors: tensor {where} holds NaN")):
            load_eagle_head(folder, "eagle3", target)


# ---------------------------------------------------------------------------------------------- cached drafting
def _settings(face, depth, greedy=True, batch=1):
    return DraftSettings(device=torch.device("cpu"), max_len=face.max_len, backend="torch",
                         temperature=0.0 if greedy else 1.0, top_p=1.0, generator=torch.Generator().manual_seed(0),
                         tree_depth=depth, max_batch=batch, target=face)


def _greedy(target, seq, n):
    return Decoder(target).generate(seq, n).tokens


@pytest.mark.parametrize("kind", ["eagle3", "eagle"])
def test_cached_drafting_matches_the_reference_step_by_step(heads, target, kind):
    """A decode driven by hand with accepted paths of 0..3 drafted nodes and steps the drafter skips: at every
    step the drafter's logits at the root and along a chain (its catch-up chunk, its cache, the committed
    paths' features from the face) equal a from-scratch reference over the whole sequence."""
    head, ids = load_eagle_head(heads[kind], kind, target)
    drafter = EagleDrafter(head, 4, ids)
    face = TransformerTarget(target, max_len=128)
    drafter.bind(_settings(face, 3))
    tens = _tensors(heads[kind])
    ref = (RefEagle3(tens, target.embed_tokens.weight.detach()) if kind == "eagle3" else
           RefEagle(tens, target.embed_tokens.weight.detach(), target.lm_head.weight.detach()))
    layers = drafter.layers
    seq = list(PROMPT)
    cont = _greedy(target, seq, 40)
    face.prefill([seq])
    row = RowState(seq=list(seq), cached=len(seq) - 1, max_new_tokens=40, result=GenerationResult([], len(seq)))
    state = DecodeState(rows=[row], results=[row.result])
    drafter.prefill(state)
    anc = torch.ones(4, 4, dtype=torch.bool).tril()
    plan = [3, 0, 2, None, 1, 3, None, None, 0, 2]  # drafted nodes accepted; None: the drafter is not asked
    done = 0
    for accept in plan:
        L = row.cached
        chain = [row.root] + cont[done: done + 3]
        if accept is not None:
            got = drafter.score_nodes(row, torch.tensor(chain), torch.arange(4), anc, [0, 1, 2, 3], True)
            feats = _ref_features(target, row.seq, layers)  # (L + 1, k, H)
            seen, want = [], []
            for j in range(1, L + 1):  # committed items: x_j with f_{j-1}
                lg, h, kv = ref.item(row.seq[j], ref.fuse(feats[j - 1]), j - 1, seen)
                seen.append(kv)
            want.append(lg)
            for d in range(1, 4):  # the chain: each node's input is its parent's output
                lg, h, kv = ref.item(chain[d], h, L - 1 + d, seen)
                seen.append(kv)
                want.append(lg)
            want = torch.stack(want)
            if ids is not None:
                full = torch.full((4, 257), float("-inf"))
                full[:, ids] = want
                want = full
            fin = torch.isfinite(want)
            assert torch.equal(torch.isfinite(got), fin)
            # float32 summation order only: the random weights make logits of ~100
            assert (got[fin] - want[fin]).abs().max() <= 1e-4 * want[fin].abs().max()
        n = 1 + (accept or 0)
        tree = StepTree.static(TreeBuffers.build(Tree.chain(4), "cpu"), torch.tensor(chain))
        face.verify(state, [tree])
        path = list(range(n))
        face.commit(state, [path])
        drafter.commit(state, [path], 3 if accept is not None else 0)
        row.seq.extend(chain[1:n] + [cont[done + n - 1]])
        row.cached += n
        done += n
    assert row.seq == list(PROMPT) + cont[:done]


def test_batched_proposals_match_each_row_alone(heads, target):
    """Three rows of different lengths in one batched propose per step (padding, holes, repacks) give each row
    the tree it gets alone (every step the whole tree: a batch cuts it at its rows' largest tokens left, a row
    alone at its own, which is not what is compared here)."""
    head, ids = load_eagle_head(heads["eagle3"], "eagle3", target)
    tree = Tree.from_choices([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
    prompts = [PROMPT, [3, 4], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11, 12]]

    def policy():
        return StaticTreePolicy(EagleDrafter(head, 4, ids), tree, cut_at_answer_end=False)

    one = [Decoder(target, policy()).generate(p, 24) for p in prompts]
    batch = Decoder(target, policy(), max_batch=3).generate_batch(prompts, 24)
    plain = [_greedy(target, p, 24) for p in prompts]
    assert [r.tokens for r in batch.results] == [r.tokens for r in one] == plain
    assert [[s.tree_size for s in r.steps] for r in batch.results] == [[s.tree_size for s in r.steps] for r in one]


# ---------------------------------------------------------------------------------------------- exact decoding
def _make(kind, heads, target):
    if kind == "medusa":
        return lambda: MedusaDrafter(load_medusa_heads(heads["medusa"], target), 4, context=512)
    head, ids = load_eagle_head(heads[kind], "eagle3" if kind.startswith("eagle3") else kind, target)
    return lambda: EagleDrafter(head, 4, ids, context=512)


class _EveryOther(GraftScheduler):
    def __init__(self):
        self.n = 0

    def decide(self, features) -> bool:
        self.n += 1
        return self.n % 2 == 1


def _shared_tree_policies(make) -> dict:
    """The policies that grow one shared tree per step, each with a fresh head from ``make``: a chain, a dynamic
    rule, and the head as graft's strong and as its light drafter (prompt lookup the other)."""
    return {"chain": ChainPolicy(make(), 3),
            "dynamic": DynamicPolicy(make(), parse_setting("eagle:steps=3,topk=2,budget=6")),
            "graft (strong)": GraftPolicy(PromptLookupDrafter(257), make(), Tree.from_choices([[0], [1], [1, 0]]),
                                          [0, 0, 1, 1]),
            "graft (light)": GraftPolicy(make(), PromptLookupDrafter(257), Tree.from_choices([[0], [1], [0, 0]]),
                                         [0, 0, 1, 0])}


@pytest.mark.parametrize("kind", ["eagle3", "eagle3-full", "eagle", "medusa"])
def test_greedy_output_is_plain_decoding_with_every_policy(heads, target, kind):
    make = _make(kind, heads, target)
    plain = _greedy(target, PROMPT, 30)
    tree = Tree.from_choices([[0], [1], [0, 0], [0, 1], [0, 0, 0]])
    policies = {"static": StaticTreePolicy(make(), tree), **_shared_tree_policies(make)}
    for name, policy in policies.items():
        out = Decoder(target, policy).generate(PROMPT, 30)
        assert out.tokens == plain, name
    # a scheduler that calls the strong head every other step: the steps it skips still reach it (commit with
    # step depth 0), so its features stay complete and it keeps drafting
    graft = GraftPolicy(PromptLookupDrafter(257), make(), Tree.from_choices([[0], [1], [1, 0]]), [0, 0, 1, 1],
                        scheduler=_EveryOther())
    out = Decoder(target, graft).generate(PROMPT, 30)
    calls = [s.drafter_calls[1] for s in out.steps]
    assert out.tokens == plain and 0 < sum(calls) < len(calls)
    if kind == "medusa":  # depth beyond the heads: a static tree and a dynamic setting are clipped to 3 levels
        deep = Decoder(target, StaticTreePolicy(make(), Tree.chain(5))).generate(PROMPT, 12)
        assert deep.tokens == plain[:12] and max(s.tree_depth for s in deep.steps) == 3
        for rule in ("eagle:steps=4,topk=1,budget=5", "best-first:steps=6,topk=2,budget=8"):
            dyn = Decoder(target, DynamicPolicy(make(), parse_setting(rule))).generate(PROMPT, 12)
            assert dyn.tokens == plain[:12] and max(s.tree_depth for s in dyn.steps) == 3, rule


def test_medusa_deeper_than_its_heads_is_refused_where_a_policy_places_its_nodes(heads, target):
    """Medusa's K = 3 heads propose depths 1..3. A merge whose Medusa tree was 4 deep made every step the root alone
    (plain decoding, no word); a grafted tree whose Medusa part reached depth 4 failed at its first step. Both are
    refused when the policy is built, naming the drafter, its K and the option; at depth 3 both speculate."""
    from sequoia_opt.drafting.policies import MergePolicy

    make = _make("medusa", heads, target)
    deep, fits = Tree.chain(5), Tree.chain(4)  # n nodes: depths 4 and 3
    with pytest.raises(DecodingError, match=r"the Medusa heads 'md' can propose depths 1\.\.3 only, but its tree in "
                                            r"the merge \(m\) "
                                            r"gives it nodes at depth 4: solve that tree with depth 3 or less "
                                            r"\(solve's --max-depth\)"):
        MergePolicy([PromptLookupDrafter(257), make()], [Tree.chain(2), deep], ["l", "m"])
    # the strong part of a grafted tree at depth 4 (lookup's spine 0-1-2, Medusa's node under depth 3)
    plan, lab = Tree.from_choices([[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]), [0, 0, 0, 0, 1]
    with pytest.raises(DecodingError, match=r"can propose depths 1\.\.3 only, but the grafted tree's strong part gives it "
                                            r"nodes at depth 4: solve that tree with depth 3 or less \(profile graft's and "
                                            r"solve's --max-depth for a grafted tree\)"):
        GraftPolicy(PromptLookupDrafter(257), make(), plan, lab)
    plain = _greedy(target, PROMPT, 16)
    for policy in (MergePolicy([PromptLookupDrafter(257), make()], [Tree.chain(2), fits], ["l", "m"]),
                   GraftPolicy(PromptLookupDrafter(257), make(), Tree.from_choices([[0], [0, 0], [0, 0, 0]]),
                               [0, 0, 1, 1])):
        out = Decoder(target, policy).generate(PROMPT, 16)
        assert out.tokens == plain and sum(s.drafter_calls[1] for s in out.steps) > 0
        assert max(s.tree_depth for s in out.steps) == 3


@pytest.mark.parametrize("kind", ["eagle3", "eagle", "medusa"])
def test_a_one_token_prompt_decodes_with_every_shared_tree_policy(heads, target, kind):
    """A 1-token prompt's first root has no target feature before it: the static policy made that step plain, but
    the chain, dynamic and graft policies asked the head anyway (EAGLE: 'holds target features for 0 of 0';
    Medusa: AttributeError). Every policy now makes that step root-only (Drafter.shared_depth), then drafts."""
    make = _make(kind, heads, target)
    plain = _greedy(target, [5], 12)
    for name, policy in _shared_tree_policies(make).items():
        out = Decoder(target, policy).generate([5], 12)
        assert out.tokens == plain, name
        assert out.steps[0].tree_depth == 0 and max(st.tree_depth for st in out.steps) >= 1, name
    if kind == "medusa":  # a chain longer than its 3 heads is clipped to 3 (the docs' rule), as a static tree is
        out = Decoder(target, ChainPolicy(make(), 6)).generate(PROMPT, 12)
        assert out.tokens == _greedy(target, PROMPT, 12) and max(st.tree_depth for st in out.steps) == 3


@pytest.mark.parametrize("kind", ["eagle3", "eagle", "medusa"])
def test_rows_joining_a_running_batch_decode_as_alone(heads, target, kind):
    """Continuous batching with a feature head (issue 29's stream): a request joins between steps, the face keeps
    its prompt's hidden states and the head takes them in (EagleDrafter / MedusaDrafter.join); every request's
    greedy output is plain decoding's of it alone, while rows of other lengths run and leave."""
    make = _make(kind, heads, target)
    prompts = [PROMPT, [9, 8, 7], list(range(30, 52)), [200, 3, 3, 9, 41], [11]]
    lens = [18, 10, 14, 8, 12]
    dec = Decoder(target, StaticTreePolicy(make(), Tree.from_choices([[0], [1], [0, 0]])), max_len=256, max_batch=3)
    state = dec.start_batch([prompts[0]], lens[0])
    waiting, steps, batches = list(range(1, len(prompts))), 0, []
    while waiting or not state.finished:
        if waiting and state.batch < dec.max_batch and (steps % 2 == 0 or state.finished):
            i = waiting.pop(0)
            dec.join(state, [prompts[i]], lens[i])
        if not state.finished:
            batches.append(dec.step(state).batch)
            steps += 1
    assert [r.tokens for r in state.results] == [_greedy(target, p, n) for p, n in zip(prompts, lens)]
    assert max(batches) == 3 and batches[0] == 2  # the second request joined before the first step
    drafted = [s.tree_size for r in state.results for s in r.steps]
    assert max(drafted) == 4  # the joiners drafted full trees, not plain steps


def test_a_missed_commit_is_refused_not_guessed(heads, target):
    head, ids = load_eagle_head(heads["eagle3"], "eagle3", target)
    dec = Decoder(target, StaticTreePolicy(EagleDrafter(head, 4, ids), Tree.chain(2)))
    state = dec.start(PROMPT, 8)
    dec.step(state)
    state.rows[0].seq.append(1)  # a token the drafter never heard of
    state.rows[0].cached += 1
    with pytest.raises(DecodingError, match="a step's commit did not reach it"):
        dec.step(state)


def _micro(tmp_path, kind):
    """A 5-token target with spread distributions and a head for it: EAGLE-3 with a draft vocabulary of 3 of the
    5 ids, or 2 Medusa heads."""
    from sequoia_opt.model import ModelConfig

    cfg = ModelConfig(vocab_size=5, dim=16, n_layers=4, n_heads=2, n_kv_heads=1, intermediate_size=32,
                      max_position_embeddings=32, name="micro")  # 4 layers: 3 distinct layers for EAGLE-3 to fuse
    tgt = random_target(cfg, seed=7, std=0.3)
    if kind == "medusa":
        write_head(tmp_path / "mm", {"medusa_num_heads": 2, "medusa_num_layers": 1},
                   medusa_tensors(H=16, V=5, heads=2, seed=6), "medusa_lm_head.pt")
        heads = load_medusa_heads(tmp_path / "mm", tgt)
        return tgt, lambda: MedusaDrafter(heads, 3, context=32)
    t = eagle3_tensors(H=16, Ht=16, V=5, draft_ids=[0, 2, 4], heads=2, kv=1, hd=8, inter=32, seed=6)
    write_head(tmp_path / "em", eagle3_config(H=16, V=5, Vd=3, heads=2, kv=1, hd=8, inter=32, ids=(0, 1, 2),
                                              max_position_embeddings=32), t)
    head, ids = load_eagle_head(tmp_path / "em", "eagle3", tgt)
    return tgt, lambda: EagleDrafter(head, 3, ids, context=32)


@pytest.mark.parametrize("kind", ["eagle3", "medusa"])
@pytest.mark.parametrize("trials", [pytest.param(600, id="fast"),
                                    pytest.param(40_000, id="long", marks=pytest.mark.slow)])
def test_sampling_follows_the_target(tmp_path, kind, trials):
    """Over seeded generations of two tokens, the joint law of the two tokens is the target's own temperature /
    top-p sampling law (computed exactly), while the head's q differs from p (acceptance and the residual both
    run; the EAGLE-3 head cannot even propose 2 of the 5 ids)."""
    from sequoia_opt.decoding.sampling import process_logits

    tgt, make = _micro(tmp_path, kind)
    prompt, T, top_p = [2, 4, 1, 3], 1.0, 0.95
    with torch.inference_mode():
        p1 = process_logits(tgt(torch.tensor([prompt]))[0, -1], T, top_p)  # (5,)
        exact = torch.stack([p1[a] * process_logits(tgt(torch.tensor([prompt + [a]]))[0, -1], T, top_p)
                             for a in range(5)])  # (5, 5) joint law of the first two tokens
    dec = Decoder(tgt, StaticTreePolicy(make(), Tree.from_choices([[0], [1], [0, 0]])), temperature=T, top_p=top_p)
    counts = torch.zeros(5, 5)
    accepted = 0
    for s in range(trials):
        dec.generator = torch.Generator().manual_seed(s)
        out = dec.generate(prompt, 2)
        counts[out.tokens[0], out.tokens[1]] += 1
        accepted += out.steps[0].accepted_nodes
    tv = 0.5 * (counts / trials - exact).abs().sum().item()
    tv1 = 0.5 * (counts.sum(1) / trials - exact.sum(1)).abs().sum().item()  # the first token alone
    assert accepted > 0.1 * trials  # the head's candidates were accepted often: the acceptance rule ran
    # sampling noise: over 25 outcomes ~0.06 at 600 trials (catches wiring errors) and ~0.01 at 40k (the slow
    # run); over the first token's 5, ~0.004 at 40k
    assert tv < (0.12 if trials < 10_000 else 0.015), tv
    assert tv1 < (0.08 if trials < 10_000 else 0.01), tv1
