"""The decoder-only Mixture-of-Experts transformer, in plain PyTorch.

Tensor names carry their shape as a suffix (torchtitan style). Legend:

    B  batch (sequences)            L  sequence length
    T  tokens in a flat batch (B·L) D  model width
    H  attention heads              G  key/value heads (grouped-query attention)
    C  head width (D // H)          F  feed-forward hidden width (per expert)
    E  routed experts               K  experts per token (top-k)
    A  routed assignments (T·K)     V  vocabulary
"""

from winnow.train.model.config import ModelConfig
from winnow.train.model.loss import cross_entropy_per_token, distillation_per_token
from winnow.train.model.moe import MoE, MoEStats
from winnow.train.model.transformer import ModelOutput, Transformer

__all__ = [
    "ModelConfig",
    "cross_entropy_per_token",
    "distillation_per_token",
    "MoE",
    "MoEStats",
    "ModelOutput",
    "Transformer",
]
