"""A small transformer trained for N steps on synthetic data with a fixed seed.

Prints one JSON object: the per-step losses, what torch.cuda.mem_get_info() reported, and the
allocator's peak. Used by node_slice.py with and without the vlake hook; deterministic
algorithms are on so two runs on one GPU give identical losses.
"""
import argparse
import json
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402


class Model(nn.Module):
    def __init__(self, vocab=1000, d=256, layers=4, heads=8, seq=128):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(1, seq, d))
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers)
        self.out = nn.Linear(d, vocab)

    def forward(self, x):
        return self.out(self.enc(self.emb(x) + self.pos))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--hold-mib", type=int, default=0, help="extra tensor kept alive during training")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    dev = torch.device("cuda")
    model = Model().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    hold = torch.empty(args.hold_mib << 20, dtype=torch.uint8, device=dev) if args.hold_mib else None
    losses = []
    for _ in range(args.steps):
        x = torch.randint(0, 1000, (args.batch, 128), generator=gen).to(dev)
        y = torch.roll(x, shifts=-1, dims=1)
        loss = nn.functional.cross_entropy(model(x).reshape(-1, 1000), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    free, total = torch.cuda.mem_get_info()
    print(json.dumps({
        "losses": losses,
        "mem_get_info": [free, total],
        "max_reserved": torch.cuda.max_memory_reserved(),
        "held": hold.numel() if hold is not None else 0,
    }))


if __name__ == "__main__":
    main()
