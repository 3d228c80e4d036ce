// Package tinymoe builds the small trained MoE models bundled with commit-run:
// it splits the training text, learns a byte-level BPE vocabulary on the
// training part, encodes both parts for the PyTorch trainer (train.py), and
// exports the trained weights to GGUF with ollama's ggml.WriteGGUF.
//
// The models exist to be a yardstick: random weights route tokens almost
// uniformly, so only a trained model can show whether a change of expert
// selection (Commit Router, OWA, token drop) costs quality. See README.md for
// the exact commands and seeds that reproduce the committed files.
package tinymoe
