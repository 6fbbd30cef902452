"""GGUF files built locally with the ``gguf`` package, in llama.cpp's layout (q/k rows permuted for its rotary)."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import torch

TOKENS = ["<bos>", "<eos>", "<unk>"] + [f"w{i}" for i in range(3, 48)]


def _permute(w, n_head: int):
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(model, path: Path, tokens=TOKENS) -> Path:
    """Write a transformers ``LlamaForCausalLM`` (float32) and a byte-level BPE token list as a GGUF file."""
    import gguf

    cfg = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_merges([])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    sd = {k: v.float().numpy() for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    names = {
        "input_layernorm": "attn_norm",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_q.weight", _permute(sd[p + "self_attn.q_proj.weight"], cfg.num_attention_heads))
        w.add_tensor(f"blk.{i}.attn_k.weight", _permute(sd[p + "self_attn.k_proj.weight"], cfg.num_key_value_heads))
        for hf, gg in names.items():
            w.add_tensor(f"blk.{i}.{gg}.weight", sd[p + hf + ".weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def write_wheel(gguf_file: Path, wheel: Path, member: str) -> Path:
    """A wheel-shaped zip holding ``gguf_file`` at ``member``."""
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(gguf_file, member)
        z.writestr("tiny_model-0.1.dist-info/METADATA", "Name: tiny-model\nVersion: 0.1\n")
    return wheel


def same_logits(a, b) -> bool:
    x = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.inference_mode():
        return torch.allclose(a(x).logits, b(x).logits, atol=1e-5)
