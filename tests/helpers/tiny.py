"""Tiny random transformers models and a word-level tokenizer, built locally (no downloads)."""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

KINDS = ("llama", "qwen2", "gpt2")
ATTN = ("eager", "sdpa")


def tiny_model(
    kind: str = "llama",
    vocab: int = 48,
    attn: str = "sdpa",
    seed: int = 0,
    hidden: int = 32,
    max_positions: int = 256,
    eos: int | None = 1,
    init_range: float = 0.3,
    layers: int = 2,
):
    """A small random causal LM (2 layers by default); ``init_range`` large enough that the logits are peaked."""
    common = {"vocab_size": vocab, "bos_token_id": 0, "eos_token_id": eos, "pad_token_id": 0}
    if kind == "llama":
        cfg = LlamaConfig(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=max_positions,
            initializer_range=init_range,
            tie_word_embeddings=False,
            **common,
        )
        cls = LlamaForCausalLM
    elif kind == "qwen2":
        cfg = Qwen2Config(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=max_positions,
            initializer_range=init_range,
            tie_word_embeddings=False,
            use_sliding_window=False,
            **common,
        )
        cls = Qwen2ForCausalLM
    elif kind == "gpt2":
        cfg = GPT2Config(
            n_embd=hidden,
            n_layer=layers,
            n_head=4,
            n_positions=max_positions,
            initializer_range=init_range,
            **common,
        )
        cls = GPT2LMHeadModel
    else:
        raise ValueError(kind)
    cfg._attn_implementation = attn
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = 0
    return model


def perturbed(model, scale: float = 0.05, seed: int = 1):
    """A copy of ``model`` with Gaussian noise on every weight: a draft that agrees often but not always."""
    import copy

    g = torch.Generator().manual_seed(seed)
    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.parameters():
            noise = torch.randn(p.shape, generator=g).to(p.device)  # CPU generator: same values on every device
            p.add_(noise * scale * (p.std() if p.numel() > 1 else 1.0))
    return out


def tiny_tokenizer(vocab: int = 48):
    """A word-level PreTrainedTokenizerFast over ``<bos> <eos> <unk> w3 .. w{vocab-1}``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"<bos>": 0, "<eos>": 1, "<unk>": 2}
    for i in range(3, vocab):
        words[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    from tokenizers import decoders

    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>")


def save_tiny_pair(root, prompts=("w5 w6 w7", "w9 w3"), eos: int | None = None):
    """Save a tiny Llama target/draft pair (V=48) with a tokenizer, prompts and build info, like the built-in pair."""
    import json
    from pathlib import Path

    root = Path(root)
    tok = tiny_tokenizer(48)
    target = tiny_model("llama", vocab=48, eos=eos, seed=3)
    draft = perturbed(target, scale=0.2, seed=4)
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    (root / "prompts.jsonl").write_text("\n".join(json.dumps({"prompt": p}) for p in prompts))
    (root / "build_info.json").write_text(json.dumps({"seed": 0, "note": "tiny test pair"}))
    return root
