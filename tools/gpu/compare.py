#!/usr/bin/env python3
"""Compares a bench run on a real GPU with the same run on a simulated one (the simulator's
calibration, issue 35): per policy, the measured and the simulated mean per-token latency and
time to first token and their ratios, and whether every policy is within 15% on both (what
`calibrated: true` in a profile asks for); and the copy stream's measured bandwidth against
the profile's pcie_effective. First it prints every figure of both runs (what `commit-run bench`
prints as text), with each policy's copy-stream bandwidth and its fraction of the profile's
PCIe link.

    python3 tools/gpu/compare.py MEASURED.json SIMULATED.json [PROFILE.json]

The JSON files are `commit-run bench --json` outputs of the same model, budget, policies and
tokens; tools/gpu/check.sh's offload stage writes them. It prints, it does not edit the profile.
"""
import json
import sys


def fmt(v, scale=1.0, digits=3):
    """A figure, or "-" where the report has none (null: no predictor, no limit)."""
    return "-" if v is None else f"{v * scale:.{digits}f}"


def figures(rep, prof):
    """Prints a bench report's rows with the copy stream's rate per policy (a real GPU's)."""
    print(f"== {rep['Device']}: {rep['Model']}, {rep['Prompts']} prompts x {rep['Tokens']} tokens, "
          f"{rep['GPUMem'] / 2**20:.0f} MiB budget, {rep['SlotBytes'] / 2**20:.3f} MiB per slot, "
          f"{rep['Resident'] / 2**20:.1f} MiB resident")
    h = rep.get("HostRates")
    if h:
        print(f"   cpu-miss weighed copies against a host of {h['Bandwidth'] / 1e9:.1f} GB/s, "
              f"{h['FLOPS'] / 1e9:.0f} GFLOP/s per further token")
    cols = ["policy", "slots", "TTFT ms", "mean ms", "p50 ms", "p90 ms", "device ms", "hit rate", "MB moved/tok",
            "stall ms/tok", "accuracy", "on CPU/tok", "limit ms", "meas/limit", "copy GB/s", "of link"]
    print(" ".join(f"{c:>12}" for c in cols))
    for r in rep["Rows"]:
        g = r.get("GPU") or {}
        bw = g["CopyBytes"] / g["CopySeconds"] if g.get("CopySeconds") else None
        link = bw / prof["pcie_bandwidth"] if bw is not None and prof else None
        dev = r.get("DeviceTimePerToken")
        cells = [r["Policy"], str(r["Slots"]), fmt(r["TTFT"], 1e3), fmt(r["Mean"], 1e3), fmt(r["P50"], 1e3),
                 fmt(r["P90"], 1e3), fmt(dev, 1e3), fmt(r["HitRate"]), fmt(r["MovedPerToken"], 1e-6, 2),
                 fmt(r["StallPerToken"], 1e3), fmt(r["Accuracy"]), fmt(r["OnCPUPerToken"], 1, 2),
                 fmt(r["LimitPerToken"], 1e3), fmt(r["OverLimit"], 1, 2), fmt(bw, 1e-9, 2), fmt(link, 1, 2)]
        print(" ".join(f"{c:>12}" for c in cells))


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
    prof = None
    if len(argv) == 4:
        with open(argv[3]) as f:
            prof = json.load(f)
    for rep in (real, sim):
        figures(rep, prof)
    print()
    rows = {r["Policy"]: r for r in sim["Rows"]}
    print(f"{real['Device']} against {sim['Device']}, {real['Prompts']} prompts x {real['Tokens']} tokens, "
          f"{real['GPUMem'] / 2**20:.0f} MiB budget")
    print(f"{'policy':>10} {'measured ms':>12} {'device ms':>10} {'simulated ms':>13} {'sim/measured':>13} "
          f"{'TTFT ms':>9} {'sim TTFT ms':>12} {'sim/measured':>13} {'within 15%':>11}")
    worst, worst_ttft, missing, copy_bytes, copy_sec = 0.0, 0.0, False, 0, 0.0
    for r in real["Rows"]:
        s = rows.get(r["Policy"])
        if s is None:
            print(f"{r['Policy']:>10}: not in the simulated run")
            missing = True
            continue
        ratio, ttft = s["Mean"] / r["Mean"], s["TTFT"] / r["TTFT"]
        worst, worst_ttft = max(worst, abs(ratio - 1)), max(worst_ttft, abs(ttft - 1))
        dev = (r.get("DeviceTimePerToken") or 0) * 1e3
        ok = abs(ratio - 1) <= 0.15 and abs(ttft - 1) <= 0.15
        print(f"{r['Policy']:>10} {r['Mean'] * 1e3:12.3f} {dev:10.3f} {s['Mean'] * 1e3:13.3f} {ratio:13.3f} "
              f"{r['TTFT'] * 1e3:9.2f} {s['TTFT'] * 1e3:12.2f} {ttft:13.3f} {'yes' if ok else 'NO':>11}")
        g = r.get("GPU") or {}
        copy_bytes += g.get("CopyBytes", 0)
        copy_sec += g.get("CopySeconds", 0.0)
    print(f"largest deviation: {worst * 100:.1f}% per token, {worst_ttft * 100:.1f}% TTFT")
    print("calibrated: " + ("yes, every policy within 15% on both" if worst <= 0.15 and worst_ttft <= 0.15 and not missing
                            else "no (the profile stays calibrated: false)"))
    if copy_sec > 0:
        bw = copy_bytes / copy_sec
        line = f"copy stream measured {bw / 1e9:.2f} GB/s over {copy_bytes / 1e6:.1f} MB"
        if prof:
            line += f"; the profile's pcie_effective is {prof['pcie_effective'] / 1e9:.2f} GB/s ({bw / prof['pcie_effective']:.2f}x), its link {prof['pcie_bandwidth'] / 1e9:.1f} GB/s ({bw / prof['pcie_bandwidth']:.2f}x)"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
