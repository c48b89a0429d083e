"""Produce the Hugging Face round-trip fixture (run once; PyTorch is not needed in CI).

    cargo run -p exatrain-train --example hf_fixture_model -- /tmp/hf_tiny
    python3 scripts/hf_fixture.py /tmp/hf_tiny crates/exatrain-train/tests/fixtures/hf_tiny.json

Loads the exported folder with transformers' GPT2LMHeadModel and records its logits for the
fixture's tokens, plus the sha256 of the model.safetensors it loaded.
"""
import hashlib
import json
import sys

import torch
from transformers import GPT2LMHeadModel

src, out = sys.argv[1], sys.argv[2]
model = GPT2LMHeadModel.from_pretrained(src)
model.eval()
tokens = [((i * 17 + 3) % 50) for i in range(24)]
with torch.no_grad():
    logits = model(torch.tensor(tokens).view(2, 12)).logits  # [2, 12, V]
sha = hashlib.sha256(open(f"{src}/model.safetensors", "rb").read()).hexdigest()
json.dump(
    {
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
        "tokens": tokens,
        "shape": list(logits.shape),
        "safetensors_sha256": sha,
        "logits": [round(float(x), 7) for x in logits.flatten()],
    },
    open(out, "w"),
)
print(f"wrote {out}: logits {list(logits.shape)}, sha256 {sha[:12]}")
