package cuda

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// ptxasSpills lists the kernels allowed to spill registers on a target, with the bytes they
// may store: a spill is a local-memory round trip on every use, so a new one fails the test.
var ptxasSpills = map[string]int{
	// sm_75 has fewer registers to spare for mmv_heads's per-head scales of Q5_K; a
	// prompt-only float path.
	"sm_75/mmv_heads_q5_K": 8,
}

// ptxasMinBlocks lists kernels with the blocks of theirs an SM must hold at once on a target,
// by registers and shared memory, and their block's threads. Before sm_80 the prompt's flash
// attention keeps one tile of keys and values (FA_STAGES), so that two or three blocks share a
// 2080 Ti's SM where one did, and a compiler that hoists their tiles' addresses again
// (cr_opaque_zero) takes that back; attn_f32 and attn_f16kv keep their scores and their warps'
// sums in the same shared memory, three blocks where one fitted.
var ptxasMinBlocks = map[string]struct{ threads, blocks int }{
	"sm_75/attn_fa_f16kv_d64":       {128, 3},
	"sm_75/attn_fa_f16kv_d128":      {128, 3},
	"sm_75/attn_fa_f16kv_d256":      {128, 2},
	"sm_75/attn_fa_f16kv_d192v128":  {128, 2},
	"sm_75/attn_fa_f16kv_latent576": {128, 2},
	"sm_75/attn_f32":                {256, 3},
	"sm_75/attn_f16kv":              {256, 3},
}

// smBlocks returns how many blocks of threads threads, each taking regs registers a thread and
// smem bytes of shared memory, an SM of 65536 registers and smemSM bytes holds at once: a
// warp's registers are taken in units of 256.
func smBlocks(threads, regs, smem, smemSM int) int {
	warps := (threads + 31) / 32
	n := 65536 / (warps * ((regs*32 + 255) &^ 255))
	if smem > 0 {
		n = min(n, smemSM/smem)
	}
	return n
}

// ptxas -v's lines about one entry: its name and target, its spills, its registers and shared
// memory.
var (
	ptxasEntryRE = regexp.MustCompile(`Compiling entry function '(\w+)' for '(sm_\d+)'`)
	ptxasSpillRE = regexp.MustCompile(`(\d+) bytes spill stores, (\d+) bytes spill loads`)
	ptxasRegsRE  = regexp.MustCompile(`Used (\d+) registers`)
	ptxasSmemRE  = regexp.MustCompile(`(\d+) bytes smem`)
)

// ptxasFunc is what ptxas -v says of one kernel on one target.
type ptxasFunc struct {
	spillStores, spillLoads, regs, smem int
}

// parsePtxasInfo reads ptxas -v's report: each kernel's spills and registers.
func parsePtxasInfo(out []byte) map[string]ptxasFunc {
	funcs := map[string]ptxasFunc{}
	var cur string
	for _, line := range strings.Split(string(out), "\n") {
		if m := ptxasEntryRE.FindStringSubmatch(line); m != nil {
			cur = m[2] + "/" + m[1]
			funcs[cur] = ptxasFunc{}
			continue
		}
		if cur == "" {
			continue
		}
		f := funcs[cur]
		if m := ptxasSpillRE.FindStringSubmatch(line); m != nil {
			f.spillStores, _ = strconv.Atoi(m[1])
			f.spillLoads, _ = strconv.Atoi(m[2])
		}
		if m := ptxasRegsRE.FindStringSubmatch(line); m != nil {
			f.regs, _ = strconv.Atoi(m[1])
		}
		if m := ptxasSmemRE.FindStringSubmatch(line); m != nil {
			f.smem, _ = strconv.Atoi(m[1])
		}
		funcs[cur] = f
	}
	return funcs
}

// TestPTXAssembles assembles both PTX modules with NVIDIA's ptxas for the oldest and newest
// targets each serves (the base module for sm_75, sm_86 and sm_90, the sm_80 module for sm_80
// and sm_90), as a card's driver does when it loads them, and fails on what the driver would
// refuse (a syntax error in inline PTX, an instruction the target lacks), on register spills,
// on registers that the kernel's largest block (maxBlockThreads) would not fit, which a card
// refuses at launch, and on fewer blocks an SM than ptxasMinBlocks asks. Without a GPU this is the only check of the PTX below clang. ptxas
// is $PTXAS or on the PATH (tools/kernels/ptxas.sh installs it from Debian); without it the
// test skips.
func TestPTXAssembles(t *testing.T) {
	ptxas := os.Getenv("PTXAS")
	if ptxas == "" {
		var err error
		if ptxas, err = exec.LookPath("ptxas"); err != nil {
			t.Skip("no ptxas on the PATH and no $PTXAS: bash tools/kernels/ptxas.sh installs it")
		}
	}
	dir := t.TempDir()
	type job struct {
		module, arch string
		ptx          []byte
	}
	jobs := []job{{"kernels.ptx", "sm_75", PTX()}, {"kernels.ptx", "sm_86", PTX()}, {"kernels.ptx", "sm_90", PTX()},
		{"kernels_sm80.ptx", "sm_80", PTXSM80()}, {"kernels_sm80.ptx", "sm_90", PTXSM80()}}
	outs := make([][]byte, len(jobs))
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		src := filepath.Join(dir, j.module)
		if _, err := os.Stat(src); err != nil {
			if err := os.WriteFile(src, j.ptx, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(ptxas, "-v", "-arch="+j.arch, "-o", os.DevNull, src)
			outs[i], errs[i] = cmd.CombinedOutput()
		}()
	}
	wg.Wait()
	for i, j := range jobs {
		if errs[i] != nil {
			t.Errorf("ptxas -arch=%s %s: %v\n%s", j.arch, j.module, errs[i], firstLines(outs[i], 40))
			continue
		}
		funcs := parsePtxasInfo(outs[i])
		if n := len(entryRE.FindAll(j.ptx, -1)); len(funcs) != n {
			t.Errorf("ptxas -arch=%s %s reported %d kernels, the module has %d entries", j.arch, j.module, len(funcs), n)
		}
		names := make([]string, 0, len(funcs))
		for n := range funcs {
			names = append(names, n)
		}
		sort.Strings(names)
		most := ""
		for _, n := range names {
			f := funcs[n]
			if f.spillStores > ptxasSpills[n] || f.spillLoads > 0 && ptxasSpills[n] == 0 {
				t.Errorf("%s (%s) spills registers: %d bytes stored, %d loaded", n, j.module, f.spillStores, f.spillLoads)
			}
			// An SM's 65536 registers must hold the kernel's largest block, a warp's taken in
			// units of 256 (8 a thread).
			if most := maxBlockThreads(n[strings.IndexByte(n, '/')+1:]); (f.regs+7)&^7*most > 65536 {
				t.Errorf("%s (%s) takes %d registers a thread: a block of %d threads (maxBlockThreads) would not fit an SM's 65536",
					n, j.module, f.regs, most)
			}
			if want, ok := ptxasMinBlocks[n]; ok {
				// sm_75's SMs have 64 KiB of shared memory.
				if got := smBlocks(want.threads, f.regs, f.smem, 64<<10); got < want.blocks {
					t.Errorf("%s (%s): %d registers a thread and %d bytes of shared memory fit %d blocks an SM, want %d",
						n, j.module, f.regs, f.smem, got, want.blocks)
				} else {
					t.Logf("%s: %d registers, %d bytes of shared memory, %d blocks an SM", n, f.regs, f.smem, got)
				}
			}
			if most == "" || f.regs > funcs[most].regs {
				most = n
			}
		}
		t.Logf("%s %s: %d kernels assembled, the most registers %d (%s)", j.arch, j.module, len(funcs), funcs[most].regs, most)
	}
}

// firstLines returns the first n lines of b.
func firstLines(b []byte, n int) string {
	lines := bytes.SplitN(b, []byte("\n"), n+1)
	if len(lines) > n {
		lines = append(lines[:n], []byte(fmt.Sprintf("... (%d bytes in all)", len(b))))
	}
	return string(bytes.Join(lines, []byte("\n")))
}

func TestParsePtxasInfo(t *testing.T) {
	out := []byte(`ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'mmv_heads_q5_K' for 'sm_75'
ptxas info    : Function properties for mmv_heads_q5_K
    168 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, 388 bytes cmem[0]
ptxas info    : Compiling entry function 'mmv_f32' for 'sm_75'
ptxas info    : Function properties for mmv_f32
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 64 registers, 388 bytes cmem[0]
ptxas info    : Compiling entry function 'attn_fa_f16kv_d64' for 'sm_75'
ptxas info    : Function properties for attn_fa_f16kv_d64
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 143 registers, 18432 bytes smem, 460 bytes cmem[0], 24 bytes cmem[2]
`)
	got := parsePtxasInfo(out)
	want := map[string]ptxasFunc{"sm_75/mmv_heads_q5_K": {8, 4, 255, 0}, "sm_75/mmv_f32": {0, 0, 64, 0},
		"sm_75/attn_fa_f16kv_d64": {0, 0, 143, 18432}}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: got %+v, want %+v", k, got[k], w)
		}
	}
}

// TestSMBlocks: the blocks an SM holds, by registers and by shared memory, as CUDA's
// occupancy calculator counts them for sm_75.
func TestSMBlocks(t *testing.T) {
	for _, c := range []struct{ threads, regs, smem, want int }{
		{128, 143, 18432, 3}, // 144 a thread: 18432 registers a block
		{128, 168, 17408, 3}, // 21504 registers a block: 3.05
		{128, 169, 0, 2},     // 176 a thread
		{128, 145, 36864, 1}, // shared memory: 64 KiB / 36 KiB
		{256, 32, 0, 8},
		{128, 255, 0, 2},
	} {
		if got := smBlocks(c.threads, c.regs, c.smem, 64<<10); got != c.want {
			t.Errorf("smBlocks(%d threads, %d registers, %d bytes) = %d, want %d", c.threads, c.regs, c.smem, got, c.want)
		}
	}
}
