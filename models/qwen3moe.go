package models

// Qwen3-MoE (Qwen3-30B-A3B): per-head q/k RMSNorm before NEOX rope, renormalised top-k, and in
// newer files an expert weight scale.
func init() {
	Register("qwen3moe", stdArch{neox: true, qkNorm: QKNormPerHead, normWeights: true, scaleKey: ".expert_weights_scale"}.build)
}
