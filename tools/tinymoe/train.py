#!/usr/bin/python3
"""Train one of the bundled tiny MoE language models.

The model is written exactly as llama.cpp computes it for the GGUF architecture named in the
config (llama with experts = Mixtral, or qwen2moe = Qwen1.5-MoE), with tensors named and shaped
as in the GGUF file, so that export is a plain copy and the engine runs the trained function, not
an approximation of it:

  x = token_embd[ids]
  per layer:  x += attn(rmsnorm(x) * attn_norm);  x += moe(rmsnorm(x) * ffn_norm)
  logits = rmsnorm(x) * output_norm @ output

  attention: RoPE (llama: adjacent pairs, NORM; qwen2moe: halves, NEOX), grouped-query heads
  (head h reads kv head h // (n_head / n_head_kv)), causal softmax(q k / sqrt(d_head)) v.
  moe: p = softmax(router x); the top-k experts by p, weights p (renormalised over the k when
  norm_topk); expert(x) = down(silu(gate x) * up x).  qwen2moe adds a shared expert scaled by
  sigmoid(shexp_gate . x).

Data: the token ids written by `tinymoe prep` (train.u16, heldout.u16); random windows of
context+1 tokens from the training part only, drawn from a generator seeded by the config.

Usage (see README.md):  /usr/bin/python3 tools/tinymoe/train.py CONFIG.json PREP_DIR OUT.safetensors
"""

import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F


def load_ids(path):
    return torch.from_numpy(np.fromfile(path, dtype="<u2").astype(np.int64))


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(n_pos, head_dim, base, device):
    inv = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
    ang = torch.arange(n_pos, dtype=torch.float64, device=device)[:, None] * inv[None, :]
    return ang.cos().float(), ang.sin().float()  # (T, head_dim/2)


def apply_rope(x, cos, sin, neox):
    # x: (B, T, H, D)
    cos = cos[None, :, None, :]
    sin = sin[None, :, None, :]
    if neox:
        h = x.shape[-1] // 2
        a, b = x[..., :h], x[..., h:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


class TinyMoE(torch.nn.Module):
    def __init__(self, cfg, vocab):
        super().__init__()
        self.cfg = cfg
        self.vocab = vocab
        d, L = cfg["n_embd"], cfg["n_layer"]
        H, KV = cfg["n_head"], cfg["n_head_kv"]
        hd = d // H
        E, ff, sff = cfg["n_expert"], cfg["expert_ffn"], cfg["shared_ffn"]
        std = 0.02
        out_std = std / math.sqrt(2 * L)
        self.names = []

        def add(name, shape, init):
            p = torch.nn.Parameter(torch.empty(*shape))
            if init == "one":
                torch.nn.init.ones_(p)
            elif init == "zero":
                torch.nn.init.zeros_(p)
            else:
                torch.nn.init.normal_(p, 0.0, init)
            self.register_parameter(name.replace(".", "__"), p)
            self.names.append(name)

        add("token_embd.weight", (vocab, d), std)
        for i in range(L):
            p = f"blk.{i}."
            add(p + "attn_norm.weight", (d,), "one")
            add(p + "attn_q.weight", (H * hd, d), std)
            add(p + "attn_k.weight", (KV * hd, d), std)
            add(p + "attn_v.weight", (KV * hd, d), std)
            if cfg["arch"] == "qwen2moe":
                add(p + "attn_q.bias", (H * hd,), "zero")
                add(p + "attn_k.bias", (KV * hd,), "zero")
                add(p + "attn_v.bias", (KV * hd,), "zero")
            add(p + "attn_output.weight", (d, H * hd), out_std)
            add(p + "ffn_norm.weight", (d,), "one")
            add(p + "ffn_gate_inp.weight", (E, d), std)
            add(p + "ffn_gate_exps.weight", (E, ff, d), std)
            add(p + "ffn_up_exps.weight", (E, ff, d), std)
            add(p + "ffn_down_exps.weight", (E, d, ff), out_std)
            if sff > 0:
                add(p + "ffn_gate_inp_shexp.weight", (d,), std)
                add(p + "ffn_gate_shexp.weight", (sff, d), std)
                add(p + "ffn_up_shexp.weight", (sff, d), std)
                add(p + "ffn_down_shexp.weight", (d, sff), out_std)
        add("output_norm.weight", (d,), "one")
        add("output.weight", (vocab, d), std)

    def w(self, name):
        return getattr(self, name.replace(".", "__"))

    def forward(self, ids, stats=None):
        cfg = self.cfg
        B, T = ids.shape
        d, H, KV = cfg["n_embd"], cfg["n_head"], cfg["n_head_kv"]
        hd = d // H
        eps = cfg["eps"]
        neox = cfg["arch"] != "llama"
        cos, sin = rope_tables(T, hd, cfg["rope_base"], ids.device)
        mask = torch.full((T, T), float("-inf"), device=ids.device).triu(1)
        x = F.embedding(ids, self.w("token_embd.weight"))
        aux = x.new_zeros(())
        for i in range(cfg["n_layer"]):
            p = f"blk.{i}."
            h = rmsnorm(x, self.w(p + "attn_norm.weight"), eps)
            bias = (lambda n: self.w(p + n + ".bias")) if cfg["arch"] == "qwen2moe" else (lambda n: None)
            q = F.linear(h, self.w(p + "attn_q.weight"), bias("attn_q")).view(B, T, H, hd)
            k = F.linear(h, self.w(p + "attn_k.weight"), bias("attn_k")).view(B, T, KV, hd)
            v = F.linear(h, self.w(p + "attn_v.weight"), bias("attn_v")).view(B, T, KV, hd)
            q, k = apply_rope(q, cos, sin, neox), apply_rope(k, cos, sin, neox)
            if KV != H:
                k = k.repeat_interleave(H // KV, dim=2)
                v = v.repeat_interleave(H // KV, dim=2)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, hd)
            att = (q @ k.transpose(-1, -2)) / math.sqrt(hd) + mask
            o = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * hd)
            x = x + F.linear(o, self.w(p + "attn_output.weight"))
            h = rmsnorm(x, self.w(p + "ffn_norm.weight"), eps)
            y, a = self.moe(p, h.reshape(B * T, d), i, stats)
            x = x + y.view(B, T, d)
            aux = aux + a
        x = rmsnorm(x, self.w("output_norm.weight"), eps)
        return F.linear(x, self.w("output.weight")), aux / cfg["n_layer"]

    def moe(self, p, h, layer, stats):
        cfg = self.cfg
        E, k = cfg["n_expert"], cfg["n_expert_used"]
        probs = F.linear(h, self.w(p + "ffn_gate_inp.weight")).softmax(-1)
        topv, topi = probs.topk(k, dim=-1)
        if cfg["norm_topk"]:
            topv = topv / topv.sum(-1, keepdim=True)
        gate, up, down = (self.w(p + n) for n in ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"))
        out = torch.zeros_like(h)
        counts = torch.zeros(E, device=h.device)
        for e in range(E):
            rows, slot = (topi == e).nonzero(as_tuple=True)
            counts[e] = rows.numel()
            if rows.numel() == 0:
                continue
            xe = h[rows]
            ye = F.linear(F.silu(F.linear(xe, gate[e])) * F.linear(xe, up[e]), down[e])
            out.index_add_(0, rows, ye * topv[rows, slot].unsqueeze(1))
        if cfg["shared_ffn"] > 0:
            s = F.linear(F.silu(F.linear(h, self.w(p + "ffn_gate_shexp.weight"))) * F.linear(h, self.w(p + "ffn_up_shexp.weight")),
                         self.w(p + "ffn_down_shexp.weight"))
            g = torch.sigmoid(h @ self.w(p + "ffn_gate_inp_shexp.weight"))
            out = out + s * g.unsqueeze(1)
        # Switch-Transformer balance loss: E * sum_e (share of routed slots) * (mean probability).
        frac = counts / counts.sum()
        aux = E * (frac * probs.mean(0)).sum()
        if stats is not None:
            stats[layer] += counts.cpu()
        return out, aux


def save_safetensors(path, model, meta):
    """Writes the parameters as F32 safetensors (8-byte header length, JSON header, raw data)."""
    header, blobs, off = {}, [], 0
    for name in model.names:
        t = model.w(name).detach().to("cpu", torch.float32).contiguous()
        b = t.numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {k: str(v) for k, v in meta.items()}
    hj = json.dumps(header, sort_keys=True).encode()
    hj += b" " * (-len(hj) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


@torch.no_grad()
def evaluate(model, ids, ctx, device, max_windows=None):
    """Mean NLL (nats) over non-overlapping windows of ctx tokens, scoring every token of a window
    but its first: the same windows `commit-run eval ppl` uses."""
    model.eval()
    nll, n = 0.0, 0
    windows = len(ids) // ctx
    if max_windows:
        windows = min(windows, max_windows)
    for w in range(windows):
        seg = ids[w * ctx:(w + 1) * ctx].to(device)[None]
        logits, _ = model(seg)
        nll += F.cross_entropy(logits[0, :-1].float(), seg[0, 1:], reduction="sum").item()
        n += ctx - 1
    model.train()
    return nll / n, n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("prep", help="directory written by `tinymoe prep`")
    ap.add_argument("out", help="output .safetensors")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (the result depends on it)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--steps", type=int, default=0, help="override the config's step count (smoke tests)")
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--save-every", type=int, default=100)
    args = ap.parse_args()

    cfg = json.load(open(args.config))
    prep = json.load(open(os.path.join(args.prep, "prep.json")))
    steps = args.steps or cfg["steps"]
    torch.set_num_threads(args.threads)
    torch.manual_seed(cfg["seed"])
    torch.use_deterministic_algorithms(True)
    device = torch.device(args.device)

    train = load_ids(os.path.join(args.prep, "train.u16"))
    held = load_ids(os.path.join(args.prep, "heldout.u16"))
    model = TinyMoE(cfg, prep["vocab_size"]).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{cfg['name']}: {n_params/1e6:.2f}M parameters, {len(train)} training tokens, torch {torch.__version__}, "
          f"{args.threads} threads on {device}", flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg["lr"], betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(cfg["seed"])
    ctx, batch = cfg["context"], cfg["batch"]

    def lr_at(step):
        if step < cfg["warmup"]:
            return cfg["lr"] * (step + 1) / cfg["warmup"]
        t = (step - cfg["warmup"]) / max(1, steps - cfg["warmup"])
        return cfg["min_lr"] + 0.5 * (cfg["lr"] - cfg["min_lr"]) * (1 + math.cos(math.pi * t))

    stats = torch.zeros(cfg["n_layer"], cfg["n_expert"])
    t0 = time.time()
    for step in range(steps):
        starts = torch.randint(0, len(train) - ctx - 1, (batch,), generator=gen)
        seq = torch.stack([train[s:s + ctx + 1] for s in starts]).to(device)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        logits, aux = model(seq[:, :-1], stats)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), seq[:, 1:].reshape(-1))
        (loss + cfg["aux_loss"] * aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % args.log_every == 0 or step == 0:
            el = time.time() - t0
            load = stats / stats.sum(1, keepdim=True) * cfg["n_expert"]
            print(f"step {step+1}/{steps} loss {loss.item():.4f} ({loss.item()/math.log(2)/prep['bytes_per_token']:.3f} bpb) "
                  f"aux {aux.item():.3f} lr {lr_at(step):.2e} {(step+1)*batch*ctx/el:.0f} tok/s "
                  f"max/mean load {' '.join(f'{m:.2f}' for m in load.max(1).values.tolist())} {el/60:.1f} min", flush=True)
            stats.zero_()
        if (step + 1) % args.save_every == 0 or step + 1 == steps:
            save_safetensors(args.out, model, {"config": json.dumps(cfg, sort_keys=True), "step": step + 1})
    nll, n = evaluate(model, held, ctx, device)
    bpb = nll * n / math.log(2) / (prep["heldout_bytes"] * n / prep["heldout_tokens"])
    print(f"held-out: {nll:.4f} nats/token, perplexity {math.exp(nll):.3f}, ~{bpb:.3f} bits/byte "
          f"(unigram {prep['unigram_bits_per_byte']:.3f}) over {n} tokens; {(time.time()-t0)/60:.1f} min", flush=True)


if __name__ == "__main__":
    main()
