#!/usr/bin/env python3
"""Compares a bench run on a real GPU with the same run on a simulated one (issue 6's simulator
calibration): per policy, the measured and the simulated mean per-token latency and their ratio
(goal: within 25%), and the copy stream's measured bandwidth against the profile's pcie_effective.

    python3 tools/gpu/compare.py MEASURED.json SIMULATED.json [PROFILE.json]

The JSON files are `commit-run bench --json` outputs of the same model, budget, policies and
tokens; tools/gpu/check.sh's offload stage writes them. It prints, it does not edit the profile.
"""
import json
import sys


def main(argv):
    if len(argv) not in (3, 4):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        real = json.load(f)
    with open(argv[2]) as f:
        sim = json.load(f)
    if real.get("Simulated") or not sim.get("Simulated"):
        print("compare.py: want a real GPU's run first and a simulated one second", file=sys.stderr)
        return 2
    rows = {r["Policy"]: r for r in sim["Rows"]}
    print(f"{real['Device']} against {sim['Device']}, {real['Prompts']} prompts x {real['Tokens']} tokens, "
          f"{real['GPUMem'] / 2**20:.0f} MiB budget")
    print(f"{'policy':>10} {'measured ms':>12} {'device ms':>10} {'simulated ms':>13} {'sim/measured':>13} {'within 25%':>11}")
    worst, copy_bytes, copy_sec = 0.0, 0, 0.0
    for r in real["Rows"]:
        s = rows.get(r["Policy"])
        if s is None:
            print(f"{r['Policy']:>10}: not in the simulated run")
            continue
        ratio = s["Mean"] / r["Mean"]
        worst = max(worst, abs(ratio - 1))
        dev = r.get("DeviceTimePerToken", 0) * 1e3
        print(f"{r['Policy']:>10} {r['Mean'] * 1e3:12.3f} {dev:10.3f} {s['Mean'] * 1e3:13.3f} {ratio:13.3f} "
              f"{'yes' if abs(ratio - 1) <= 0.25 else 'NO':>11}")
        g = r.get("GPU") or {}
        copy_bytes += g.get("CopyBytes", 0)
        copy_sec += g.get("CopySeconds", 0.0)
    print(f"largest deviation: {worst * 100:.1f}%")
    if copy_sec > 0:
        bw = copy_bytes / copy_sec
        line = f"copy stream measured {bw / 1e9:.2f} GB/s over {copy_bytes / 1e6:.1f} MB"
        if len(argv) == 4:
            with open(argv[3]) as f:
                prof = json.load(f)
            line += f"; the profile's pcie_effective is {prof['pcie_effective'] / 1e9:.2f} GB/s ({bw / prof['pcie_effective']:.2f}x)"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
