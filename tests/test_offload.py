"""Offloading regime: the cost model on synthetic bandwidths (flat T(n) while the copy hides compute, the
pipeline formula, the deep narrow trees solve chooses there), the offload mode's layer streaming on CPU (same
logits and greedy output as the resident model; one copy per layer per forward), its double-buffered schedule
checked for races with recorded streams (vector clocks: every compute waits for its weights' copy, no copy
overwrites a slot a compute still reads, for even and odd layer counts), the copy timing leaving the slots
consistent, and the refusals without CUDA."""

from __future__ import annotations

import copy

import pytest
import torch

from sequoia_opt.decoding import AutoregressiveDecoder
from sequoia_opt.drafting import SpeculativeDecoder
from sequoia_opt.errors import ProfileError
from sequoia_opt.model import ModelConfig, Transformer
from sequoia_opt.model.offload import layer_bytes, offload_layers
from sequoia_opt.profiles import LatencyCurve
from sequoia_opt.solver import choose
from sequoia_opt.solver.offload import OffloadModel, offload_curve, roofline_layer_ms, synthetic_offload_model
from sequoia_opt.tree import Tree

P = [0.52, 0.12, 0.06, 0.04, 0.03, 0.02, 0.015, 0.01]  # a Sequoia-like positional vector
NS = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def test_pipeline_formula_and_flat_curve_while_transfer_bound():
    # 10 layers of 100 MB over 20 GB/s: 5 ms per copy; compute 0.5 ms + 0.02 ms per token
    m = OffloadModel(n_layers=10, layer_bytes=100e6, h2d_gbps=20.0,
                     layer_compute_ms={n: 0.5 + 0.02 * n for n in NS}, resident_ms={n: 0.1 for n in NS},
                     overhead_ms=0.3)
    assert m.transfer_ms == pytest.approx(5.0)
    # transfer-bound (c(n) <= 5 ms up to n = 225): first copy + 9 x copy + last compute + resident + overhead
    for n in (1, 64, 128):
        assert m.target_ms(n) == pytest.approx(5.0 + 9 * 5.0 + (0.5 + 0.02 * n) + 0.1 + 0.3)
    assert m.target_ms(128) / m.target_ms(1) < 1.06  # flat far past 64 tokens
    assert m.transfer_bound_until() == 128
    c256 = 0.5 + 0.02 * 256  # compute-bound at 256: the copies hide behind compute
    assert m.target_ms(256) == pytest.approx(5.0 + 9 * c256 + c256 + 0.4)
    # the same layers resident-speed link (1000 GB/s): compute dominates from n = 1
    fast = OffloadModel(10, 100e6, 1000.0, {n: 0.5 + 0.02 * n for n in NS})
    assert fast.target_ms(256) / fast.target_ms(1) > 5
    with pytest.raises(ProfileError, match="outside the measured range"):
        m.target_ms(512)
    with pytest.raises(ProfileError, match="h2d_gbps > 0"):
        OffloadModel(10, 100e6, 0.0, {1: 1.0})


def test_solve_chooses_deep_narrow_trees_when_offloaded():
    """Llama-2-7B (fp16) on an L40-like GPU: offloaded over PCIe 4 (25 GB/s) against resident. Offloaded, T(n)
    is flat to hundreds of tokens and the draft (resident) is cheap next to it, so the tree is much deeper and
    bigger, and its speedup far larger (Sequoia section 4's offloading regime)."""
    cfg = ModelConfig.preset("llama-2-7b")
    off = synthetic_offload_model(cfg, NS, h2d_gbps=25.0, tflops=180.0, hbm_gbps=860.0, context=256)
    draft = {w: 0.6 + 0.002 * w for w in NS}  # a 68M draft on the device
    curve = offload_curve(off, NS, draft, step_overhead_ms=0.5, context=256, profile_id="offload-7b")
    assert curve.target_ms(256) / curve.target_ms(1) < 1.1
    assert curve.device["offload"]["h2d_gbps"] == 25.0 and curve.device["offload"]["n_layers"] == 32
    # resident on the same GPU: weights from HBM each layer; compute-bound past ~100 tokens
    res = {n: sum(roofline_layer_ms(n, dim=4096, intermediate=11008, n_heads=32, n_kv_heads=32, head_dim=128,
                                    context=256, bytes_per_param=2, tflops=180.0, hbm_gbps=860.0)
                  for _ in range(32)) for n in NS}
    resident = LatencyCurve.synthetic(res, draft, step_overhead_ms=0.5, context=256, id="resident-7b")
    a = choose(P, curve, 256, 16)
    b = choose(P, resident, 256, 16)
    assert a.tree.tree_depth >= 8 and a.tree.tree_depth > b.tree.tree_depth
    assert a.tree.size > b.tree.size
    assert a.speedup > b.speedup > 1


def test_offload_mode_streams_layers_and_keeps_output(tmp_path):
    cfg = ModelConfig.preset("tiny").with_(n_layers=3)
    torch.manual_seed(0)
    ref = Transformer(cfg).eval()
    model = copy.deepcopy(ref)
    nbytes = layer_bytes(model)
    state = offload_layers(model, "cpu")
    assert len(state.host) == 3 and len(state.slots) == 2 and nbytes == sum(t.numel() * 4 for t in state.host[0].values())
    toks = torch.randint(0, cfg.vocab_size, (2, 7))
    assert state.copies == 2  # the first forward's layers 0 and 1, prefetched by offload_layers
    with torch.inference_mode():
        torch.testing.assert_close(model(toks), ref(toks))
        before = state.copies
        torch.testing.assert_close(model(toks), ref(toks))
    assert state.copies - before == 3  # one copy per layer per forward
    prompt = [3, 14, 15, 92, 65]
    plain = AutoregressiveDecoder(ref, max_len=64).generate(prompt, 12).tokens
    assert AutoregressiveDecoder(model, max_len=64).generate(prompt, 12).tokens == plain
    draft = Transformer(cfg.with_(n_layers=1)).eval()
    assert SpeculativeDecoder(model, draft, Tree.chain(4), max_len=64).generate(prompt, 12).tokens == plain
    with pytest.raises(ValueError, match="already in offload mode"):
        offload_layers(model, "cpu")


def test_offload_profiling_refuses_without_cuda():
    from sequoia_opt.profiling.offload import measure_h2d_gbps, profile_offload

    with pytest.raises(ProfileError, match="not CUDA"):
        measure_h2d_gbps(torch.device("cpu"))
    m = Transformer(ModelConfig.preset("tiny")).eval()
    with pytest.raises(ProfileError, match="not CUDA"):
        profile_offload(m, None, [1, 2], [1], 8, device=torch.device("cpu"), target_name="t", draft_name=None,
                        profile_id="x", dtype=torch.float32)


def test_gpu_offload_script_dry_run(tmp_path):
    """benchmarks/offload_gpu.py (what gpu_check.sh runs) end to end on a CPU: offload mode, solve, decode."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).parent.parent / "benchmarks" / "offload_gpu.py"
    spec = importlib.util.spec_from_file_location("offload_gpu", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--dry-run", "--out-dir", str(tmp_path), "--new-tokens", "4"]) == 0
    doc = json.loads((tmp_path / "offload.json").read_text())
    assert doc["dry_run"] and doc["decode"]["greedy_exact"] and doc["solved"]["nodes"] >= 2
    assert (tmp_path / "offload-latency.yaml").is_file()


class RecordingStreams:
    """The offload schedule's stream operations recorded with vector clocks (two streams: compute, copy), as
    CUDA would order them: ops on one stream in issue order, ``wait_stream`` and event waits joining clocks.
    Copies still happen at once (so outputs stay checkable); :meth:`races` finds what CUDA could reorder."""

    COMPUTE, COPY = 0, 1

    def __init__(self) -> None:
        self.clock = [[0, 0], [0, 0]]
        self.ops: list[dict] = []  # {"kind": "copy"|"compute", "stream", "slot", "layer", "clock"}
        self.state = None

    def _issue(self, stream: int, **op) -> dict:
        self.clock[stream][stream] += 1
        op.update(stream=stream, clock=list(self.clock[stream]))
        self.ops.append(op)
        return op

    def _slot_layer(self, dst, src) -> tuple[int, int]:
        st = self.state
        slot = next(i for i, b in enumerate(st.slots) if all(dst[k] is p for k, p in b.named_parameters()))
        layer = next(i for i, h in enumerate(st.host) if h is src)
        return slot, layer

    def copy(self, dst, src):
        self.clock[self.COPY] = [max(a, b) for a, b in zip(self.clock[self.COPY], self.clock[self.COMPUTE])]
        slot, layer = self._slot_layer(dst, src)
        for name, t in src.items():
            dst[name].data.copy_(t)
        op = self._issue(self.COPY, kind="copy", slot=slot, layer=layer)
        return list(op["clock"])  # the event: the copy stream's clock at the record

    def copy_now(self, dst, src):
        slot, layer = self._slot_layer(dst, src)
        for name, t in src.items():
            dst[name].data.copy_(t)
        self._issue(self.COMPUTE, kind="copy", slot=slot, layer=layer)

    def wait(self, token):
        if token is not None:
            self.clock[self.COMPUTE] = [max(a, b) for a, b in zip(self.clock[self.COMPUTE], token)]

    def compute(self, slot, layer):
        self._issue(self.COMPUTE, kind="compute", slot=slot, layer=layer)

    @staticmethod
    def before(a: dict, b: dict) -> bool:
        """a happens before b."""
        return a is not b and a["clock"][a["stream"]] <= b["clock"][a["stream"]]

    def races(self) -> list[str]:
        """Every compute must read the layer it runs: the last copy issued into its slot before it is of that
        layer and happens before it, and every other copy into the slot happens before that copy or after the
        compute."""
        found = []
        for i, c in enumerate(self.ops):
            if c["kind"] != "compute":
                continue
            into = [o for o in self.ops[:i] if o["kind"] == "copy" and o["slot"] == c["slot"]]
            if not into or into[-1]["layer"] != c["layer"] or not self.before(into[-1], c):
                found.append(f"op {i}: layer {c['layer']} computes in slot {c['slot']} without its weights there")
                continue
            w = into[-1]
            for o in self.ops:
                if o["kind"] == "copy" and o["slot"] == c["slot"] and o is not w:
                    if not (self.before(o, w) or self.before(c, o)):
                        found.append(f"op {i}: a copy of layer {o['layer']} into slot {c['slot']} races with "
                                     f"layer {c['layer']}'s compute")
        return found


def _recorded(n_layers: int):
    """A tiny model, its offloaded copy whose stream operations are recorded, the state and the recorder."""
    cfg = ModelConfig.preset("tiny").with_(n_layers=n_layers)
    torch.manual_seed(n_layers)
    ref = Transformer(cfg).eval()
    model = copy.deepcopy(ref)
    rec = RecordingStreams()
    st = offload_layers(model, "cpu")
    rec.state = st  # the recorder names slots and layers through the state
    for slot, layer in enumerate(st.resident):  # offload_layers' prefetches, as copies on the copy stream
        rec._issue(rec.COPY, kind="copy", slot=slot, layer=layer)
        st.ready[slot] = list(rec.clock[rec.COPY])
    st.streams = rec
    return ref, model, st, rec


@pytest.mark.parametrize("n_layers", [1, 2, 3, 4, 5])
def test_offload_schedule_has_no_race_for_any_layer_count(n_layers):
    ref, model, st, rec = _recorded(n_layers)
    toks = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        for _ in range(3):
            torch.testing.assert_close(model(toks), ref(toks))
        # a forward over the first k layers only (the self layer-skip draft) breaks the prefetch order
        k = max(1, n_layers - 1)
        torch.testing.assert_close(model(toks, num_layers=k), ref(toks, num_layers=k))
        torch.testing.assert_close(model(toks), ref(toks))
    computes = [o for o in rec.ops if o["kind"] == "compute"]
    assert len(computes) == 4 * n_layers + k
    assert rec.races() == []
    if n_layers == 3:  # odd: the slot of layer 0 alternates between forwards (the parity flips)
        assert [o["slot"] for o in computes if o["layer"] == 0][:3] == [0, 1, 0]


def test_race_checker_finds_the_index_parity_schedule():
    """The schedule before the fix (layer l always in slot l % 2, prefetch of l + 2 into slot (l + 2) % 2) with 3
    layers: layer 1's prefetch of layer 0 lands in slot 0 while layer 2 still needs it. The checker sees it."""
    rec = RecordingStreams()
    ready = {}

    def copy(slot, layer):
        rec.clock[1] = [max(a, b) for a, b in zip(rec.clock[1], rec.clock[0])]
        ready[layer] = list(rec._issue(rec.COPY, kind="copy", slot=slot, layer=layer)["clock"])

    copy(0, 0)
    copy(1, 1)
    for _ in range(2):
        for layer in range(3):
            rec.wait(ready[layer])
            rec.compute(layer % 2, layer)
            copy(((layer + 2) % 3) % 2, (layer + 2) % 3)
    assert rec.races()
    assert any("layer 2 computes in slot 0 without its weights" in r for r in rec.races())


def test_copy_timing_leaves_the_slots_consistent():
    """profile_offload times one layer's copy into slot 0 (layer 1 there); the next forward must copy layer 0
    back instead of computing layer 0 with layer 1's weights."""
    from sequoia_opt.profiling.offload import time_layer_copy

    ref, model, st, rec = _recorded(3)
    ms = time_layer_copy(st, "cpu", warmup=1, min_repeats=2, max_repeats=2)
    assert ms > 0 and st.resident[0] == 1
    toks = torch.randint(0, 256, (1, 4), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        torch.testing.assert_close(model(toks), ref(toks))
    assert rec.races() == []


def test_first_mismatch_reports_the_margin(monkeypatch):
    """A greedy mismatch on random weights may be a near-tie: offload_gpu.py records where the outputs first differ
    and the target's margins there, and calls it a near-tie only under NEAR_TIE of the top logit."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent.parent / "benchmarks" / "offload_gpu.py"
    spec = importlib.util.spec_from_file_location("offload_gpu_mm", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = Transformer(ModelConfig.preset("tiny")).eval()
    prompt = [5, 9, 2, 77]
    plain = AutoregressiveDecoder(model, max_len=32).generate(prompt, 6).tokens
    assert mod.first_mismatch(model, prompt, plain, list(plain)) is None
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + plain[:3]]))[0, -1]
    second = int(torch.topk(logits, 2).indices[1])
    tree = plain[:3] + [second] + plain[4:]
    mm = mod.first_mismatch(model, prompt, plain, tree)
    top = torch.topk(logits.float(), 2).values
    assert mm["index"] == 3 and mm["plain_token"] == plain[3] and mm["tree_token"] == second
    assert mm["top2_margin"] == pytest.approx(float(top[0] - top[1]), abs=1e-5)
    assert mm["pair_margin"] == pytest.approx(mm["top2_margin"], abs=1e-5)  # the runner-up was chosen
    monkeypatch.setattr(mod, "NEAR_TIE", 1e9)
    assert mod.first_mismatch(model, prompt, plain, tree)["verdict"] == "near-tie"
    monkeypatch.setattr(mod, "NEAR_TIE", 0.0)
    assert mod.first_mismatch(model, prompt, plain, tree)["verdict"] == "mismatch"
    assert mod.first_mismatch(model, prompt, plain, plain[:4])["note"] == "one output is longer"
