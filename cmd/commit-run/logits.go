package main

import (
	"bufio"
	"fmt"
	"math"
	"sort"
	"strconv"

	"github.com/spf13/cobra"
)

func (a *app) logitsCmd() *cobra.Command {
	var (
		tokens string
		prompt string
		top    int
	)
	cmd := &cobra.Command{
		Use:   "logits",
		Short: "Print the next-token distribution after every position, one JSON line each",
		Long: "logits evaluates the tokens from position 0 and prints, for each position i,\n" +
			"  {\"pos\":i,\"token\":id,\"probs\":[p_0,...,p_V-1]}\n" +
			"where probs is the distribution of the token at i+1. With --top N it prints\n" +
			"  {\"pos\":i,\"token\":id,\"top\":[[id,p],...]}\n" +
			"with the N most likely tokens, most likely first.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			hasPrompt, hasTokens := cmd.Flags().Changed("prompt"), cmd.Flags().Changed("tokens")
			if hasPrompt == hasTokens {
				return fmt.Errorf("logits needs exactly one of --tokens IDS or --prompt TEXT")
			}
			if top < 0 {
				return fmt.Errorf("--top %d: want > 0, or 0 for the full distribution", top)
			}
			if err := checkPrompt(hasPrompt, prompt); err != nil {
				return err
			}
			var ids []int32
			var err error
			if hasTokens {
				if ids, err = parseTokens(tokens); err != nil {
					return err
				}
			}
			m, s, closeAll, err := a.session()
			if err != nil {
				return err
			}
			defer closeAll()
			if ids, err = promptIDs(m, hasPrompt, prompt, ids); err != nil {
				return err
			}

			// A full line is V numbers (150K for Qwen); format by hand into one reused buffer,
			// which is several times faster than encoding/json on []float32.
			w := bufio.NewWriterSize(a.stdout, 1<<16)
			var line []byte
			err = s.Probs(cmd.Context(), ids, func(pos int, probs []float32) error {
				if pos < 0 || pos >= len(ids) {
					return fmt.Errorf("engine reported position %d for %d tokens", pos, len(ids))
				}
				var err error
				if line, err = appendProbsLine(line[:0], pos, ids[pos], probs, top); err != nil {
					return err
				}
				_, err = w.Write(line)
				return err
			})
			if ferr := w.Flush(); err == nil {
				err = ferr
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&tokens, "tokens", "", "token `IDS` to evaluate, e.g. 1,2,3")
	f.StringVar(&prompt, "prompt", "", "`TEXT` to tokenize (with BOS) and evaluate instead of --tokens")
	f.IntVar(&top, "top", 0, "print only the `N` most likely tokens as [id, p] pairs (0 = all probabilities)")
	return cmd
}

// appendProbsLine appends one JSON line for position pos. Non-finite probabilities are an
// engine bug and would make the line invalid JSON, so they are an error.
func appendProbsLine(b []byte, pos int, token int32, probs []float32, top int) ([]byte, error) {
	for i, p := range probs {
		if math.IsNaN(float64(p)) || math.IsInf(float64(p), 0) {
			return b, fmt.Errorf("position %d: probability of token %d is %v", pos, i, p)
		}
	}
	b = append(b, `{"pos":`...)
	b = strconv.AppendInt(b, int64(pos), 10)
	b = append(b, `,"token":`...)
	b = strconv.AppendInt(b, int64(token), 10)
	if top == 0 {
		b = append(b, `,"probs":[`...)
		for i, p := range probs {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendProb(b, p)
		}
	} else {
		b = append(b, `,"top":[`...)
		for i, id := range topN(probs, top) {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, '[')
			b = strconv.AppendInt(b, int64(id), 10)
			b = append(b, ',')
			b = appendProb(b, probs[id])
			b = append(b, ']')
		}
	}
	return append(b, "]}\n"...), nil
}

// appendProb writes the shortest decimal that reads back as the same float32.
func appendProb(b []byte, p float32) []byte {
	return strconv.AppendFloat(b, float64(p), 'g', -1, 32)
}

// topN returns the indices of the n largest probabilities, largest first (ties: lower id
// first). It keeps a small sorted list instead of sorting the whole vocabulary per position.
func topN(probs []float32, n int) []int {
	n = min(n, len(probs))
	best := make([]int, 0, n+1)
	less := func(i, j int) bool { // i ranks after j
		return probs[i] < probs[j] || (probs[i] == probs[j] && i > j)
	}
	for i := range probs {
		if len(best) == n && !less(best[n-1], i) {
			continue
		}
		at := sort.Search(len(best), func(k int) bool { return less(best[k], i) })
		best = append(best, 0)
		copy(best[at+1:], best[at:])
		best[at] = i
		if len(best) > n {
			best = best[:n]
		}
	}
	return best
}
