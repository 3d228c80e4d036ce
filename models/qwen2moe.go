package models

// Qwen1.5-MoE / Qwen2-MoE: NEOX rope, q/k/v biases, softmax routing without renormalisation,
// and a shared expert scaled by sigmoid(ffn_gate_inp_shexp · x).
func init() { Register("qwen2moe", stdArch{neox: true, sharedGate: true}.build) }
