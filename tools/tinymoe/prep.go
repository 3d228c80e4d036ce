package tinymoe

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// Prepared names the files Prepare writes into its directory.
const (
	FileTrainText  = "train.txt"
	FileHeldText   = "heldout.txt"
	FileVocab      = "vocab.json"
	FileTrainIDs   = "train.u16"
	FileHeldIDs    = "heldout.u16"
	FilePrepReport = "prep.json"
)

// PrepReport summarises a preparation; train.py reads the byte counts to report bits per byte.
type PrepReport struct {
	VocabSize   int     `json:"vocab_size"`
	TrainBytes  int     `json:"train_bytes"`
	HeldBytes   int     `json:"heldout_bytes"`
	TrainTokens int     `json:"train_tokens"`
	HeldTokens  int     `json:"heldout_tokens"`
	BytesPerTok float64 `json:"bytes_per_token"`
	// UnigramBPB is the held-out bits per byte of a unigram model of the training tokens
	// (add-one smoothed): the baseline a trained model must clearly beat.
	UnigramBPB float64 `json:"unigram_bits_per_byte"`
	// ByteUnigramBPB is the same for single bytes: the entropy floor of a model without context.
	ByteUnigramBPB float64 `json:"byte_unigram_bits_per_byte"`
}

// Prepare splits text, learns a vocabulary of the given size on the training part, encodes both
// parts with the engine's tokenizer (so the model trains on exactly the ids the engine and
// llama.cpp will produce) and writes everything into dir.
func Prepare(text string, vocabSize int, dir string) (*PrepReport, error) {
	train, held, err := Split(text)
	if err != nil {
		return nil, err
	}
	v, err := TrainBPE(train, vocabSize)
	if err != nil {
		return nil, err
	}
	tok, err := v.Tokenizer()
	if err != nil {
		return nil, fmt.Errorf("prepare: vocabulary rejected by the tokenizer: %w", err)
	}
	trainIDs, err := tok.Encode(train, false, false)
	if err != nil {
		return nil, fmt.Errorf("prepare: encode training text: %w", err)
	}
	heldIDs, err := tok.Encode(held, false, false)
	if err != nil {
		return nil, fmt.Errorf("prepare: encode held-out text: %w", err)
	}
	if got := tok.Decode(heldIDs); got != held {
		return nil, fmt.Errorf("prepare: held-out text does not survive encode/decode")
	}
	rep := &PrepReport{
		VocabSize: len(v.Tokens), TrainBytes: len(train), HeldBytes: len(held),
		TrainTokens: len(trainIDs), HeldTokens: len(heldIDs),
		BytesPerTok:    float64(len(held)) / float64(len(heldIDs)),
		UnigramBPB:     UnigramBitsPerByte(trainIDs, heldIDs, len(v.Tokens), len(held)),
		ByteUnigramBPB: ByteUnigramBitsPerByte(train, held),
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("prepare: %w", err)
	}
	vj, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return nil, err
	}
	rj, err := json.MarshalIndent(rep, "", " ")
	if err != nil {
		return nil, err
	}
	files := []struct {
		name string
		data []byte
	}{
		{FileTrainText, []byte(train)},
		{FileHeldText, []byte(held)},
		{FileVocab, vj},
		{FileTrainIDs, u16(trainIDs)},
		{FileHeldIDs, u16(heldIDs)},
		{FilePrepReport, rj},
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f.name), f.data, 0o644); err != nil {
			return nil, fmt.Errorf("prepare: %w", err)
		}
	}
	return rep, nil
}

// LoadVocab reads the vocabulary Prepare wrote.
func LoadVocab(path string) (*Vocab, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load vocabulary: %w", err)
	}
	var v Vocab
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("load vocabulary %s: %w", path, err)
	}
	if len(v.Tokens) < 257 || len(v.Merges) != len(v.Tokens)-257 || v.Tokens[v.EOS()] != EndOfText {
		return nil, fmt.Errorf("load vocabulary %s: not a vocabulary written by prepare", path)
	}
	return &v, nil
}

func u16(ids []int32) []byte {
	b := make([]byte, 2*len(ids))
	for i, id := range ids {
		binary.LittleEndian.PutUint16(b[2*i:], uint16(id))
	}
	return b
}
