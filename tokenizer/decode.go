package tokenizer

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// renderPiece is llama.cpp's token_to_piece with special=true, which it
// caches for every token at load time.
func (t *Tokenizer) renderPiece(id int32) string {
	a, text := t.attrs[id], t.tokens[id]
	if a&(attrUnknown|attrControl|attrUserDefined) != 0 {
		return text
	}
	switch {
	case a&attrNormal != 0 && t.model == "llama":
		return strings.ReplaceAll(text, "\u2581", " ")
	case a&attrNormal != 0:
		return decodeByteLevel(text)
	case a&attrByte != 0:
		return string([]byte{tokenByte(text)})
	}
	// Unused and undefined tokens render as nothing.
	return ""
}

// tokenByte reads the byte of a <0xXX> token the way llama.cpp does
// (strtol on the two characters after "<0x").
func tokenByte(text string) byte {
	if len(text) < 4 {
		return 0
	}
	var b byte
	for _, c := range []byte(text[3:min(5, len(text))]) {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return b
		}
		b = b<<4 | d
	}
	return b
}

// decodeByteLevel maps a byte-level BPE token back to its bytes
// (llama_decode_text), keeping llama.cpp's marker for characters outside
// the byte alphabet.
func decodeByteLevel(text string) string {
	out := make([]byte, 0, len(text))
	for _, r := range decodeCodepoints(text) {
		if b, ok := runeToByte[r]; ok {
			out = append(out, b)
			continue
		}
		enc, err := appendCodepoint(nil, r)
		if err != nil {
			enc = []byte(string(utf8.RuneError))
		}
		out = append(out, "[UNK_BYTE_0x"...)
		for _, c := range enc {
			out = fmt.Appendf(out, "%02x", c)
		}
		out = append(out, text...)
		out = append(out, ']')
	}
	return string(out)
}

// piece renders one token; special=false hides control and unknown tokens.
func (t *Tokenizer) piece(id int32, special bool) string {
	if id < 0 || int(id) >= len(t.pieces) {
		return ""
	}
	if !special && t.attrs[id]&(attrUnknown|attrControl) != 0 {
		return ""
	}
	return t.pieces[id]
}

// TokenText renders one token as llama.cpp's token_to_piece does with
// special tokens shown: "▁" becomes a space for SentencePiece, byte-level
// characters become their bytes, <0xXX> becomes the byte, control and
// user-defined tokens are their text. A piece may be part of a UTF-8
// sequence. Ids out of range render as "".
func (t *Tokenizer) TokenText(id int32) string { return t.piece(id, true) }

// MaxTokenBytes bounds the bytes of text one token stands for: the longest token, as stored
// or as rendered (4 at least, the longest character an unknown token replaces). A text of n
// bytes is at least n/MaxTokenBytes tokens, which says a text will not fit a context before
// it is tokenized.
func (t *Tokenizer) MaxTokenBytes() int {
	n := 4
	for _, s := range t.tokens {
		n = max(n, len(s))
	}
	for _, s := range t.pieces {
		n = max(n, len(s))
	}
	return n
}

// Decode turns ids back into text: the pieces of TokenText concatenated,
// minus the space SentencePiece vocabularies prefix to the first word. It is
// llama.cpp's llama_detokenize(remove_special=false, unparse_special=true)
// without its clean-up pass, so Decode(Encode(s, false, false)) == s for
// valid UTF-8 on byte-level vocabularies, and on SentencePiece ones (with
// byte fallback) unless s contains "▁", SentencePiece's own space.
func (t *Tokenizer) Decode(ids []int32) string {
	return string(t.detokenize(ids, false, true, false))
}

// Detokenize is llama.cpp's llama_detokenize exactly: removeSpecial drops a
// leading BOS and trailing EOS the vocabulary adds; unparseSpecial renders
// control tokens; vocabularies whose pre-tokenizer asks for it get
// llama.cpp's clean-up of spaces before punctuation and contractions.
func (t *Tokenizer) Detokenize(ids []int32, removeSpecial, unparseSpecial bool) string {
	return string(t.detokenize(ids, removeSpecial, unparseSpecial, t.cleanSpaces))
}

func (t *Tokenizer) detokenize(ids []int32, removeSpecial, unparseSpecial, clean bool) []byte {
	removeSpace := t.addSpacePrefix
	if removeSpecial && t.addBOS && len(ids) > 0 && ids[0] == t.bos {
		// llama.cpp keeps the first word's space when it drops the BOS.
		removeSpace = false
		ids = ids[1:]
	}
	if removeSpecial && t.addEOS && len(ids) > 0 && ids[len(ids)-1] == t.eos {
		ids = ids[:len(ids)-1]
	}
	var text []byte
	for _, id := range ids {
		p := t.piece(id, unparseSpecial)
		if removeSpace && strings.HasPrefix(p, " ") {
			p = p[1:]
		}
		removeSpace = false
		text = append(text, p...)
	}
	if clean {
		text = cleanSpaces(text)
	}
	return text
}

// cleanSpaces is llama.cpp's clean_up_tokenization_spaces, three in-place
// passes over the bytes, reproduced step for step (including how the second
// pass blanks the space after a lone apostrophe).
func cleanSpaces(text []byte) []byte {
	// " ?", " !", " .", " ," lose the space.
	total := len(text)
	n := min(total, 1)
	for i := 1; i < total; i++ {
		x := text[i]
		if text[i-1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',') {
			n--
		}
		text[n] = x
		n++
	}
	// " ' " becomes "'".
	total = n
	n = min(total, 1)
	for i := 1; i < total; i++ {
		x := text[i]
		if x == '\'' && i+1 < total && text[i-1] == ' ' && text[i+1] == ' ' {
			n--
			i++
			text[i] = 0
		}
		text[n] = x
		n++
	}
	// " 's", " 'm", " 're", " 've" lose the space.
	total = n
	n = min(total, 1)
	for i := 1; i < total; i++ {
		x := text[i]
		if text[i-1] == ' ' && x == '\'' && i+1 < total {
			x1 := text[i+1]
			switch {
			case x1 == 't' || x1 == 'd':
			case x1 == 's' || x1 == 'm':
				n--
			case i+2 < total:
				x2 := text[i+2]
				if (x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e') {
					n--
				}
			}
		}
		text[n] = x
		n++
	}
	return text[:n]
}

// StreamDecoder turns ids into text one at a time for streaming output,
// holding back bytes of a UTF-8 sequence that a later token completes
// (byte-level and byte-fallback tokens split characters). Not safe for
// concurrent use.
type StreamDecoder struct {
	t       *Tokenizer
	pending []byte
}

// NewStreamDecoder starts a stream; pieces render as TokenText does.
func (t *Tokenizer) NewStreamDecoder() *StreamDecoder { return &StreamDecoder{t: t} }

// Next adds one token and returns the text that is now complete: valid
// UTF-8 only. Bytes that cannot start or continue a valid sequence come out
// as U+FFFD.
func (d *StreamDecoder) Next(id int32) string {
	d.pending = append(d.pending, d.t.TokenText(id)...)
	var out strings.Builder
	i := 0
	for i < len(d.pending) {
		r, n := utf8.DecodeRune(d.pending[i:])
		if r == utf8.RuneError && n <= 1 {
			if !utf8.FullRune(d.pending[i:]) {
				break // a later token may complete it
			}
			out.WriteRune(utf8.RuneError)
			i++
			continue
		}
		out.Write(d.pending[i : i+n])
		i += n
	}
	d.pending = append(d.pending[:0], d.pending[i:]...)
	return out.String()
}

// Flush returns what is still held back (an unfinished sequence, as
// U+FFFD) and resets the decoder.
func (d *StreamDecoder) Flush() string {
	s := strings.ToValidUTF8(string(d.pending), string(utf8.RuneError))
	d.pending = d.pending[:0]
	return s
}
