#!/usr/bin/env python3
"""Prints llama.cpp's CUDA backend and commit-run side by side from tools/gpu/check.sh's vs stage
(issue 35): for each synthetic file, prefill (512-token prompts) and decode tokens/s with the
whole model on the card, then with a budget the model does not fit, llama.cpp's --n-cpu-moe N
against commit-run's policies at the device memory llama.cpp's split took, and the ratios.

    python3 tools/gpu/vs.py OUT SHAPE ...

OUT holds lcpp-SHAPE/bench-gpu.json, lcpp-SHAPE/bench-nographs.json and
lcpp-SHAPE/bench-ncmoeN.json (llama-bench -o json), and vs-SHAPE-card.json and
vs-SHAPE-budget.json (commit-run bench --json with --prompt-len 512; vs-SHAPE-cold.json the first
without bench's warm-up prompt, whose prefill shows the one-time costs; vs-SHAPE-card-wN.json the
first with --gpu-row-warps N, N warps a row of the integer decode products), and for decode at a long
context lcpp-SHAPE/bench-dD.json (llama-bench -p 0 -n 64 -d D) and vs-SHAPE-dD.json (64 tokens after
a D-token prompt), whose prompt is set beside lcpp-SHAPE/bench-ppD.json (llama-bench -p D -n 0).
commit-run's prefill rate
is 512 / its time to first token, which also holds the first token's sampling; llama-bench's pp
times the batch alone. Decode: llama-bench's tg128 from an empty cache, commit-run's tokens after
the 512-token prompt.
"""
import glob
import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"vs.py: {path}: {e}", file=sys.stderr)
        return None


def llama(path):
    """pp and tg tokens/s of a llama-bench JSON, (None, None) where missing."""
    pp = tg = None
    for r in load(path) or []:
        if r.get("n_prompt"):
            pp = r["avg_ts"]
        elif r.get("n_gen"):
            tg = r["avg_ts"]
    return pp, tg


def ours(rep, policy=None, prompt=512):
    """prefill and decode tokens/s of a commit-run bench row whose prompts were prompt tokens."""
    for r in (rep or {}).get("Rows", []):
        if policy is None or r["Policy"] == policy:
            return prompt / r["TTFT"], r["TokensPerSecond"], r.get("GPUPerToken")
    return None, None, None


def per_token(per):
    """A decoded token's launches, kernels, read-backs and writes (GPUPerToken), "" where none."""
    if not per:
        return ""
    s = f"{per['Launches']:.1f} launches, {per['Kernels']:.0f} kernels, {per['Reads']:.1f} reads"
    if "Writes" in per:
        s += f", {per['Writes']:.1f} writes, {per['Pageable']:.1f} pageable"
    return s


def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"


def num(v):
    return f"{v:.1f}" if v else "-"


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out = argv[1]
    print(f"{'file':>10} {'setup':>28} {'llama pp512':>12} {'ours pp512':>11} {'ratio':>7} {'llama tg':>9} {'ours tg':>8} {'ratio':>7}  per token")
    for shape in argv[2:]:
        lpp, ltg = llama(os.path.join(out, f"lcpp-{shape}", "bench-gpu.json"))
        _, lng = llama(os.path.join(out, f"lcpp-{shape}", "bench-nographs.json"))
        pp, tg, per = ours(load(os.path.join(out, f"vs-{shape}-card.json")))
        launches = per_token(per)
        print(f"{shape:>10} {'whole model on the card':>28} {num(lpp):>12} {num(pp):>11} {ratio(pp, lpp):>7} {num(ltg):>9} {num(tg):>8} {ratio(tg, ltg):>7}  {launches}")
        print(f"{'':>10} {'llama.cpp without graphs':>28} {'':>12} {'':>11} {'':>7} {num(lng):>9}")
        cpp, _, _ = ours(load(os.path.join(out, f"vs-{shape}-cold.json")))
        print(f"{'':>10} {'ours without the warm-up':>28} {'':>12} {num(cpp):>11}")
        for path in sorted(glob.glob(os.path.join(out, f"vs-{shape}-card-w*.json"))):
            w = os.path.basename(path)[len(f"vs-{shape}-card-w"):-len(".json")]
            wpp, wtg, _ = ours(load(path))
            print(f"{'':>10} {f'ours, {w} warps a row':>28} {num(lpp):>12} {num(wpp):>11} {ratio(wpp, lpp):>7} {num(ltg):>9} {num(wtg):>8} {ratio(wtg, ltg):>7}")
        for path in sorted(glob.glob(os.path.join(out, f"lcpp-{shape}", "bench-d*.json"))):
            d = os.path.basename(path)[len("bench-d"):-len(".json")]
            _, dtg = llama(path)
            opp, otg, _ = ours(load(os.path.join(out, f"vs-{shape}-d{d}.json")), prompt=int(d))
            dpp, _ = llama(os.path.join(out, f"lcpp-{shape}", f"bench-pp{d}.json"))
            print(f"{'':>10} {f'prompt of {d}, decode after':>28} {num(dpp):>12} {num(opp):>11} {ratio(opp, dpp):>7} {num(dtg):>9} {num(otg):>8} {ratio(otg, dtg):>7}")
        ncmoe = sorted(glob.glob(os.path.join(out, f"lcpp-{shape}", "bench-ncmoe*.json")))
        budget = load(os.path.join(out, f"vs-{shape}-budget.json"))
        for path in ncmoe:
            n = os.path.basename(path)[len("bench-ncmoe"):-len(".json")]
            lpp, ltg = llama(path)
            mem = budget["GPUMem"] / 2**20 if budget else 0
            print(f"{'':>10} {f'--n-cpu-moe {n}, {mem:.0f} MiB':>28} {num(lpp):>12} {'':>11} {'':>7} {num(ltg):>9}")
            for r in (budget or {}).get("Rows", []):
                pp, tg, per = ours(budget, r["Policy"])
                print(f"{'':>10} {r['Policy']:>28} {'':>12} {num(pp):>11} {ratio(pp, lpp):>7} {'':>9} {num(tg):>8} {ratio(tg, ltg):>7}  {per_token(per)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
