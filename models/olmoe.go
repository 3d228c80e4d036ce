package models

// OLMoE: q/k RMSNorm over the whole projection (not per head), NEOX rope, softmax routing
// without renormalisation.
func init() { Register("olmoe", stdArch{neox: true, qkNorm: QKNormFull}.build) }
