package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/commit-run/commit-run/cuda"
	"github.com/commit-run/commit-run/engine"
	"github.com/spf13/cobra"
)

// simDevices are the simulated GPUs --device takes.
func simDevices() []string {
	var out []string
	for _, d := range engine.Devices() {
		if strings.HasPrefix(d, "sim:") {
			out = append(out, d)
		}
	}
	return out
}

func (a *app) devicesCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "devices",
		Short: "List the devices --device can name: the CPU, NVIDIA GPUs, simulated GPUs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := a.stdout
			fmt.Fprintln(w, "cpu")
			gpus, err := engine.CUDADevices(a.cudaLib)
			switch {
			case errors.Is(err, cuda.ErrNoDriver):
				fmt.Fprintf(w, "cuda: none (%v)\n", err)
			case err != nil:
				fmt.Fprintf(w, "cuda: none (the driver failed: %v)\n", err)
			case len(gpus) == 0:
				fmt.Fprintln(w, "cuda: none (the driver sees no GPU)")
			}
			for _, g := range gpus {
				fmt.Fprintln(w, g)
			}
			for _, s := range simDevices() {
				fmt.Fprintf(w, "%s  (simulated)\n", s)
			}
			return nil
		},
	}
}
