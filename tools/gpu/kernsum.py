#!/usr/bin/env python3
"""Sets a decoded token's kernels of commit-run beside llama.cpp's, or a prompt's, from Nsight
Compute's duration of every launch (tools/gpu/check.sh's ncudec and ncupre stages): per kernel
name, its launches and its device time per step (a token, or a prompt), and the sums; so the gap
between the two engines' rates splits into the kernels' own time and what lies between them
(launch latency, gaps in a graph, the host).

    python3 tools/gpu/kernsum.py OURS.csv OURS_STEPS LCPP.csv LCPP_STEPS

Each CSV is `ncu --csv --print-units base --metrics gpu__time_duration.sum`'s output; STEPS is how
many steps the run took (every launch of the CSV counts, so a run is chosen whose launches are
all of such steps: a one-token prompt for commit-run, llama-bench -p 0 --no-warmup for decode;
one prompt's launches, llama-bench -n 0 for prompts).
"""
import csv
import sys


def short(name):
    """A kernel's demangled name without its return type and parameters, with its template
    arguments (llama.cpp's mul_mat_vec_q<(ggml_type)12, 1, ...> are one per weight type)."""
    if name.startswith("void "):
        name = name[5:]
    depth = 0
    for i, c in enumerate(name):
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0:
            return name[:i].strip()
    return name.strip()


def load(path):
    """Returns {kernel name: [launches, seconds]} from one ncu CSV."""
    kernels = {}
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own messages start with ==PROF==
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = short(row["Kernel Name"])
        v = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "nsecond")
        v *= {"nsecond": 1e-9, "ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3, "second": 1.0, "s": 1.0}.get(unit, 1e-9)
        k = kernels.setdefault(name, [0, 0.0])
        k[0] += 1
        k[1] += v
    return kernels


def table(title, kernels, steps):
    total = sum(v[1] for v in kernels.values())
    launches = sum(v[0] for v in kernels.values())
    print(f"== {title}: {launches / steps:.1f} kernels and {total / steps * 1e6:.1f} us of kernel time a step ({steps} steps)")
    print(f"{'kernel':>44} {'a step':>7} {'us/step':>9} {'us each':>8} {'share':>6}")
    for name, (n, s) in sorted(kernels.items(), key=lambda kv: -kv[1][1]):
        print(f"{name[:44]:>44} {n / steps:7.1f} {s / steps * 1e6:9.1f} {s / n * 1e6:8.2f} {100 * s / total:5.1f}%")
    return total / steps, launches / steps


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    ours = table("commit-run", load(sys.argv[1]), int(sys.argv[2]))
    theirs = table("llama.cpp", load(sys.argv[3]), int(sys.argv[4]))
    print(f"== kernel time a step: commit-run {ours[0] * 1e6:.1f} us, llama.cpp {theirs[0] * 1e6:.1f} us "
          f"({theirs[0] / ours[0]:.2f}x); kernels {ours[1]:.1f} against {theirs[1]:.1f}")


if __name__ == "__main__":
    main()
