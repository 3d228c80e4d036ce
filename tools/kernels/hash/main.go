// Command hash prints the hash of the CUDA kernel sources (cuda.HashSources over the cuda
// directory) that tools/kernels/build.sh writes into the PTX's first line.
//
// Usage: go run ./tools/kernels/hash [cuda-dir]   (default: cuda, from the repository root)
package main

import (
	"fmt"
	"os"

	"github.com/commit-run/commit-run/cuda"
)

func main() {
	dir := "cuda"
	if len(os.Args) > 1 {
		dir = os.Args[1]
	}
	h, err := cuda.HashSources(os.DirFS(dir))
	if err != nil {
		fmt.Fprintln(os.Stderr, "hash:", err)
		os.Exit(1)
	}
	fmt.Println(h)
}
