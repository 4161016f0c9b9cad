"""Llama-family models: configuration, the PyTorch decoder, the static KV cache and checkpoint loaders."""

from .config import PRESETS, ModelConfig
from .kv_cache import KVCache, ModelKVCache
from .llama import Transformer

__all__ = ["ModelConfig", "PRESETS", "Transformer", "KVCache", "ModelKVCache"]
