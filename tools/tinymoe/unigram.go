package tinymoe

import "math"

// UnigramBitsPerByte is the cross-entropy, in bits per byte of heldText bytes, of the held-out
// tokens under the add-one smoothed unigram distribution of the training tokens.
func UnigramBitsPerByte(train, held []int32, vocab, heldBytes int) float64 {
	counts := make([]float64, vocab)
	for _, id := range train {
		counts[id]++
	}
	total := float64(len(train) + vocab)
	var bits float64
	for _, id := range held {
		bits -= math.Log2((counts[id] + 1) / total)
	}
	return bits / float64(heldBytes)
}

// ByteUnigramBitsPerByte is the same for single bytes.
func ByteUnigramBitsPerByte(train, held string) float64 {
	var counts [256]float64
	for i := 0; i < len(train); i++ {
		counts[train[i]]++
	}
	total := float64(len(train) + 256)
	var bits float64
	for i := 0; i < len(held); i++ {
		bits -= math.Log2((counts[held[i]] + 1) / total)
	}
	return bits / float64(len(held))
}
