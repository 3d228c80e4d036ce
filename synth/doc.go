// Package synth generates tiny, deterministic, random-weight GGUF models with the exact tensor
// names, shapes and metadata keys that llama.cpp expects for the Mixture-of-Experts
// architectures commit-run runs (llama with experts as in Mixtral, qwen2moe, qwen3moe, olmoe,
// deepseek2 in its MLA and legacy attn_kv_b layouts) and for the dense llama, qwen2 and qwen3.
//
// The models exist so that commit-run can be checked against llama.cpp without downloading
// real weights: tools/golden/ref runs llama.cpp on every model of Golden and records the
// next-token distributions, and engine/golden_test.go regenerates the same files from their
// seeds and compares. Everything here is therefore bit-for-bit reproducible: the random stream
// of each tensor depends only on the spec's seed and the tensor's name, numbers are produced
// with integer arithmetic and single roundings (never fused multiply-adds), and the tokenizer
// vocabulary is built from fixed word lists.
//
// Weights are scaled so that the models behave like trained ones in the ways a numerical test
// needs: next-token distributions are peaked (a 1e-3 tolerance on probabilities has teeth),
// attention is not uniform, and routers prefer some experts over others.
//
// The same generator makes benchmark-sized models (see Bench): realistic shapes, random weights,
// written tensor by tensor so that a 2 GB file never needs 2 GB of memory. Build alone gives a
// model's metadata and tensor list without any weights: what the engine's timing-only runs of
// the public shapes (shapes.Open) are made of.
package synth
