"""Offload mode of the bundled decoder: the target's decoder layers live in (pinned) host memory and stream
to the device each forward, the next layer's copy overlapped with the current layer's compute on a side
stream (FlexGen, Sheng et al. 2023; the offloading regime of Sequoia, Chen et al. 2024, section 4 and its
offloading experiments, where T(n) is flat far past 64 tokens because every forward pays for the weights'
transfer, so deep, narrow trees win).

:func:`offload_layers` rewrites a :class:`~sequoia_opt.model.Transformer` in place: the embeddings, final norm
and LM head stay on the device (resident), every block's parameters move to host memory (pinned on CUDA), and
each block is replaced by a :class:`StreamedBlock` that runs its computation in one of two device-side weight
slots (double buffering):

* layer l computes in slot ``l % 2``, after waiting (on the compute stream) for the event of its copy;
* once layer l's compute is enqueued, the copy stream waits for it and copies layer ``l + 2`` into the same
  slot, so the copy of layer l + 1 (issued when layer l - 1 finished) runs while layer l computes;
* the last two layers start the copies of layers 0 and 1 for the next forward, which then overlap with the
  LM head, the decoder's bookkeeping and the draft.

The model's forward, KV caches (on the device), masks and every decoder work unchanged: an offloaded target is
passed to :class:`~sequoia_opt.decoding.loop.Decoder` as it is. On a CPU
device the same code runs without streams or pinning (the copies are synchronous), which is how the slot
logic is tested on machines without a GPU; only CUDA overlaps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from .llama import Block, Transformer

__all__ = ["offload_layers", "StreamedBlock", "OffloadState", "layer_bytes"]


@dataclass
class OffloadState:
    """What the streamed blocks of one model share: host copies of every layer, the two device slots, the
    copy stream and per-layer copy events (None on CPU).

    Attributes:
        host: per layer, ``{param name: host tensor}`` (pinned on CUDA).
        slots: two device-side :class:`Block` modules whose parameters receive the copies.
        device: the device computing.
        copy_stream: the side stream of the copies (CUDA only).
        ready: per layer, the event recorded after its copy (CUDA only).
        copies: copies issued so far (tests count them).
    """

    host: list[dict[str, torch.Tensor]]
    slots: list[Block]
    device: torch.device
    copy_stream: object | None = None
    ready: list[object | None] = field(default_factory=list)
    copies: int = 0

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def prefetch(self, layer: int) -> None:
        """Copy layer ``layer``'s weights into slot ``layer % 2`` (on the copy stream, after the compute
        stream's work so far, which may still read that slot: the layer two before)."""
        slot = self.slots[layer % 2]
        params = dict(slot.named_parameters())
        if self.cuda:
            compute = torch.cuda.current_stream(self.device)
            self.copy_stream.wait_stream(compute)
            with torch.cuda.stream(self.copy_stream):
                for name, src in self.host[layer].items():
                    params[name].data.copy_(src, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(self.copy_stream)
            self.ready[layer] = ev
        else:
            for name, src in self.host[layer].items():
                params[name].data.copy_(src)
        self.copies += 1

    def wait(self, layer: int) -> None:
        """Make the compute stream wait for layer ``layer``'s copy (issuing it first if nobody did)."""
        if self.cuda:
            if self.ready[layer] is None:
                self.prefetch(layer)
            torch.cuda.current_stream(self.device).wait_event(self.ready[layer])
            self.ready[layer] = None


class StreamedBlock(nn.Module):
    """Layer ``index`` of an offloaded model: waits for its weights, runs in its slot, then starts the copy
    of layer ``index + 2`` (wrapping to the next forward's layers 0 and 1 at the end)."""

    def __init__(self, index: int, state: OffloadState) -> None:
        super().__init__()
        self.index = index
        self._state = [state]  # a list: not registered as a submodule (the slots are not this layer's)

    def forward(self, x, cos, sin, layer_cache, cache_slots, prefix_len, tree_mask, backend):
        st = self._state[0]
        n = len(st.host)
        if st.cuda:
            st.wait(self.index)
        else:
            st.prefetch(self.index)  # CPU: synchronous copy right before use
        y = st.slots[self.index % 2](x, cos, sin, layer_cache, cache_slots, prefix_len, tree_mask, backend)
        if st.cuda and n > 1:
            st.prefetch((self.index + 2) % n)
        return y


def layer_bytes(model: Transformer) -> int:
    """Bytes of one decoder layer's parameters (what streams per layer per forward)."""
    return sum(p.numel() * p.element_size() for p in model.layers[0].parameters())


@torch.no_grad()
def offload_layers(model: Transformer, device: torch.device | str, *, pin: bool | None = None) -> OffloadState:
    """Put ``model`` in offload mode for ``device`` (in place; see the module docstring).

    The resident parts (embeddings, final norm, LM head, rotary frequencies) move to ``device``; each block's
    parameters move to host memory, pinned when ``pin`` (default: on CUDA), and the block is replaced by a
    :class:`StreamedBlock`. Two device slots of one block each are allocated. On CUDA the first forward's
    layers 0 and 1 are prefetched here.

    Returns the :class:`OffloadState` (also reachable as ``model.offload_state``).

    Raises:
        ValueError: the model is already offloaded, or its layers differ in shape (one slot fits all).
    """
    device = torch.device(device)
    if getattr(model, "offload_state", None) is not None:
        raise ValueError("this model is already in offload mode")
    pin = device.type == "cuda" if pin is None else pin
    blocks = list(model.layers)
    shapes = {tuple((n, tuple(p.shape), p.dtype) for n, p in b.named_parameters()) for b in blocks}
    if len(shapes) != 1:
        raise ValueError("offload mode streams every layer through the same two slots: the layers must share "
                         "one shape and dtype")
    host = []
    for b in blocks:
        entry = {}
        for name, p in b.named_parameters():
            t = p.detach().to("cpu")
            entry[name] = t.pin_memory() if pin else t.clone()
        host.append(entry)
        b.to("meta")  # free the block's own copy wherever it lived
    dtype = model.dtype
    slots = [Block(model.config, device=device, dtype=dtype).eval() for _ in range(min(2, len(blocks)))]
    model.embed_tokens.to(device)
    model.norm.to(device)
    model.lm_head.to(device)
    if model.config.tie_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.inv_freq = model.inv_freq.to(device)
    state = OffloadState(host=host, slots=slots, device=device,
                         copy_stream=torch.cuda.Stream(device) if device.type == "cuda" else None,
                         ready=[None] * len(blocks))
    model.layers = nn.ModuleList(StreamedBlock(i, state) for i in range(len(blocks)))
    model.offload_state = state
    if state.cuda:
        for i in range(min(2, len(blocks))):
            state.prefetch(i)
    return state
