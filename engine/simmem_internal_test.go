package engine

import (
	"cmp"
	"testing"

	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/synth"
)

// A simulated GPU reserves one pass's activations as a GPU does, so that the same budget
// leaves both the same expert slots; the CPU, whose passes run in Go memory, reserves none.
func TestSimReservesActivations(t *testing.T) {
	lib := GPUForTests(t)
	open := func(dev string) OffloadStats {
		m, err := Open("../models/testdata/tinymoe-qwen2moe.gguf", Options{Device: dev, CUDALibrary: lib, Threads: 2, ContextLength: 64,
			Offload: &OffloadOptions{GPUMem: 64 << 20}})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if dev == "cpu" && m.act.bytes() != 0 {
			t.Errorf("the CPU reserved %d bytes of activations", m.act.bytes())
		}
		if _, used, _ := m.DeviceMemory(); dev != "cpu" && m.act.bytes() == 0 {
			t.Errorf("%s reserved no activations (%d bytes in use)", dev, used)
		}
		st, _ := m.Offload()
		return st
	}
	gpu, sim, cpu := open("cuda:0"), open("sim:rtx2080ti"), open("cpu")
	if sim.Resident != gpu.Resident || sim.Slots != gpu.Slots {
		t.Errorf("64 MiB on the simulated GPU: %d bytes resident, %d slots; on cuda:0 %d and %d", sim.Resident, sim.Slots, gpu.Resident, gpu.Slots)
	}
	if cpu.Resident >= gpu.Resident {
		t.Errorf("the CPU keeps %d bytes resident, the GPU %d: want fewer without the activations", cpu.Resident, gpu.Resident)
	}
}

// archOfSpec is the offload.Arch a synthetic model's spec describes.
func archOfSpec(s synth.Spec) offload.Arch {
	a := offload.Arch{Layers: s.Layers, Embd: s.Embd, Vocab: s.Vocab, Experts: s.Experts, Used: s.ExpertsUsed,
		FFN: s.ExpertFFN, SharedFFN: s.SharedFFN + s.SharedExperts*s.ExpertFFN, Heads: s.Heads,
		HeadsKV: cmp.Or(s.HeadsKV, s.Heads), HeadDim: cmp.Or(s.HeadDim, s.Embd/s.Heads)}
	if s.LeadingDense > 0 {
		a.Dense, a.DenseFFN = s.LeadingDense, s.FFN
	}
	if s.MLA {
		a.HeadsKV, a.HeadDim = 0, 0
		a.MLA, a.KVLora, a.RopeDim, a.NopeDim, a.VDim = true, s.KVLoraRank, s.RopeDim, s.QKNopeDim, s.VHeadDim
	}
	return a
}

// The public shapes the expert-parallel cost model prices (offload.PublicArch) are the sizes
// of the shapes package shapes opens, synth's real models.
func TestPublicArchIsSynths(t *testing.T) {
	for shape, arch := range map[string]string{"mixtral-8x7b": synth.ArchLlama, "qwen1.5-moe-a2.7b": synth.ArchQwen2MoE,
		"qwen3-30b-a3b": synth.ArchQwen3MoE, "olmoe-1b-7b": synth.ArchOLMoE, "deepseek-v2-lite": synth.ArchDeepSeek2} {
		spec, err := synth.Bench(arch, synth.BenchOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got, err := offload.PublicArch(shape + "@q4_k")
		if err != nil {
			t.Fatal(err)
		}
		if want := archOfSpec(spec); got != want {
			t.Errorf("%s: %+v; the benchmark model's shape is %+v", shape, got, want)
		}
	}
	if _, err := offload.PublicArch("gpt-5"); err == nil {
		t.Error("unknown shape: no error")
	}
}
