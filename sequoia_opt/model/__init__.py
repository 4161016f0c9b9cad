"""Llama-family models: configuration, the PyTorch decoder, the static KV cache and checkpoint loaders."""

from .config import PRESETS, ModelConfig
from .eval import perplexity
from .hf import save_hf_checkpoint
from .kv_cache import KVCache, ModelKVCache
from .llama import Transformer
from .loaders import find_demo_target, load_checkpoint, load_model_config
from .tokenizer import Tokenizer

__all__ = ["ModelConfig", "PRESETS", "Transformer", "KVCache", "ModelKVCache", "Tokenizer", "load_checkpoint",
           "load_model_config", "find_demo_target", "save_hf_checkpoint", "perplexity"]
