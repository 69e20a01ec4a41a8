"""Training losses on the model's logits: per-token cross-entropy and distillation from a teacher.

Both return per-token values (B, L) in fp32 so the trainer can mask, normalize and account
them per source; shape legend in ``train.model``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def cross_entropy_per_token(
    logits_BLV: torch.Tensor, targets_BL: torch.Tensor, *, label_smoothing: float = 0.0
) -> torch.Tensor:
    """Next-token cross-entropy per token, computed in fp32 whatever the logits' dtype."""
    loss_T = F.cross_entropy(
        logits_BLV.flatten(0, 1).float(), targets_BL.flatten(), reduction="none", label_smoothing=label_smoothing
    )
    return loss_T.view_as(targets_BL)


def distillation_per_token(student_BLV: torch.Tensor, teacher_BLV: torch.Tensor, *, temperature: float) -> torch.Tensor:
    """KL(teacher ‖ student) on temperature-softened distributions, times T² (Hinton et al., 2015).

    The T² keeps the soft-target gradients on the same scale as the hard-target ones.
    """
    vocab = min(student_BLV.shape[-1], teacher_BLV.shape[-1])  # padded vocabularies may differ
    log_p_student = (student_BLV[..., :vocab].float() / temperature).log_softmax(-1)
    log_p_teacher = (teacher_BLV[..., :vocab].float() / temperature).log_softmax(-1)
    kl_BL = (log_p_teacher.exp() * (log_p_teacher - log_p_student)).sum(-1)
    return kl_BL * temperature**2
