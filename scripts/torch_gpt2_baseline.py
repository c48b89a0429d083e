#!/usr/bin/env python3
"""PyTorch baseline for the GPU benchmark of scripts/device_check.sh: a GPT-2 of the given shape
(default 124M: 12 layers, 768 wide, 12 heads, seq 1024, vocab 50257 padded to 50304), trained
with AdamW in bf16 autocast on one GPU, timed over a few steps, in two modes:

  eager    — no compilation; attention written out (QKᵀ, causal mask, softmax, ·V), as
             exatrain's first GPU attention computes it
  compile  — torch.compile with scaled_dot_product_attention (flash attention)

Prints one JSON line per mode: tokens/s, step time, MFU against --peak-tflops (989 for H100/H200
dense bf16) with the FLOPs counted as exatrain's planner counts them (6·N·tokens for the
weights + 12·L·T·C per token for attention, the PaLM convention), and peak memory.
Written for exatrain (not taken from any repository). `--tiny --device cpu` checks it runs.
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, nh, sdpa):
        super().__init__()
        self.nh, self.sdpa = nh, sdpa
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.fcproj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def attention(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.nh, c // self.nh).transpose(1, 2) for z in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
            y = att @ v
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, c, nh, seq, vocab, sdpa):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, c), nn.Embedding(seq, c)
        self.blocks = nn.ModuleList(Block(c, nh, sdpa) for _ in range(layers))
        self.lnf = nn.LayerNorm(c)
        for m in self.modules():  # GPT-2's initialisation
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        t = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model: checks the script runs")
    a = ap.parse_args()
    if a.tiny:
        a.layers, a.hidden, a.heads, a.seq, a.vocab, a.micro_batch, a.steps = 2, 64, 4, 64, 512, 2, 2
    torch.manual_seed(0)
    dev = torch.device(a.device)
    for mode in a.modes.split(","):
        model = GPT(a.layers, a.hidden, a.heads, a.seq, a.vocab, sdpa=(mode == "compile")).to(dev)
        n_params = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
        opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=(dev.type == "cuda"))
        step_fn = torch.compile(model) if mode == "compile" else model
        idx = torch.randint(0, a.vocab, (a.micro_batch, a.seq), device=dev)
        tgt = torch.randint(0, a.vocab, (a.micro_batch, a.seq), device=dev)

        def step():
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
                loss = step_fn(idx, tgt)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        for _ in range(3):  # warm-up (and compilation)
            step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            loss = step()
        loss = loss.item()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / a.steps
        tokens = a.micro_batch * a.seq
        flops = 6 * n_params * tokens + 12 * a.layers * a.seq * a.hidden * tokens
        print(json.dumps({
            "framework": f"torch {torch.__version__}", "mode": mode, "micro_batch": a.micro_batch,
            "seq": a.seq, "params": n_params, "step_s": dt, "tokens_per_s": tokens / dt,
            "mfu": flops / dt / (a.peak_tflops * 1e12), "loss": loss,
            "peak_memory_gib": (torch.cuda.max_memory_allocated() / 2**30) if dev.type == "cuda" else None,
        }), flush=True)
        del model, opt, step_fn
        if dev.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
