#!/usr/bin/env python3
"""Builds a stand-in for the model you serve: a Llama-architecture causal LM with random weights
(seeded, so every run builds the same bytes), fp16, about 1 GB, saved with save_pretrained
(safetensors + config.json). Nothing is downloaded.

  make_model.py OUT_DIR [--layers 8] [--seed 0]

As a module: build(out_dir, layers=8, seed=0) -> bytes of parameters and buffers.
"""
import argparse
import sys

# ~492 M parameters: 8 layers of hidden 2048 / MLP 5632 / 16 heads (4 key-value heads),
# a 32000-token vocabulary with separate input and output embeddings. 984 MB in fp16.
CONFIG = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=8,
              num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048,
              tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)


def module_bytes(model):
    """Bytes of a module's parameters and buffers: what one replica holds on the GPU."""
    n = sum(p.numel() * p.element_size() for p in model.parameters())
    return n + sum(b.numel() * b.element_size() for b in model.buffers())


def build(out_dir, layers=8, seed=0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    config = LlamaConfig(**dict(CONFIG, num_hidden_layers=layers))
    model = LlamaForCausalLM(config).to(torch.float16).eval()  # random init in fp32, stored in fp16
    model.save_pretrained(out_dir)
    return module_bytes(model)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--layers", type=int, default=CONFIG["num_hidden_layers"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    n = build(args.out_dir, args.layers, args.seed)
    print("saved %s: %.1f MiB of fp16 weights" % (args.out_dir, n / (1 << 20)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
