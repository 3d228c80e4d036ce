// Package predictor is the Commit Router of CommitMoE (seeds/003 §4.2, DESIGN.md §5): small
// networks that, while MoE layer j runs, predict from its router input h(j) the router logits
// of the next MoE layer, so that the engine can prefetch the top-k experts of that layer and
// then commit to them.
//
// For a model with M MoE layers a Router holds M nets. Net j < M-1 predicts MoE layer j+1 of
// the same token with one linear layer, y = W h(j) + b: adjacent layers' hidden states point
// the same way, so a linear map suffices. Net M-1 predicts the next token's first MoE layer,
// a harder target that a new token's embedding intervenes in, with a two-layer MLP of hidden
// width 2 x Embd: y = W2 relu(W1 h + b1) + b2. (With M = 1 the one net is that MLP.) The
// predicted experts are the top k of the predicted logits.
//
// The nets are trained offline (Train) on pairs read from a routing trace that stores router
// inputs and logits (LoadDataset; package trace), minimising KL(softmax(true logits) ||
// softmax(predicted logits)) with Adam at 5e-5 halved every 5 epochs, on an 80/20 split with
// seed 42 and early stopping on the validation loss. A warm start (NewRouter's init, from
// WarmStart) begins each net at the next layer's router, which the MLP can represent exactly. Evaluate scores a
// router as the paper does: accuracy |Pred ∩ True| / k against the experts the trace recorded,
// beside a most-frequent-experts baseline, and bucketed by the number correct with the mean
// router certainty KL(router softmax || uniform) of each bucket (the paper's Figure 2).
//
// A Router is stored beside its model as a GGUF file (SidecarPath): general.architecture
// "commit-router", metadata under "commit-router." (the model's identity under model.*, the
// training record under train.*), and F32 tensors net.<j>.w1, net.<j>.b1 and, for an MLP,
// net.<j>.w2, net.<j>.b2, in ggml's shape order (ne0 = the row length). The identity
// (Identity.Check) binds a router to the model it was trained for, by the engine's routing
// fingerprint where there is one.
//
// The package knows nothing of the engine: it reads traces and writes files, and the engine
// calls Router.Predict on the hot path and counts what committed routing did with the
// predictions in a CommitCounter (CommitStats: each layer's accuracy, all-wrong tokens, OWA).
package predictor
