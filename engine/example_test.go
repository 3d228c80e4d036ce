package engine_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/offload"
)

// The bundled model: a 4.3M-parameter Qwen1.5-MoE-style model trained on War and Peace.
const bundled = "../models/testdata/tinymoe-qwen2moe.gguf"

// A chat turn on the CPU, each token printed as soon as it is sampled.
func Example() {
	m, err := engine.Open(bundled, engine.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	s, err := m.NewSession()
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	res, err := s.Chat(context.Background(), []engine.Message{{Role: "user", Content: "Where is Pierre?"}}, engine.GenerateOptions{
		MaxTokens: 32,
		Sampler:   engine.SamplerOptions{Temperature: 0.8, TopP: 0.95, Seed: 1},
		OnToken: func(t engine.Token) error {
			_, err := os.Stdout.WriteString(t.Text)
			return err
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("\n%d tokens in %.3f s (%s)\n", len(res.Tokens), res.DecodeSeconds, res.Reason)
}

// Offloading on a simulated RTX 4090 with 12 MiB of device memory: the routed experts live in
// host memory and the commit policy copies the Commit Router's predictions into the device's
// expert slots ahead of their layer. On a GPU, Device is "cuda:0".
func ExampleOpen_offload() {
	m, err := engine.Open(bundled, engine.Options{
		Device:        "sim:rtx4090",
		ContextLength: 256,
		Offload:       &engine.OffloadOptions{Policy: offload.Commit, GPUMem: 12 << 20},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	s, err := m.NewSession()
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	prompt, err := m.Tokenize("Prince Andrew looked at Pierre", true)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := s.Generate(context.Background(), prompt, engine.GenerateOptions{MaxTokens: 8}); err != nil {
		log.Fatal(err)
	}
	st, ok := m.Offload()
	if !ok {
		log.Fatal("the model is not offloaded")
	}
	info := m.Info()
	fmt.Printf("%d of %d experts fit on the device; experts moved: %t\n", st.Slots, len(info.MoELayers)*info.Experts, st.BytesCopied > 0)
	if seconds, ok := m.Clock(); ok && seconds > 0 {
		fmt.Println("the simulated card's clock ran")
	}
	// Output:
	// 46 of 64 experts fit on the device; experts moved: true
	// the simulated card's clock ran
}
