#!/usr/bin/env python3
"""One serving replica: loads a Hugging Face causal LM with from_pretrained, moves it to the GPU,
shares its weights with the other replicas on the GPU (vlake.share_module, when the process runs
under libvlake-hook.so) and answers generation requests: one prompt per line on stdin, one JSON
line per answer on stdout, greedy decoding (the same prompt gives the same tokens in every
replica). Exits at the end of its input.

  serve.py MODEL_DIR [--no-share] [--max-new-tokens 32]
  serve.py --context-only     (CUDA initialised, no model: what a process costs by itself)

Before the first answer it prints one line {"event": "ready", ...}: whether the weights are
shared (and the byte counts share_module reported), the replica's size, the allocator settings.
Without a tokenizer in MODEL_DIR, a prompt's UTF-8 bytes are its token ids (+3).
"""
import argparse
import gc
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))  # vlake's package in a source tree
from make_model import module_bytes  # noqa: E402


def emit(**kw):
    print(json.dumps(kw), flush=True)


def dtype_kwargs(torch_dtype):
    """from_pretrained's dtype argument: `dtype` since transformers 4.56, `torch_dtype` before."""
    import transformers
    version = tuple(int(x) for x in transformers.__version__.split(".")[:2] if x.isdigit())
    return {"dtype" if version >= (4, 56) else "torch_dtype": torch_dtype}


class ByteTokenizer:
    """Stands in for a tokenizer when the model directory has none: byte b is token b + 3."""

    def encode(self, text):
        return [b + 3 for b in text.encode()] or [1]

    def decode(self, ids):
        return bytes(i - 3 for i in ids if 3 <= i < 259).decode(errors="replace")


def load(model_dir, share=True):
    """from_pretrained + .cuda(), then vlake.share_module when the hook is loaded (and `share`).
    Returns (model, tokenizer, info)."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, **dtype_kwargs(torch.float16))
    model = model.to("cuda").eval()
    expandable = allocator_info(torch)  # while PyTorch's allocator holds the weights
    info = {"expandable": expandable, "replica_bytes": module_bytes(model), "shared": False, "stats": None}
    if share:
        import vlake
        if vlake.available():
            info["stats"] = vlake.share_module(model)
            info["shared"] = True
        else:
            info["note"] = "libvlake-hook.so is not loaded: weights not shared"
    gc.collect()
    torch.cuda.empty_cache()  # the unpacked copies go back (the hook returns them to vlake's pool)
    try:
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except Exception:
        tokenizer = ByteTokenizer()
    return model, tokenizer, info


def generate(model, tokenizer, prompt, max_new_tokens=32):
    """Greedy decoding of exactly `max_new_tokens` tokens; returns (token ids, text)."""
    import torch
    ids = torch.tensor([tokenizer.encode(prompt)], device="cuda")
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                             pad_token_id=0)
    tokens = out[0, ids.shape[1]:].tolist()
    return tokens, tokenizer.decode(tokens)


def allocator_info(torch):
    """Whether PyTorch's caching allocator uses expandable segments (None if it cannot tell)."""
    try:
        segs = torch.cuda.memory_snapshot()
    except Exception:
        return None
    flags = [s.get("is_expandable") for s in segs if "is_expandable" in s]
    return any(flags) if flags else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", nargs="?")
    ap.add_argument("--no-share", action="store_true", help="load the weights privately")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--context-only", action="store_true",
                    help="initialise CUDA, load no model, answer nothing (measures a process's own cost)")
    args = ap.parse_args()
    import torch
    import transformers  # noqa: F401  (the same imports as a replica)
    if not torch.cuda.is_available():
        print("serve.py: no CUDA device", file=sys.stderr)
        return 1
    alloc_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", os.environ.get("PYTORCH_ALLOC_CONF", ""))
    if args.context_only:
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        emit(event="ready", pid=os.getpid(), context_only=True, alloc_conf=alloc_conf)
        for _ in sys.stdin:
            pass
        return 0
    if not args.model_dir:
        ap.error("MODEL_DIR is required")
    model, tokenizer, info = load(args.model_dir, share=not args.no_share)
    emit(event="ready", pid=os.getpid(), alloc_conf=alloc_conf,
         torch=torch.__version__, transformers=transformers.__version__, **info)
    for line in sys.stdin:
        prompt = line.rstrip("\n")
        if not prompt:
            continue
        tokens, text = generate(model, tokenizer, prompt, args.max_new_tokens)
        emit(prompt=prompt, tokens=tokens, text=text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
