#!/usr/bin/env python3
"""Greedy decode throughput of a GPT-2-class model with random weights (docs/benchmarks.md,
"Decode").

  python3 bench/torch/decode.py [--batch 1] [--tokens 128] [--prompt 32] [--seed 0]
  python3 bench/torch/decode.py --serve      # bench/pairs/pairs.py worker: "decode batch=B tokens=T"

The model is transformers' GPT2LMHeadModel built from its default GPT2Config (12 layers,
d = 768, 12 heads, vocabulary 50257: GPT-2 small, 124 M parameters) with random weights (fixed
seed), fp16, on GPU 0; nothing is downloaded. A measurement: an untimed `generate` of 8 tokens (the worker
may have been idle while the other side of a pair measured), then `generate` with a random
prompt of `prompt` tokens, greedy, KV cache on, exactly `tokens` new tokens (no end-of-sequence
stop), between two synchronizes. Batch 1 is bound by kernel launches and Python (every token is a
dozen launches per layer), batch 32 moves more of the time to the GPU. Prints
{"value": tokens/s (batch x tokens / seconds), "seconds", "batch", "tokens", ...}. Exit 77
when there is no CUDA GPU or transformers is missing.
"""
import argparse
import json
import sys
import time

import worker


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--serve", action="store_true")
    args = ap.parse_args()
    try:
        import torch
        import transformers
    except ImportError as e:
        print("decode.py: %s" % e, file=sys.stderr)
        return 77
    if not torch.cuda.is_available():
        print("decode.py: no CUDA GPU", file=sys.stderr)
        return 77
    transformers.logging.set_verbosity_error()
    torch.manual_seed(args.seed)
    config = transformers.GPT2Config()
    model = transformers.GPT2LMHeadModel(config).to("cuda", dtype=torch.float16).eval()
    gen = torch.Generator(device="cuda").manual_seed(args.seed)

    def decode(batch=args.batch, tokens=args.tokens):
        batch, tokens = int(batch), int(tokens)
        ids = torch.randint(0, config.vocab_size, (batch, args.prompt), device="cuda", generator=gen)
        mask = torch.ones_like(ids)
        with torch.inference_mode():  # untimed: the worker may have been idle while the other side measured
            model.generate(ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False,
                           use_cache=True, pad_token_id=0, eos_token_id=None)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens,
                                 do_sample=False, use_cache=True, pad_token_id=0, eos_token_id=None)
        torch.cuda.synchronize()
        secs = time.perf_counter() - t0
        made = out.shape[1] - args.prompt
        if made != tokens:
            raise RuntimeError("generated %d tokens, asked for %d" % (made, tokens))
        return {"value": batch * tokens / secs, "seconds": secs, "batch": batch, "tokens": tokens,
                "unit": "tokens/s"}

    info = {"model": "gpt2-small (random weights)", "params": sum(p.numel() for p in model.parameters()),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "gpu": torch.cuda.get_device_name(0)}
    if args.serve:
        return worker.serve({"decode": decode}, info)
    decode()  # warm-up: cuBLAS handles, kernels, the caching allocator
    print(json.dumps(dict(decode(), **info)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
