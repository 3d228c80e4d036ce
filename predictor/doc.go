// Package predictor will hold the Commit Router: small MLPs that predict the next MoE
// layer's router logits from the current router input, with trace collection, offline training
// (KL loss, Adam), inference and a file format. Nothing lives here yet.
package predictor
