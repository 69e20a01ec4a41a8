"""The tiny model and loader tables the command tests train with (seconds on a CPU)."""

TINY_MODEL = """
[train.model]
dim = 16
n_layers = 1
n_heads = 2
ffn_hidden = 16
n_experts = 2
top_k = 1
[train.data]
batch_size = 2
seq_len = 32
num_workers = 0
"""
