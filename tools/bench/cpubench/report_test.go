package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// fixedReport is a report as a run of two tests on one file would leave it, one llama.cpp
// run having failed.
func fixedReport() *report {
	rep := &report{
		Host: host{CPU: "AMD EPYC", Cores: 2, L3Bytes: 32 << 20},
		Settings: settings{Reps: 3, Seed: 1, Batch: 256, CommitRun: "bin/commit-run (source abc1234)",
			LlamaCpp: "v0.5.0 de3ff815ea7d through node-llama-cpp 3.22.1, CPU backend haswell"},
		Bandwidth: []bandwidth{{Threads: 2, BufferBytes: 1 << 30, GBps: 24.4, Reader: "bytes.Count",
			Rates: []rate{{"go-loop", 21.7}, {"bytes.IndexByte", 24.1}, {"bytes.Count", 24.4}}}},
	}
	tr := traffic{Arch: "olmoe", Layers: 7, MoELayers: 7, Experts: 64, ExpertsUsed: 8, EmbedRow: 1152,
		Head: 84492288, Dense: 72417280, ExpertBytes: 198180864, KVPerPosition: 114688}
	base := result{Shape: "olmoe", Model: "OLMoE-1B-7B", Type: "Q4_K_M", Recipe: "q4km",
		File: "/tmp/commit-run-bench/olmoe-q4km-7L-s1.gguf", FileBytes: 1852000000, Layers: 7, Threads: 2}
	pp := base
	pp.Test, pp.Prompt = "pp512", 512
	for _, x := range []float64{101, 99, 100} {
		pp.CommitRun.add(x, 1900<<20, nil)
	}
	for _, x := range []float64{80, 82, 81} {
		pp.LlamaCpp.add(x, 1950<<20, nil)
	}
	tg := base
	tg.Test, tg.Prompt, tg.Decode = "tg64@d2048", 2048, 64
	tg.Limit = newLimit(tr, 2048, 64, 24.4)
	for _, x := range []float64{40, 41, 39} {
		tg.CommitRun.add(x, 1910<<20, nil)
	}
	tg.LlamaCpp.add(50, 1960<<20, nil)
	tg.LlamaCpp.add(0, 0, errTest)
	tg.LlamaCpp.add(52, 1960<<20, nil)
	failed := base
	failed.Test, failed.Prompt, failed.Decode = "tg64", 1, 64
	failed.CommitRun.add(0, 0, errTest)
	failed.LlamaCpp.add(55, 1960<<20, nil)
	for _, r := range []*result{&pp, &tg, &failed} {
		r.finish()
		rep.Results = append(rep.Results, *r)
	}
	return rep
}

func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./tools/bench/cpubench -update writes it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file (go test -update rewrites it):\n%s", name, got)
	}
}

func TestTable(t *testing.T) {
	var b bytes.Buffer
	if err := writeTable(&b, fixedReport()); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "table.txt", b.Bytes())
}

func TestJSON(t *testing.T) {
	var b bytes.Buffer
	if err := writeJSON(&b, fixedReport()); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "report.json", b.Bytes())
	var back report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatalf("the JSON does not read back: %v", err)
	}
	if r := back.Results[1]; r.Ratio == nil || r.Limit == nil || r.Limit.CommitRun == nil || len(r.LlamaCpp.Errors) != 1 {
		t.Errorf("read back: %+v", r)
	}
}

func TestFinish(t *testing.T) {
	rep := fixedReport()
	pp, tg, failed := rep.Results[0], rep.Results[1], rep.Results[2]
	if *pp.Ratio != 100.0/81 || pp.Limit != nil {
		t.Errorf("pp512: ratio %v, limit %v", *pp.Ratio, pp.Limit)
	}
	if *tg.Ratio != 40.0/51 || *tg.Limit.CommitRun != 40/tg.Limit.TokS || *tg.Limit.LlamaCpp != 51/tg.Limit.TokS {
		t.Errorf("tg64@d2048: ratio %v, limit %+v", *tg.Ratio, tg.Limit)
	}
	if failed.Ratio != nil || failed.CommitRun.TokS != 0 {
		t.Errorf("a failed engine still has a ratio: %+v", failed)
	}
}
