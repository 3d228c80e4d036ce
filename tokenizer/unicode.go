package tokenizer

import (
	"fmt"
	"unicode"
)

// cpFlags mirrors the bits of llama.cpp's unicode_cpt_flags: one general
// category bit, plus whitespace. Pre-tokenizers compare these, not Go's
// unicode predicates directly, so that the splits match llama.cpp's.
type cpFlags uint16

const (
	flagUndefined  cpFlags = 0x0001
	flagNumber     cpFlags = 0x0002 // \p{N}
	flagLetter     cpFlags = 0x0004 // \p{L}
	flagSeparator  cpFlags = 0x0008 // \p{Z}
	flagMark       cpFlags = 0x0010 // \p{M}
	flagPunct      cpFlags = 0x0020 // \p{P}
	flagSymbol     cpFlags = 0x0040 // \p{S}
	flagControl    cpFlags = 0x0080 // \p{C}
	flagCategories cpFlags = 0x00FF
	flagWhitespace cpFlags = 0x0100
)

// maxCodepoint bounds the codepoints llama.cpp's tables cover.
const maxCodepoint = 0x110000

func (f cpFlags) is(g cpFlags) bool { return f&g != 0 }

// whitespace is llama.cpp's unicode_set_whitespace (the Unicode White_Space
// property); listed rather than taken from unicode.IsSpace so a Go upgrade
// cannot silently change the splits.
func isWhitespace(r rune) bool {
	switch {
	case r >= 0x09 && r <= 0x0D, r == 0x20, r == 0x85, r == 0xA0, r == 0x1680,
		r >= 0x2000 && r <= 0x200A, r == 0x2028, r == 0x2029, r == 0x202F, r == 0x205F, r == 0x3000:
		return true
	}
	return false
}

var asciiFlags = func() (t [128]cpFlags) {
	for r := range rune(128) {
		t[r] = categoryFlags(r)
		if isWhitespace(r) {
			t[r] |= flagWhitespace
		}
	}
	return t
}()

// flagsOf returns llama.cpp's flags for a codepoint. Codepoints past
// U+10FFFF are "undefined", as in llama.cpp.
func flagsOf(r rune) cpFlags {
	if r >= 0 && r < 128 {
		return asciiFlags[r]
	}
	if r < 0 || r >= maxCodepoint {
		return flagUndefined
	}
	f := categoryFlags(r)
	if isWhitespace(r) {
		f |= flagWhitespace
	}
	return f
}

// categoryFlags maps Go's Unicode general categories onto llama.cpp's.
// llama.cpp's tables are generated from Unicode 15.1; Go's unicode package is
// at 15.0, which lacks the 15.1 additions patched in below (CJK Extension I
// letters and a few ideographic description symbols). Unassigned codepoints
// are "undefined" in llama.cpp; private use and surrogates are "control" (C).
func categoryFlags(r rune) cpFlags {
	switch {
	case unicode.IsNumber(r):
		return flagNumber
	case unicode.IsLetter(r):
		return flagLetter
	case unicode.In(r, unicode.Zs, unicode.Zl, unicode.Zp):
		return flagSeparator
	case unicode.IsMark(r):
		return flagMark
	case unicode.IsPunct(r):
		return flagPunct
	case unicode.IsSymbol(r):
		return flagSymbol
	case unicode.In(r, unicode.Cc, unicode.Cf, unicode.Co, unicode.Cs):
		return flagControl
	case r >= 0x2EBF0 && r <= 0x2EE5D: // Unicode 15.1: CJK Unified Ideographs Extension I
		return flagLetter
	case r >= 0x2FFC && r <= 0x2FFF, r == 0x31EF: // Unicode 15.1: ideographic description characters
		return flagSymbol
	}
	return flagUndefined
}

// decodeCodepoints splits text into codepoints the way llama.cpp's
// unicode_cpts_from_utf8 does: a malformed sequence yields U+FFFD and skips
// one byte, but overlong forms, surrogates and values past U+10FFFF are
// decoded as their raw values (Go's decoder would reject them), because
// llama.cpp re-encodes exactly those values.
func decodeCodepoints(s string) []rune {
	out := make([]rune, 0, len(s))
	for i := 0; i < len(s); {
		r, n := decodeOne(s, i)
		out = append(out, r)
		i += n
	}
	return out
}

func decodeOne(s string, i int) (rune, int) {
	b := s[i]
	cont := func(k int) bool { return i+k < len(s) && s[i+k]&0xC0 == 0x80 }
	switch {
	case b&0x80 == 0:
		return rune(b), 1
	case b&0x40 == 0:
		return 0xFFFD, 1
	case b&0x20 == 0:
		if cont(1) {
			return rune(b&0x1F)<<6 | rune(s[i+1]&0x3F), 2
		}
	case b&0x10 == 0:
		if cont(1) && cont(2) {
			return rune(b&0x0F)<<12 | rune(s[i+1]&0x3F)<<6 | rune(s[i+2]&0x3F), 3
		}
	case b&0x08 == 0:
		if cont(1) && cont(2) && cont(3) {
			return rune(b&0x07)<<18 | rune(s[i+1]&0x3F)<<12 | rune(s[i+2]&0x3F)<<6 | rune(s[i+3]&0x3F), 4
		}
	}
	return 0xFFFD, 1
}

// appendCodepoint is llama.cpp's unicode_cpt_to_utf8: unlike utf8.AppendRune
// it encodes surrogates as they are. Values past U+10FFFF make llama.cpp
// throw, so they are an error here.
func appendCodepoint(dst []byte, r rune) ([]byte, error) {
	switch {
	case r >= 0 && r <= 0x7F:
		return append(dst, byte(r)), nil
	case r >= 0x80 && r <= 0x7FF:
		return append(dst, 0xC0|byte(r>>6&0x1F), 0x80|byte(r&0x3F)), nil
	case r >= 0x800 && r <= 0xFFFF:
		return append(dst, 0xE0|byte(r>>12&0x0F), 0x80|byte(r>>6&0x3F), 0x80|byte(r&0x3F)), nil
	case r >= 0x10000 && r <= 0x10FFFF:
		return append(dst, 0xF0|byte(r>>18&0x07), 0x80|byte(r>>12&0x3F), 0x80|byte(r>>6&0x3F), 0x80|byte(r&0x3F)), nil
	}
	return dst, fmt.Errorf("tokenizer: input decodes to codepoint U+%X, past U+10FFFF (malformed UTF-8)", r)
}

// utf8SeqLen is llama.cpp's unicode_len_utf8: the length a lead byte
// announces, judged by its high nibble only. The SPM tokenizer splits raw
// bytes with it, so malformed input is cut the same way.
func utf8SeqLen(b byte) int {
	switch b >> 4 {
	case 0xC, 0xD:
		return 2
	case 0xE:
		return 3
	case 0xF:
		return 4
	}
	return 1
}

// GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves,
// the rest are shifted to U+0100 and up, so every byte is a visible
// character in the vocabulary.
var (
	byteToRune [256]rune
	runeToByte = map[rune]byte{}
)

func init() {
	n := rune(0)
	for b := range 256 {
		if (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = 256 + n
			n++
		}
		runeToByte[byteToRune[b]] = byte(b)
	}
}

// byteEncode maps raw bytes to the byte-level alphabet.
func byteEncode(dst []byte, raw []byte) []byte {
	for _, b := range raw {
		r := byteToRune[b]
		if r < 0x80 {
			dst = append(dst, byte(r))
		} else {
			dst, _ = appendCodepoint(dst, r)
		}
	}
	return dst
}
