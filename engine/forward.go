package engine

import (
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/quant"
)

// forward runs T tokens at positions pos0.. through the model, appending to kv, and returns
// the logits of the last token, or of every token when all is set (T rows of n_vocab).
// obs, when not nil, sees every MoE layer's routing.
// The caller holds m.mu for reading and has checked that the positions fit the cache.
func (m *Model) forward(kv *models.KVCache, tokens []int32, pos0 int, all bool, obs RouteObserver) ([]float32, error) {
	a := m.arch
	c := a.Config
	d := c.Embd
	T := len(tokens)
	b := m.dev
	x := make([]float32, T*d)
	emb := a.TokenEmbd.Matrix()
	for t, id := range tokens {
		quant.DequantizeRow(emb.Type, emb.Row(int(id)), x[t*d:(t+1)*d])
	}
	xn := make([]float32, T*d)
	tmp := make([]float32, T*d)
	for i := range a.Layers {
		l := &a.Layers[i]
		for t := 0; t < T; t++ {
			models.RMSNorm(xn[t*d:(t+1)*d], x[t*d:(t+1)*d], l.AttnNorm, c.NormEps)
		}
		l.Attn.Forward(b, &kv.Layers[i], xn, T, pos0, tmp)
		models.AddTo(x, tmp)
		for t := 0; t < T; t++ {
			models.RMSNorm(xn[t*d:(t+1)*d], x[t*d:(t+1)*d], l.FFNNorm, c.NormEps)
		}
		if l.MoE != nil {
			var ev *RouteEvent
			if obs != nil {
				ev = &RouteEvent{Layer: i, Pos0: pos0, Tokens: T, IDs: tokens}
			}
			if err := m.moe(i, l.MoE, xn, T, tmp, ev); err != nil {
				return nil, err
			}
			if ev != nil {
				obs(ev)
			}
		} else {
			m.ffn(l.Dense, xn, T, tmp)
		}
		models.AddTo(x, tmp)
	}
	rows := x
	if !all {
		rows, T = x[(T-1)*d:], 1
	}
	for t := 0; t < T; t++ {
		models.RMSNorm(xn[t*d:(t+1)*d], rows[t*d:(t+1)*d], a.OutputNorm, c.NormEps)
	}
	out := a.Output.Matrix()
	logits := make([]float32, T*out.Rows)
	b.MatMul(out, xn[:T*d], T, logits)
	return logits, nil
}

// ffn runs a dense SwiGLU block on T rows of x into out.
func (m *Model) ffn(f *models.FFN, x []float32, T int, out []float32) {
	m.swiglu(m.dev.MatMul, f, x, T, out)
}

// swiglu runs a SwiGLU block with the given matrix product: MatMul for dense blocks, MatMulID
// for routed experts (llama.cpp's MUL_MAT_ID, whose kernels differ for some weight types).
func (m *Model) swiglu(matMul func(quant.Matrix, []float32, int, []float32), f *models.FFN, x []float32, T int, out []float32) {
	nff := f.Gate.Rows
	g := make([]float32, T*nff)
	u := make([]float32, T*nff)
	matMul(f.Gate, x, T, g)
	matMul(f.Up, x, T, u)
	for t := 0; t < T; t++ {
		models.SwiGLU(g[t*nff:(t+1)*nff], g[t*nff:(t+1)*nff], u[t*nff:(t+1)*nff])
	}
	matMul(f.Down, g, T, out)
}
