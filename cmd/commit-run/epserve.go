package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func (a *app) epServeCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "ep-serve",
		Short: "Serve one rank's experts to a group of processes (--ep N --ep-rendezvous HOST:PORT --ep-rank R)",
		Long: "Runs rank R (1 to N-1) of expert parallelism over processes, on this machine or another: it holds\n" +
			"its share of the experts on --device's GPU and computes them for the tokens rank 0 sends, until rank 0\n" +
			"closes the model. Rank 0 runs any command with the same -m, --ep, --ep-policy and --ep-rendezvous and\n" +
			"--ep-rank 0; NCCL moves the tokens. Example, two GPUs of one machine:\n" +
			"  commit-run -m M --device cuda:1 --ep 2 --ep-rendezvous 127.0.0.1:29500 --ep-rank 1 ep-serve &\n" +
			"  commit-run -m M --device cuda:0 --ep 2 --ep-rendezvous 127.0.0.1:29500 chat",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if a.epDevices == 0 || a.epRendezvous == "" || a.epRank == 0 {
				return fmt.Errorf("ep-serve runs a rank above 0 of a group of processes: pass --ep N, --ep-rendezvous HOST:PORT and --ep-rank 1 to N-1")
			}
			m, err := a.openModel()
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stderr, "commit-run: rank %d of %d on %s, serving its experts\n", a.epRank, a.epDevices, m.Device())
			serr := m.ServeEP(cmd.Context())
			if err := m.Close(); serr == nil {
				serr = err
			}
			return serr
		},
	}
}
