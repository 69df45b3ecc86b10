#!/usr/bin/env python3
"""A Hugging Face-style forward in PyTorch (float64) behind a cartridge .pt,
for tests/lua/torchpt_spec.lua: the reference's computation, written apart
from the engine.

    torch_prefix_forward.py WEIGHTS.safetensors CONFIG.json CARTRIDGE.pt IDS

WEIGHTS holds the model's GGUF tensors as f32 under their GGUF names;
CONFIG its shape ({"arch", "n_layer", "n_head", "n_head_kv", "head_dim",
"eps", "theta", "neox"}); IDS the question's token ids, comma-separated.
The cartridge's rows sit at positions 0..p-1 and the question's tokens at
p.., as in the reference trainer. GGUF files of llama-architecture models
store q/k rows permuted for GGML's RoPE pairs (neox false); they are put
back in Hugging Face's order here, so RoPE rotates (i, i + d/2) as in
transformers. Prints the last token's logits as JSON."""
import json
import struct
import sys

import torch


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        t = torch.frombuffer(bytearray(raw[8 + n + a:8 + n + b]), dtype=torch.float32)
        out[name] = t.reshape(e["shape"]).double()
    return out


def hf_rows(w, heads, d):
    """GGUF row 2b + a of each head is Hugging Face's row a * d/2 + b."""
    w = w.reshape(heads, d // 2, 2, -1)
    return w.transpose(1, 2).reshape(heads * d, -1)


def rms(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, d, theta):
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos[:, None].double() * inv[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    half = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * cos + half * sin


def main():
    W = read_safetensors(sys.argv[1])
    cfg = json.load(open(sys.argv[2]))
    cache = torch.load(sys.argv[3], weights_only=False)  # the reference's nn.ParameterList needs it
    ids = torch.tensor([int(i) for i in sys.argv[4].split(",")])
    L, H, KV, d, eps = cfg["n_layer"], cfg["n_head"], cfg["n_head_kv"], cfg["head_dim"], cfg["eps"]
    frozen = "frozen_keys" if "frozen_keys" in cache else "fixed_keys"
    fv = frozen.replace("keys", "values")
    p = cache["trainable_keys"][0].shape[2] + (cache[frozen][0].shape[2] if cache[frozen] else 0)
    n = len(ids)
    pos = torch.arange(p, p + n)
    x = W["token_embd.weight"][ids]
    for l in range(L):
        g = lambda name: W["blk.%d.%s.weight" % (l, name)]
        h = rms(x, g("attn_norm"), eps)
        wq, wk = g("attn_q"), g("attn_k")
        if not cfg["neox"]:
            wq, wk = hf_rows(wq, H, d), hf_rows(wk, KV, d)
        q = (h @ wq.T).reshape(n, H, d)
        k = (h @ wk.T).reshape(n, KV, d)
        v = (h @ g("attn_v").T).reshape(n, KV, d)
        if cfg["arch"] == "qwen3":
            q, k = rms(q, g("attn_q_norm"), eps), rms(k, g("attn_k_norm"), eps)
        q, k = rope(q.transpose(0, 1), pos, d, cfg["theta"]), rope(k.transpose(0, 1), pos, d, cfg["theta"])
        rows = lambda key: [t[0].double() for t in (cache[key][l:l + 1] if cache[key] else [])]
        K = torch.cat(rows(frozen) + rows("trainable_keys") + [k], 1)  # [KV, p + n, d]
        V = torch.cat(rows(fv) + rows("trainable_values") + [v.transpose(0, 1)], 1)
        K, V = K.repeat_interleave(H // KV, 0), V.repeat_interleave(H // KV, 0)
        s = q @ K.transpose(1, 2) / d ** 0.5  # [H, n, p + n]
        mask = torch.ones(n, p + n, dtype=torch.bool)
        mask[:, p:] = torch.tril(torch.ones(n, n, dtype=torch.bool))
        s = s.masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + (s @ V).transpose(0, 1).reshape(n, H * d) @ g("attn_output").T
        h = rms(x, g("ffn_norm"), eps)
        x = x + (torch.nn.functional.silu(h @ g("ffn_gate").T) * (h @ g("ffn_up").T)) @ g("ffn_down").T
    out = W.get("output.weight", W["token_embd.weight"])
    logits = rms(x, W["output_norm.weight"], eps) @ out.T
    print(json.dumps([float(v) for v in logits[-1]]))


if __name__ == "__main__":
    main()
