"""The trainer's bench config in Hugging Face GPT-2 + PyTorch on the CPU, for comparison with
`cargo bench -p exatrain-train --bench step`: 6 layers, hidden 384, 6 heads, seq 256,
micro-batch 8, vocab 8192, fp32, AdamW, 2 threads.   python3 scripts/bench_pytorch.py
"""
import statistics
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.set_num_threads(2)
torch.manual_seed(0)
cfg = GPT2Config(vocab_size=8192, n_positions=256, n_embd=384, n_layer=6, n_head=6,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
model = GPT2LMHeadModel(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
x = torch.randint(0, 8192, (8, 256))
times = []
for i in range(8):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = model(x, labels=x).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if i >= 2:
        times.append(time.perf_counter() - t0)
step = statistics.median(times)
print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
print(f"step (median of 6)  {step:.3f} s")
print(f"tokens/s            {8 * 256 / step:.0f}")
