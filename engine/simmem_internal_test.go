package engine

import "testing"

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
