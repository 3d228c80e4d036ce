package cuda

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

func TestPTXMatchesSources(t *testing.T) {
	want, err := SourcesHash()
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := bytes.Cut(PTX(), []byte("\n"))
	const prefix = "// commit-run kernels sources-sha256:"
	got, ok := strings.CutPrefix(strings.TrimSpace(string(first)), prefix)
	if !ok {
		t.Fatalf("the PTX's first line is %q, want %q<hash>: the PTX is stale: run make kernels", first, prefix)
	}
	if got != want {
		t.Fatalf("the PTX was built from sources with hash %s, the sources hash to %s: the PTX is stale: run make kernels", got, want)
	}
}

func TestHashSourcesIsStable(t *testing.T) {
	a, err := HashSources(kernelSources)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := SourcesHash(); a != b || len(a) != 64 {
		t.Fatalf("HashSources %q, SourcesHash %q", a, b)
	}
}

var entryRE = regexp.MustCompile(`(?m)^\s*(?:\.visible\s+)?\.entry\s+([A-Za-z_][A-Za-z0-9_$]*)\s*\(`)

func TestKernelNamesMatchPTX(t *testing.T) {
	inPTX := map[string]bool{}
	for _, m := range entryRE.FindAllSubmatch(PTX(), -1) {
		inPTX[string(m[1])] = true
	}
	if len(inPTX) == 0 {
		t.Fatal("no .entry in the PTX")
	}
	listed := map[string]bool{}
	for _, n := range KernelNames {
		if listed[n] {
			t.Errorf("KernelNames lists %s twice", n)
		}
		listed[n] = true
		if !inPTX[n] {
			t.Errorf("kernel %s is in KernelNames but has no .entry in the PTX", n)
		}
	}
	for n := range inPTX {
		if !listed[n] {
			t.Errorf("the PTX has .entry %s, which KernelNames does not list", n)
		}
	}
}

// TestPTXTarget checks the module loads on compute capability 7.5 and newer: its .target is
// an sm_XY with XY <= 75, and its .version an ISA with every instruction the kernels use.
func TestPTXTarget(t *testing.T) {
	ptx := string(PTX())
	m := regexp.MustCompile(`(?m)^\s*\.target\s+sm_(\d+)`).FindStringSubmatch(ptx)
	if m == nil {
		t.Fatal("the PTX has no .target sm_XY")
	}
	if sm, _ := strconv.Atoi(m[1]); sm > 75 {
		t.Errorf("the PTX targets sm_%d: it would not load on sm_75", sm)
	}
	v := regexp.MustCompile(`(?m)^\s*\.version\s+(\d+)\.(\d+)`).FindStringSubmatch(ptx)
	if v == nil {
		t.Fatal("the PTX has no .version")
	}
	// 6.5: the integer mma.sync of mmqi.cu; a driver of CUDA 10.2 or newer reads it.
	major, _ := strconv.Atoi(v[1])
	minor, _ := strconv.Atoi(v[2])
	if major < 6 || major == 6 && minor < 5 {
		t.Errorf("PTX ISA %s.%s is older than mmqi.cu's mma.sync m8n8k16 needs (6.5)", v[1], v[2])
	}
}
