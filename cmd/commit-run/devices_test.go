package main

import (
	"strings"
	"testing"

	"github.com/commit-run/commit-run/internal/fakecuda"
)

func TestDevicesAndCUDAFlags(t *testing.T) {
	model := needModel(t)
	out, errOut, code := runCLI(t, "", "devices", "--cuda-lib", "/nonexistent/libcuda.so.1")
	if code != 0 || !strings.HasPrefix(out, "cpu\ncuda: none (no CUDA driver found") || !strings.Contains(out, "sim:rtx4090  (simulated)") {
		t.Errorf("devices without a driver: %d %q %q", code, out, errOut)
	}
	_, errOut, code = runCLI(t, "", "generate", "-m", model, "--prompt", "hi", "-n", "2", "--device", "cuda:0", "--cuda-lib", "/nonexistent/libcuda.so.1")
	if code != 1 || !strings.Contains(errOut, "device cuda:0: no CUDA driver found") || strings.Count(errOut, "\n") != 1 {
		t.Errorf("cuda:0 without a driver: %d %q", code, errOut)
	}
	out, errOut, code = runCLI(t, "", "generate", "-m", model, "--prompt", "hi", "-n", "2", "--device", "auto", "--cuda-lib", "/nonexistent/libcuda.so.1")
	if code != 0 || !strings.Contains(errOut, "commit-run: device auto: running on the CPU (no CUDA driver found)") {
		t.Errorf("auto without a driver: %d %q %q", code, out, errOut)
	}

	lib := fakecuda.ForTests(t)
	if out, _, code := runCLI(t, "", "devices", "--cuda-lib", lib); code != 0 || !strings.Contains(out, "\ncuda:0  Fake GPU  1.0 GiB  sm_89") {
		t.Errorf("devices with the fake driver: %q", out)
	}
	out, errOut, code = runCLI(t, "", "bench", "-m", model, "--tokens", "4", "--device", "cuda:0", "--cuda-lib", lib, "--gpu-mem", "10MiB", "--policy", "ondemand,prefetch")
	if code != 0 || !strings.Contains(out, "ondemand on the GPU: ") || !strings.Contains(out, " 0 products on the host, copy stream ") {
		t.Errorf("bench on the fake GPU: %d %q %q", code, out, errOut)
	}
}
