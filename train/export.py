"""A trained model out of its run: one safetensors file, and a Hugging Face Mixtral folder where the config maps.

``winnow-model.safetensors`` holds the one-process model's state under winnow's own parameter
names, with the model config, step and sources in the file's metadata; ``load_exported`` builds
the ``Transformer`` back from it alone, and the run's tokenizer files beside it reload with
``train.tokenizer.load_tokenizer``. ``hf/`` holds a ``config.json`` (``MixtralForCausalLM``, with
the tokenizer's end-of-document and padding ids) and ``model.safetensors`` in the layout Mixtral
checkpoints on the Hub use (``block_sparse_moe.experts.N.w1``), which ``transformers`` v4 loads as
is and v5 converts on load, and the tokenizer: ``tokenizer.json`` (the run's own, or for the
byte-level tokenizer an equivalent one built with the ``tokenizers`` library), its
``tokenizer_config.json`` and ``special_tokens_map.json``, and ``generation_config.json``, so
``AutoTokenizer`` and ``pipeline("text-generation")`` load the folder as it is.

The export is written into a temporary folder beside the output and renamed into place, so an
interrupted export leaves nothing half-written; an earlier export in the output is replaced, a
folder holding anything else is refused. Every export folder holds a marker (``.winnow-export``),
written first: a temporary folder a killed export left is removed only with it.

The mapping is exact, not approximate: winnow's attention is Llama's (half-split rotary, SDPA's
1/sqrt(C) scale, grouped-query heads), its RMSNorm and SwiGLU experts are Mixtral's, and its
softmax router with renormalized top-k weights is Mixtral's router. A dense model (``n_experts``
0 or 1) becomes a Mixtral with one expert whose router always gives it weight 1. Features
Mixtral lacks are listed by ``hf_blockers`` with the config key that brings them in; the
safetensors file is written either way. ``hf/`` has the tokenizer's vocabulary (``vocab_size``, not the
embedding's padding to a multiple of 64): its embedding and output rows are cut to it, so its logits and
generation cover the ids the tokenizer has, where winnow's padding rows would let sampling pick ids it has not.
``doc_mask`` only matters for packed sequences of several documents; for one document per sequence the logits
are the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import shutil
from pathlib import Path

import torch

from winnow.train.checkpoint import check_finite, renamed
from winnow.train.errors import CheckpointError, ConfigError
from winnow.train.model import ModelConfig, Transformer
from winnow.train.model.config import saved_model_config
from winnow.train.tokenizer import BPE_FILE, META_FILE, Tokenizer

WINNOW_FILE = "winnow-model.safetensors"
HF_DIR = "hf"
#: Written first into every export folder: a temporary folder left by a killed export is removed only with it.
MARKER = ".winnow-export"
#: Everything an export folder (and its ``hf/``) may hold: an output holding anything else is not replaced.
EXPORT_ENTRIES = frozenset({WINNOW_FILE, HF_DIR, META_FILE, BPE_FILE, MARKER})
HF_ENTRIES = frozenset(
    {"config.json", "model.safetensors", BPE_FILE, "tokenizer_config.json", "special_tokens_map.json",
     "generation_config.json"}
)  # fmt: skip


def hf_blockers(cfg: ModelConfig) -> list[str]:
    """Why ``cfg`` has no exact Mixtral equivalent, one line per config key (empty: it maps)."""
    out = []
    if cfg.is_moe and cfg.n_dense_layers:
        out.append(f"train.model.n_dense_layers = {cfg.n_dense_layers}: Mixtral has experts in every layer")
    if cfg.is_moe and cfg.n_shared_experts:
        out.append(f"train.model.n_shared_experts = {cfg.n_shared_experts}: Mixtral has no shared experts")
    if cfg.is_moe and cfg.score_func != "softmax":
        out.append(f"train.model.score_func = {cfg.score_func!r}: Mixtral's router is a softmax")
    if cfg.is_moe and cfg.load_balance == "bias":
        out.append("train.model.load_balance = 'bias': Mixtral's router has no expert-selection bias")
    if cfg.is_moe and cfg.capacity_factor is not None:
        out.append(
            f"train.model.capacity_factor = {cfg.capacity_factor}: Mixtral is dropless, winnow drops "
            "tokens over capacity at inference too"
        )
    if cfg.is_moe and cfg.top_k == 1:
        out.append(
            "train.model.top_k = 1: Mixtral renormalizes the top-k weights, so one expert gets weight 1 "
            "where winnow keeps its softmax probability"
        )
    return out


def token_ids(tokenizer: Tokenizer | None) -> dict:
    """The special token ids ``config.json`` and ``generation_config.json`` carry.

    BOS is the end-of-document token, as GPT-2's: winnow puts it between packed documents, so it
    is the token every document after the first follows (and Mixtral's default BOS id, 1, is a byte here).
    """
    if tokenizer is None:
        return {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    return {"bos_token_id": tokenizer.eos_id, "eos_token_id": tokenizer.eos_id, "pad_token_id": tokenizer.pad_id}


def mixtral_config(cfg: ModelConfig, tokenizer: Tokenizer | None = None) -> dict:
    """``config.json`` of the equivalent ``MixtralForCausalLM`` (call only when ``hf_blockers`` is empty)."""
    experts, top_k = (cfg.n_experts, cfg.top_k) if cfg.is_moe else (1, 1)
    hidden = cfg.ffn_hidden if cfg.is_moe else cfg.dense_hidden or cfg.ffn_hidden
    return {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        **token_ids(tokenizer),
        "vocab_size": cfg.vocab_size,  # the tokenizer's: mixtral_state cuts the padding rows
        "hidden_size": cfg.dim,
        "intermediate_size": hidden,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.dim // cfg.n_heads,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        # both spellings: transformers v4 reads rope_theta, v5 rope_parameters
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "num_local_experts": experts,
        "num_experts_per_tok": top_k,
        "router_aux_loss_coef": cfg.aux_loss_coef,
        "router_jitter_noise": 0.0,
        "output_router_logits": False,
        "sliding_window": None,
        "attention_dropout": 0.0,
        "tie_word_embeddings": cfg.tie_embeddings,
        "torch_dtype": "float32",
        "initializer_range": cfg.init_std,
        "use_cache": True,
    }


def mixtral_state(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """winnow's one-process state dict renamed and reshaped into Mixtral's Hub layout, its vocabulary the
    tokenizer's: the embedding (and an untied head) without the padding rows no token id reaches."""
    kv = cfg.kv_heads * (cfg.dim // cfg.n_heads)  # rows of the key (and of the value) projection
    V = cfg.vocab_size
    out = {"model.embed_tokens.weight": state["embed.weight"][:V], "model.norm.weight": state["norm.weight"]}
    if not cfg.tie_embeddings:  # tied: Mixtral's head is the cut embedding
        out["lm_head.weight"] = state["head.weight"][:V]
    for i in range(cfg.n_layers):
        src, dst = f"blocks.{i}.", f"model.layers.{i}."
        wkv = state[src + "attn.wkv.weight"]  # (2·G·C, D): keys first, then values
        out |= {
            dst + "input_layernorm.weight": state[src + "attn_norm.weight"],
            dst + "post_attention_layernorm.weight": state[src + "ffn_norm.weight"],
            dst + "self_attn.q_proj.weight": state[src + "attn.wq.weight"],
            dst + "self_attn.k_proj.weight": wkv[:kv],
            dst + "self_attn.v_proj.weight": wkv[kv:],
            dst + "self_attn.o_proj.weight": state[src + "attn.wo.weight"],
        }
        moe = dst + "block_sparse_moe."
        if cfg.is_moe:
            out[moe + "gate.weight"] = state[src + "ffn.router.gate.weight"]
            w13_ED2F, w2_EFD = state[src + "ffn.experts.w13_ED2F"], state[src + "ffn.experts.w2_EFD"]
            F_ = cfg.ffn_hidden
            for e in range(cfg.n_experts):  # nn.Linear weights are (out, in): the transposes of x @ W
                out[f"{moe}experts.{e}.w1.weight"] = w13_ED2F[e, :, :F_].T
                out[f"{moe}experts.{e}.w3.weight"] = w13_ED2F[e, :, F_:].T
                out[f"{moe}experts.{e}.w2.weight"] = w2_EFD[e].T
        else:  # one expert, always chosen with weight softmax([0]) = 1
            w13 = state[src + "ffn.w13.weight"]  # (2F, D), gate rows first
            F_ = w13.shape[0] // 2
            out[moe + "gate.weight"] = torch.zeros(1, cfg.dim, dtype=w13.dtype)
            out[moe + "experts.0.w1.weight"], out[moe + "experts.0.w3.weight"] = w13[:F_], w13[F_:]
            out[moe + "experts.0.w2.weight"] = state[src + "ffn.w2.weight"]
    return {k: v.detach().contiguous() for k, v in out.items()}


def write_hf_tokenizer(tokenizer: Tokenizer, folder: Path, *, max_length: int) -> None:
    """``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json`` and ``generation_config.json``."""
    tokenizer.hf_tokenizer().save(str(folder / BPE_FILE))
    special = tokenizer.special_tokens
    # the generic fast tokenizer: it adds no BOS/EOS of its own, as winnow's encoding adds none
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
    }
    _write_json(folder / "tokenizer_config.json", config)
    _write_json(folder / "special_tokens_map.json", special)
    _write_json(folder / "generation_config.json", token_ids(tokenizer))


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")


def _winnow_tensors(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # safetensors holds no shared storage: a tied head is the embedding, re-tied by the model on load
    return {k: v.detach().contiguous() for k, v in state.items() if not (cfg.tie_embeddings and k == "head.weight")}


def export_model(
    state: dict,
    out_dir: str | Path,
    *,
    step: int | None = None,
    sources: list[str] | None = None,
    tokenizer: Tokenizer | None = None,
    name: str = "the checkpoint",
) -> dict:
    """Write ``out_dir/winnow-model.safetensors`` (and ``tokenizer``'s files) and, when the config maps, ``out_dir/hf/``.

    ``state`` is a checkpoint's (``model`` and ``model_config`` at least), ``name`` names it in errors; ``tokenizer``
    the run's (None: the export has no tokenizer files). Returns what was written:
    ``{"winnow": path, "hf": path or None, "hf_blockers": [...]}``.
    """
    import safetensors.torch as st  # the train extra's; imported by the commands that write files only

    if "model" not in state:
        raise CheckpointError(f"{name} holds no model to export")
    cfg = saved_model_config(state.get("model_config"), name)
    check_finite(
        state["model"],
        f"the checkpoint of step {step}" if step is not None else "the checkpoint",
        then="export an earlier checkpoint of the run (`winnow export RUN/checkpoints/step-N`)",
    )
    out_dir = Path(out_dir).resolve()  # "." has no name to put a temporary folder beside
    _check_replaceable(out_dir)
    _remove_left_behind(out_dir)
    tmp = _beside(out_dir, "tmp", os.getpid())
    _remove_ours(tmp)  # what an interrupted export of this process id left
    tmp.mkdir(parents=True)
    (tmp / MARKER).write_text("written by winnow export\n")
    try:
        meta = {
            "format": "winnow",
            "model_config": json.dumps(dataclasses.asdict(cfg)),
            "step": str(step if step is not None else -1),
            "sources": json.dumps(list(sources or [])),
        }
        st.save_file(_winnow_tensors(cfg, state["model"]), str(tmp / WINNOW_FILE), metadata=meta)
        if tokenizer is not None:
            tokenizer.save(tmp)
        blockers = hf_blockers(cfg)
        if not blockers:
            hf = tmp / HF_DIR
            hf.mkdir()
            _write_json(hf / "config.json", mixtral_config(cfg, tokenizer))
            st.save_file(mixtral_state(cfg, state["model"]), str(hf / "model.safetensors"), metadata={"format": "pt"})
            if tokenizer is not None:
                write_hf_tokenizer(tokenizer, hf, max_length=cfg.max_seq_len)
        _follow_umask(tmp)
        _move_into_place(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    hf_path = out_dir / HF_DIR if not blockers else None
    return {"winnow": str(out_dir / WINNOW_FILE), "hf": str(hf_path) if hf_path else None, "hf_blockers": blockers}


def _check_replaceable(out_dir: Path) -> None:
    """ConfigError when ``out_dir`` holds anything an export does not write (winnow never deletes what it did not write)."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise ConfigError(f"{out_dir} exists and is not a folder; give another --output")
    entries = sorted(p.name for p in out_dir.iterdir())
    hf = out_dir / HF_DIR
    # under an export's names: any other entry is the user's, refused below, and is not walked (`--output /`)
    ours = [out_dir / name for name in entries if name in EXPORT_ENTRIES]
    inside = hf.rglob("*") if hf.is_dir() and not hf.is_symlink() else ()
    links = [str(p.relative_to(out_dir)) for p in (*ours, *inside) if p.is_symlink()]
    if links:  # an export writes no links; replacing one would drop the user's, whatever it points to
        raise ConfigError(
            f"{out_dir} holds symbolic links an export does not write ({', '.join(links[:3])}); give another "
            "--output, or remove the links (what they point to stays)"
        )
    others = [name for name in entries if name not in EXPORT_ENTRIES]
    others += [f"{HF_DIR}/{p.name}" for p in (hf.iterdir() if hf.is_dir() else ()) if p.name not in HF_ENTRIES]
    if others:
        raise ConfigError(
            f"{out_dir} holds files an export does not write ({', '.join(others[:3])}); "
            "give another --output, or move them away"
        )
    if entries and not _is_export(out_dir / WINNOW_FILE):  # a user's tokenizer.json or hf/ under an export's names
        raise ConfigError(
            f"{out_dir} holds {', '.join(entries[:3])} but no export of winnow's ({WINNOW_FILE}): they are not "
            "winnow's to replace; give another --output, or move them away"
        )


def _is_export(path: Path) -> bool:
    """Whether ``path`` is a safetensors file an export wrote (its header's metadata says ``format = winnow``)."""
    try:
        with path.open("rb") as fh:
            head = fh.read(8)
            size = int.from_bytes(head, "little")
            return size <= 1 << 24 and _winnow_metadata(head + fh.read(size)) is not None
    except OSError:
        return False


def _winnow_metadata(head: bytes) -> dict[str, str] | None:
    """The metadata of the safetensors file that begins with ``head`` (its 8-byte length and JSON header), when an
    export of winnow's wrote it (``format = winnow``); else None."""
    size = int.from_bytes(head[:8], "little")
    try:
        header = json.loads(head[8 : 8 + size]) if 0 < size <= len(head) - 8 else None
    except ValueError:
        return None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta if isinstance(meta, dict) and meta.get("format") == "winnow" else None


def _beside(out_dir: Path, kind: str, pid: int | str) -> Path:
    """The export's temporary folder ``kind`` (tmp, old) beside ``out_dir``, its name within the 255 bytes a file
    system allows whatever the output's name (in the bytes the file system holds: a name need not be UTF-8)."""
    name = out_dir.name
    while len(os.fsencode(name)) > 100:  # whole characters cut, never half of one
        name = name[:-1]
    return out_dir.with_name(f".{name}.{kind}-{pid}")


def _remove_left_behind(out_dir: Path) -> None:
    """Remove the temporary folders of exports to ``out_dir`` whose process is gone (killed mid-export); a folder
    of the same name that an export did not write (no marker, or other files) stays."""
    for kind in ("tmp", "old"):
        for folder in out_dir.parent.glob(glob.escape(_beside(out_dir, kind, "").name) + "*"):
            pid = folder.name.rsplit("-", 1)[-1]
            if pid.isdigit() and not _alive(int(pid)) and _written_by_export(folder):
                shutil.rmtree(folder, ignore_errors=True)


def _written_by_export(folder: Path) -> bool:
    """Whether ``folder`` is an export's (temporary) folder: a real folder holding the marker, no link, and
    nothing but what an export writes."""
    if folder.is_symlink() or not (folder / MARKER).is_file():
        return False
    hf = folder / HF_DIR
    if any(p.is_symlink() for p in folder.rglob("*")) or (hf.exists() and not hf.is_dir()):
        return False
    return all(p.name in EXPORT_ENTRIES for p in folder.iterdir()) and all(
        p.name in HF_ENTRIES for p in (hf.iterdir() if hf.is_dir() else ())
    )


def _remove_ours(folder: Path) -> None:
    """Remove ``folder``, a temporary folder of this process's name, when an export wrote it; refuse to go on
    past one that holds anything else (winnow never deletes what it did not write)."""
    if not folder.exists() and not folder.is_symlink():
        return
    if not _written_by_export(folder):
        raise ConfigError(
            f"{folder} exists and is not a folder winnow export wrote; it is in the way of the export's temporary "
            "folder: move it, or give another --output"
        )
    shutil.rmtree(folder)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _follow_umask(folder: Path) -> None:
    """Give the export's files the mode the umask gives a new file (safetensors writes them 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(0o666 & ~mask)


def _move_into_place(tmp: Path, out_dir: Path) -> None:
    """Rename the finished export to ``out_dir``; an earlier export there is renamed away first, then removed."""
    if out_dir.is_dir() and not any(out_dir.iterdir()):  # an empty folder (perhaps the shell's): filled, not replaced
        for entry in tmp.iterdir():
            os.replace(entry, out_dir / entry.name)
        return
    old = _beside(out_dir, "old", os.getpid())
    _remove_ours(old)  # one an interrupted export of this process id left
    if out_dir.exists():
        _check_replaceable(out_dir)  # again: something may have arrived while the export was written
        os.replace(out_dir, old)
    try:
        os.replace(tmp, out_dir)
    except OSError:
        with contextlib.suppress(OSError):
            os.replace(old, out_dir)  # put the earlier export back
        raise
    shutil.rmtree(old, ignore_errors=True)


def exported_state(data: bytes, name: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The one-process model state (winnow's parameter names) and the metadata of an export's
    ``winnow-model.safetensors`` file, given as its bytes; ``name`` names it in errors."""
    import safetensors.torch as st
    from safetensors import SafetensorError

    try:
        tensors = st.load(data)
    except (SafetensorError, ValueError) as err:
        raise CheckpointError(f"{name}: not a safetensors file ({err}); write one with `winnow export RUN`") from err
    meta = _winnow_metadata(data)
    if meta is None or "model_config" not in meta:
        raise CheckpointError(
            f"{name}: not a winnow export (no winnow model_config in its metadata); write one with `winnow export RUN`"
        )
    state = renamed(tensors)  # an earlier version's export: its expert names as today's
    if exported_config(meta, name).tie_embeddings:
        state["head.weight"] = state["embed.weight"]
    return state, meta


def exported_config(meta: dict[str, str], name: str) -> ModelConfig:
    """The model config in an export's metadata (``name`` names the file in errors)."""
    try:
        saved = json.loads(meta["model_config"])
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{name}: its model_config is not JSON ({err}); export the run again") from None
    return saved_model_config(saved, name)


def load_exported(path: str | Path) -> tuple[Transformer, dict]:
    """The model in a ``winnow-model.safetensors`` file (eval mode), and the file's metadata."""
    state, meta = exported_state(Path(path).read_bytes(), str(path))
    model = Transformer(exported_config(meta, str(path)))
    model.load_state_dict(state)
    return model.eval(), meta
