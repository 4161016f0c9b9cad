"""Offload mode of the bundled decoder: the target's decoder layers live in (pinned) host memory and stream
to the device each forward, the next layer's copy overlapped with the current layer's compute on a side
stream (FlexGen, Sheng et al. 2023; the offloading regime of Sequoia, Chen et al. 2024, section 4 and its
offloading experiments, where T(n) is flat far past 64 tokens because every forward pays for the weights'
transfer, so deep, narrow trees win).

:func:`offload_layers` rewrites a :class:`~sequoia_opt.model.Transformer` in place: the embeddings, final norm
and LM head stay on the device (resident), every block's parameters move to host memory (pinned on CUDA), and
each block is replaced by a :class:`StreamedBlock` that runs its computation in one of two device-side weight
slots (double buffering):

* a layer computes in the slot that holds its weights, after the compute stream waits for that copy's event;
* once layer l's compute is enqueued, the copy stream waits for the compute stream and copies layer ``l + 2``
  (mod the layer count) into the slot l just used, so the copy of layer l + 1 (issued when layer l - 1
  finished) runs while layer l computes;
* the last two layers start the copies of layers 0 and 1 for the next forward, which then overlap with the
  LM head, the decoder's bookkeeping and the draft.

Which slot a layer uses is tracked (:attr:`OffloadState.resident`), not derived from its index: with an odd
layer count, layer 0 of the next forward goes to the slot the last layer did not use (the parity flips every
forward), so its prefetch never overwrites weights a layer is still computing from. Every copy into a slot
is issued after the compute stream's work so far (so after every read of that slot), and every compute waits
for the last copy into its slot; a layer that is not where the schedule expected it (a forward over the
first k layers only) is copied on demand into the slot the previous layer did not use.

The model's forward, KV caches (on the device), masks and every decoder work unchanged: an offloaded target is
passed to :class:`~sequoia_opt.decoding.loop.Decoder` as it is. The
stream operations go through a small interface (:class:`CudaStreams` on CUDA, :class:`SyncStreams` on a CPU,
where copies are synchronous and nothing overlaps), so the schedule that runs on a GPU is the one the CPU
tests check, with a recording stand-in that finds races by vector clocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from .llama import Block, Transformer

__all__ = ["offload_layers", "StreamedBlock", "OffloadState", "layer_bytes", "CudaStreams", "SyncStreams"]


class SyncStreams:
    """A CPU's stream operations: one stream, copies done when issued, nothing to wait for."""

    def copy(self, dst: dict[str, torch.Tensor], src: dict[str, torch.Tensor]) -> Any:
        """Copy ``src`` into ``dst`` (``{param name: tensor}``) after the compute issued so far; returns the
        token :meth:`wait` takes (None: already done)."""
        for name, t in src.items():
            dst[name].data.copy_(t)
        return None

    def copy_now(self, dst: dict[str, torch.Tensor], src: dict[str, torch.Tensor]) -> None:
        """Copy ``src`` into ``dst`` on the compute stream itself (in order with the compute)."""
        self.copy(dst, src)

    def wait(self, token: Any) -> None:
        """Make the compute stream wait for a copy's token."""

    def compute(self, slot: int, layer: int) -> None:
        """Called right before layer ``layer`` is enqueued in slot ``slot`` (a hook for recorders)."""


class CudaStreams(SyncStreams):
    """CUDA: copies on a side stream, ordered after the compute stream's work so far (``wait_stream``),
    each followed by an event the compute stream waits on."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def copy(self, dst, src):
        compute = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(compute)  # every layer enqueued so far, the slot's last reader included
        with torch.cuda.stream(self.stream):
            for name, t in src.items():
                dst[name].data.copy_(t, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(self.stream)
        return ev

    def copy_now(self, dst, src):
        for name, t in src.items():
            dst[name].data.copy_(t, non_blocking=True)

    def wait(self, token):
        if token is not None:
            torch.cuda.current_stream(self.device).wait_event(token)


@dataclass
class OffloadState:
    """What the streamed blocks of one model share: host copies of every layer, the two device slots, which
    layer each slot holds, and the stream operations.

    Attributes:
        host: per layer, ``{param name: host tensor}`` (pinned on CUDA).
        slots: one or two device-side :class:`Block` modules whose parameters receive the copies.
        device: the device computing.
        streams: :class:`CudaStreams` on CUDA, :class:`SyncStreams` on a CPU (or a test's recorder).
        resident: per slot, the layer whose copy was issued into it last (None: none yet).
        ready: per slot, the token of that copy the compute stream has not waited for yet (None: nothing to
            wait for).
        last_slot: the slot the previous layer computed in.
        copies: copies issued so far (tests count them).
    """

    host: list[dict[str, torch.Tensor]]
    slots: list[Block]
    device: torch.device
    streams: SyncStreams
    resident: list[int | None] = field(default_factory=list)
    ready: list[Any] = field(default_factory=list)
    last_slot: int | None = None
    copies: int = 0

    def __post_init__(self) -> None:
        self.resident = self.resident or [None] * len(self.slots)
        self.ready = self.ready or [None] * len(self.slots)

    @property
    def cuda(self) -> bool:
        """True when the compute device is a GPU."""
        return self.device.type == "cuda"

    def _params(self, slot: int) -> dict[str, torch.Tensor]:
        return dict(self.slots[slot].named_parameters())

    def prefetch(self, layer: int, slot: int) -> None:
        """Issue the copy of layer ``layer`` into ``slot`` (after the compute enqueued so far, which may still
        read that slot); nothing when the slot already holds that layer (host weights never change)."""
        if self.resident[slot] == layer:
            return
        self.ready[slot] = self.streams.copy(self._params(slot), self.host[layer])
        self.resident[slot] = layer
        self.copies += 1

    def load_now(self, slot: int, layer: int) -> None:
        """Copy layer ``layer`` into ``slot`` on the compute stream (after a pending copy into that slot), and
        record it: what :func:`~sequoia_opt.profiling.offload.time_layer_copy` times."""
        self.streams.wait(self.ready[slot])
        self.ready[slot] = None
        self.streams.copy_now(self._params(slot), self.host[layer])
        self.resident[slot] = layer
        self.copies += 1

    def acquire(self, layer: int) -> int:
        """The slot layer ``layer`` computes in, its weights there and the compute stream waiting for their
        copy: the slot already holding it, else a copy now into the slot the previous layer did not use."""
        held = [s for s, r in enumerate(self.resident) if r == layer]
        if held:
            slot = next((s for s in held if s != self.last_slot), held[0])
        else:
            slot = 0 if len(self.slots) == 1 or self.last_slot is None else 1 - self.last_slot
            self.prefetch(layer, slot)
        self.streams.wait(self.ready[slot])
        self.ready[slot] = None
        return slot

    def release(self, layer: int, slot: int) -> None:
        """Layer ``layer``'s compute in ``slot`` is enqueued: prefetch layer ``layer + 2`` (wrapping to the next
        forward) into that slot."""
        self.last_slot = slot
        n = len(self.host)
        if n > len(self.slots):
            self.prefetch((layer + 2) % n, slot)


class StreamedBlock(nn.Module):
    """Layer ``index`` of an offloaded model: waits for its weights, runs in their slot, then starts the copy
    of layer ``index + 2`` into that slot (wrapping to the next forward's layers 0 and 1 at the end)."""

    def __init__(self, index: int, state: OffloadState) -> None:
        super().__init__()
        self.index = index
        self._state = [state]  # a list: not registered as a submodule (the slots are not this layer's)

    def forward(self, x, cos, sin, layer_cache, cache_slots, prefix_len, tree_mask, backend):
        """(B, T, dim) -> (B, T, dim), as :meth:`~sequoia_opt.model.llama.Block.forward` with the same arguments, run
        by the device slot holding this layer's weights (:meth:`OffloadState.acquire`); then the copy of layer
        ``index + 2`` into that slot is issued (:meth:`OffloadState.release`)."""
        st = self._state[0]
        slot = st.acquire(self.index)
        st.streams.compute(slot, self.index)
        y = st.slots[slot](x, cos, sin, layer_cache, cache_slots, prefix_len, tree_mask, backend)
        st.release(self.index, slot)
        return y


def layer_bytes(model: Transformer) -> int:
    """Bytes of one decoder layer's parameters (what streams per layer per forward)."""
    return sum(p.numel() * p.element_size() for p in model.layers[0].parameters())


@torch.no_grad()
def offload_layers(model: Transformer, device: torch.device | str, *, pin: bool | None = None,
                   streams: SyncStreams | None = None) -> OffloadState:
    """Put ``model`` in offload mode for ``device`` (in place; see the module docstring).

    The resident parts (embeddings, final norm, LM head, rotary frequencies) move to ``device``; each block's
    parameters move to host memory, pinned when ``pin`` (default: on CUDA), and the block is replaced by a
    :class:`StreamedBlock`. Two device slots of one block each are allocated (one for a one-layer model), and
    the first forward's layers 0 and 1 are prefetched here. ``streams``: the stream operations (default
    :class:`CudaStreams` on CUDA, :class:`SyncStreams` elsewhere; tests pass a recorder).

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
    if streams is None:
        streams = CudaStreams(device) if device.type == "cuda" else SyncStreams()
    state = OffloadState(host=host, slots=slots, device=device, streams=streams)
    model.layers = nn.ModuleList(StreamedBlock(i, state) for i in range(len(blocks)))
    model.offload_state = state
    for i in range(len(slots)):  # the first forward's layers 0 and 1
        state.prefetch(i, i)
    return state
