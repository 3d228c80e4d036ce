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
	for _, m := range []struct {
		name string
		ptx  []byte
	}{{"kernels.ptx", PTX()}, {"kernels_sm80.ptx", PTXSM80()}} {
		first, _, _ := bytes.Cut(m.ptx, []byte("\n"))
		const prefix = "// commit-run kernels sources-sha256:"
		got, ok := strings.CutPrefix(strings.TrimSpace(string(first)), prefix)
		if !ok {
			t.Errorf("%s's first line is %q, want %q<hash>: the PTX is stale: run make kernels", m.name, first, prefix)
		} else if got != want {
			t.Errorf("%s was built from sources with hash %s, the sources hash to %s: the PTX is stale: run make kernels", m.name, got, want)
		}
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
	// The sm_80 module only replaces kernels: a device older than 8.0 must have them all.
	sm80 := entryRE.FindAllSubmatch(PTXSM80(), -1)
	if len(sm80) == 0 {
		t.Error("no .entry in the sm_80 PTX")
	}
	for _, m := range sm80 {
		if n := string(m[1]); !inPTX[n] {
			t.Errorf("the sm_80 PTX has .entry %s, which the base module lacks", n)
		}
	}
}

// TestPTXTarget checks that the base module loads on compute capability 7.5 and newer (its
// .target an sm_XY with XY <= 75, its .version an ISA with every instruction the kernels use,
// no instruction of sm_80), and that the sm_80 module targets sm_80 and was built with sm_80's
// products (CR_SM80 defined: a build that left it out would quietly be the sm_75 code).
func TestPTXTarget(t *testing.T) {
	target := func(ptx []byte) (sm, major, minor int) {
		t.Helper()
		m := regexp.MustCompile(`(?m)^\s*\.target\s+sm_(\d+)`).FindSubmatch(ptx)
		v := regexp.MustCompile(`(?m)^\s*\.version\s+(\d+)\.(\d+)`).FindSubmatch(ptx)
		if m == nil || v == nil {
			t.Fatal("a PTX module has no .target sm_XY or no .version")
		}
		sm, _ = strconv.Atoi(string(m[1]))
		major, _ = strconv.Atoi(string(v[1]))
		minor, _ = strconv.Atoi(string(v[2]))
		return sm, major, minor
	}
	sm, major, minor := target(PTX())
	if sm > 75 {
		t.Errorf("the PTX targets sm_%d: it would not load on sm_75", sm)
	}
	// 6.5: the integer mma.sync of mmqi.cu; a driver of CUDA 10.2 or newer reads it.
	if major < 6 || major == 6 && minor < 5 {
		t.Errorf("PTX ISA %d.%d is older than mmqi.cu's mma.sync m8n8k16 needs (6.5)", major, minor)
	}
	// sm_75 has the integer m8n8k16 and the half m16n8k8; the integer m16n8k* and the half
	// m16n8k16 are sm_80's.
	for _, op := range []string{"mma.sync.aligned.m16n8k16", "mma.sync.aligned.m16n8k32", "mma.sync.aligned.m16n8k8.row.col.s32"} {
		if bytes.Contains(PTX(), []byte(op)) {
			t.Errorf("the base PTX has %s: sm_80's, which sm_75 does not have", op)
		}
	}
	sm, major, minor = target(PTXSM80())
	if sm != 80 || major < 7 {
		t.Errorf("the sm_80 PTX targets sm_%d at ISA %d.%d, want sm_80 at 7.0 or newer", sm, major, minor)
	}
	for _, op := range []string{"mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32", "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32",
		"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"} {
		if !bytes.Contains(PTXSM80(), []byte(op)) {
			t.Errorf("the sm_80 PTX has no %s: built without CR_SM80?", op)
		}
	}
	for _, op := range []string{"m8n8k16", "m16n8k8"} {
		if bytes.Contains(PTXSM80(), []byte(op)) {
			t.Errorf("the sm_80 PTX still multiplies with %s", op)
		}
	}
}
