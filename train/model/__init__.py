"""The decoder-only Mixture-of-Experts transformer, in plain PyTorch.

Tensor names carry their shape as a suffix (torchtitan style). Legend:

    B  batch (sequences)            L  sequence length
    T  tokens in a flat batch (B·L) D  model width
    H  attention heads              G  key/value heads (grouped-query attention)
    C  head width (D // H)          F  feed-forward hidden width (per expert)
    E  routed experts               K  experts per token (top-k)
    A  routed assignments (T·K)     V  vocabulary
"""

from winnow.train import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "ModelConfig": "winnow.train.model.config",
        "cross_entropy_per_token": "winnow.train.model.loss",
        "distillation_per_token": "winnow.train.model.loss",
        "MoE": "winnow.train.model.moe",
        "MoEStats": "winnow.train.model.moe",
        "ModelOutput": "winnow.train.model.transformer",
        "Transformer": "winnow.train.model.transformer",
    },
)
