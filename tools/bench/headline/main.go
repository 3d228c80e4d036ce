// Command headline is the README's headline table: `commit-run bench --shape` of five public
// MoE shapes at Q4_K_M on two simulated cards, each beside a host like its CommitMoE
// environment's (seeds/003, Table 2), with the card's whole memory and half of it, and
// gpt-oss-20b and gpt-oss-120b in their published MXFP4 mix on the RTX 4090, under the
// synthetic router's default skew and under uniform routing (no skew, no correlation). Each
// row shows decode tokens/s and time to first token of every policy, llama.cpp's split
// (static, static-cache) at the fewest host layers whose device layers fit (what auto placement
// found), and auto placement's choice with its decode ratio to the faster split and its time
// to first token over that pass's physical limit (DESIGN.md section 6).
//
//	go run ./tools/bench/headline -commit-run bin/commit-run > table.md
//	go run ./tools/bench/headline -shapes qwen3-30b-a3b -cards rtx2080ti -routing skew
//
// Every figure is SYNTHETIC: simulated time of timing-only runs on synthetic routing.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
)

type card struct{ name, host string }

var cards = []card{{"rtx4090", "xeon-w5-3435x"}, {"rtx2080ti", "xeon-e5-2680v4"}}

var shapes = []string{"mixtral-8x7b", "qwen3-30b-a3b", "qwen3.6-35b-a3b", "deepseek-v2-lite", "qwen1.5-moe-a2.7b", "gpt-oss-20b", "gpt-oss-120b"}

// shapeTypes are the types of the shapes not at Q4_K_M: their published GGUFs'.
var shapeTypes = map[string]string{"gpt-oss-20b": "mxfp4", "gpt-oss-120b": "mxfp4"}

// A row is a card and whether it has half its memory.
type row struct {
	card string
	half bool
}

// shapeRows limit shapes to some rows; the others have every card, with its whole memory
// and half of it. gpt-oss-20b (12.1 GB) runs on half the RTX 4090, gpt-oss-120b (64 GB) on
// the whole of it.
var shapeRows = map[string][]row{"gpt-oss-20b": {{"rtx4090", true}}, "gpt-oss-120b": {{"rtx4090", false}}}

var routings = map[string][]string{
	"skew":    {"--skew", "0.8", "--cross-layer", "0.5", "--temporal", "0.2"},
	"uniform": {"--skew", "0", "--cross-layer", "0", "--temporal", "0"},
}

var policies = []string{"ondemand", "prefetch", "commit", "cpu-miss", "hot", "static", "static-cache", "auto"}

// report is the part of bench --json the table reads.
type report struct {
	GPUMem   float64
	Policies []struct {
		Policy          string
		TokensPerSecond float64
		TTFT, TTFTLimit float64
		Auto            *struct {
			Chosen struct {
				Offload struct {
					Policy     string
					HostLayers int
				}
			}
			Candidates []struct {
				Offload struct {
					Policy     string
					HostLayers int
				}
			}
		}
	}
}

func main() {
	bin := flag.String("commit-run", "bin/commit-run", "the commit-run binary")
	onlyShapes := flag.String("shapes", strings.Join(shapes, ","), "shapes, comma-separated")
	onlyCards := flag.String("cards", "rtx4090,rtx2080ti", "cards, comma-separated")
	onlyRouting := flag.String("routing", "skew,uniform", "routing assumptions: skew, uniform")
	tokens := flag.Int("tokens", 64, "decode tokens per run")
	promptLen := flag.Int("prompt-len", 128, "prompt tokens before the decode (the TTFT)")
	flag.Parse()
	if err := run(os.Stdout, *bin, split(*onlyShapes), split(*onlyCards), split(*onlyRouting), *tokens, *promptLen); err != nil {
		fmt.Fprintln(os.Stderr, "headline:", err)
		os.Exit(1)
	}
}

func split(s string) []string { return strings.Split(s, ",") }

func run(w io.Writer, bin string, shapeList, cardList, routingList []string, tokens, promptLen int) error {
	for _, rt := range routingList {
		if routings[rt] == nil {
			return fmt.Errorf("routing %q: want skew or uniform", rt)
		}
		fmt.Fprintf(w, "\n**SYNTHETIC, %s routing** (%s): decode tokens/s (TTFT in s of a %d-token prompt)\n\n", rt, strings.Join(routings[rt], " "), promptLen)
		fmt.Fprintf(w, "| model | card, host | memory | %s | auto / faster split | auto's TTFT / its limit |\n|---|---|---|%s---|---|\n",
			strings.Join(policies, " | "), strings.Repeat("---|", len(policies)))
		for _, sh := range shapeList {
			for _, cn := range cardList {
				c, err := findCard(cn)
				if err != nil {
					return err
				}
				for _, half := range []bool{false, true} {
					if rows, ok := shapeRows[sh]; ok && !slices.Contains(rows, row{c.name, half}) {
						continue
					}
					typ := shapeTypes[sh]
					if typ == "" {
						typ = "q4km"
					}
					line, err := benchRow(bin, sh+"@"+typ, c, half, routings[rt], tokens, promptLen)
					if err != nil {
						return fmt.Errorf("%s on %s: %w", sh, c.name, err)
					}
					fmt.Fprintln(w, line)
				}
			}
		}
	}
	return nil
}

func findCard(name string) (card, error) {
	for _, c := range cards {
		if c.name == name {
			return c, nil
		}
	}
	return card{}, fmt.Errorf("card %q: want rtx4090 or rtx2080ti", name)
}

// benchRun runs commit-run bench --json with args.
func benchRun(bin string, args []string) (*report, error) {
	cmd := exec.Command(bin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	fmt.Fprintln(os.Stderr, "headline:", bin, strings.Join(args, " "))
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%v: %s", err, strings.TrimSpace(errb.String()))
	}
	var r report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// benchRow runs auto first to learn the fewest host layers that fit, then every policy with
// llama.cpp's split at that count, and formats the row.
func benchRow(bin, shape string, c card, half bool, routing []string, tokens, promptLen int) (string, error) {
	base := []string{"--device", "sim:" + c.name, "--host", c.host, "bench", "--shape", shape,
		"--tokens", fmt.Sprint(tokens), "--prompt-len", fmt.Sprint(promptLen), "--json"}
	base = append(base, routing...)
	mem := "whole"
	if half {
		mem = "half"
		prof, err := benchRun(bin, append(base, "--policy", "ondemand"))
		if err != nil {
			return "", err
		}
		base = append(base, "--gpu-mem", fmt.Sprintf("%.0f", prof.GPUMem/2))
	}
	probe, err := benchRun(bin, append(base, "--policy", "auto"))
	if err != nil {
		return "", err
	}
	// The split's first candidate is static at the fewest host layers that fit.
	n := -1
	for _, cand := range probe.Policies[0].Auto.Candidates {
		if cand.Offload.Policy == "static" {
			n = cand.Offload.HostLayers
			break
		}
	}
	if n < 0 {
		return "", fmt.Errorf("auto weighed no static placement")
	}
	r, err := benchRun(bin, append(append([]string{"--cpu-moe-layers", fmt.Sprint(n)}, base...), "--policy", strings.Join(policies, ",")))
	if err != nil {
		return "", err
	}
	cells := map[string]string{}
	tps := map[string]float64{}
	var autoTTFT float64 // auto's TTFT over its limit
	for _, p := range r.Policies {
		cells[p.Policy] = fmt.Sprintf("%.1f (%.2f)", p.TokensPerSecond, p.TTFT)
		tps[p.Policy] = p.TokensPerSecond
		if p.Policy == "auto" {
			autoTTFT = p.TTFT / p.TTFTLimit
			cells[p.Policy] = fmt.Sprintf("%.1f (%.2f) %s", p.TokensPerSecond, p.TTFT, p.Auto.Chosen.Offload.Policy)
			if n := p.Auto.Chosen.Offload.HostLayers; n > 0 {
				cells[p.Policy] += fmt.Sprint(" ", n)
			}
		}
	}
	var out []string
	for _, p := range policies {
		out = append(out, cells[p])
	}
	split := max(tps["static"], tps["static-cache"])
	return fmt.Sprintf("| %s | %s, %s | %s (%.1f GiB), split at %d host layers | %s | %.2fx | %.2fx |", shape, c.name, c.host, mem, r.GPUMem/(1<<30), n,
		strings.Join(out, " | "), tps["auto"]/split, autoTTFT), nil
}
