package grammar

import "math/bits"

// Frame kinds.
const (
	fTop uint8 = iota
	fObject
	fArray
	fString
	fNumber
	fLiteral
	fSeq    // a text grammar's sequence (text.go)
	fRepeat // a text grammar's repetition
	fLoop   // a text grammar's loop
	fUntil  // a text grammar's raw text up to a delimiter
)

// Frame states.
const (
	// fTop
	topValue uint8 = iota // before the value
	topDone               // after it: nothing may follow
)

const (
	// fObject
	objOpen  uint8 = iota // after '{'
	objKey                // inside a declared key: lo is the candidates, pos the bytes matched
	objFree               // inside a free key (a string frame above)
	objColon              // after the key
	objValue              // after ':', or inside the value (a frame above)
	objAfter              // after a value
	objComma              // after ','
)

const (
	// fArray
	arrOpen  uint8 = iota // after '['
	arrValue              // inside an item (a frame above)
	arrAfter              // after an item
	arrComma              // after ','
)

const (
	// fString
	strText uint8 = iota
	strEscape
	strHex  // in \uXXXX: rem hex digits to go
	strUTF8 // in a multi-byte character: rem bytes to go, the next within [lo, hi]
)

const (
	// fNumber: the states that may end the number are numZero, numInt, numFrac and numExp.
	numStart uint8 = iota
	numMinus
	numZero
	numInt
	numDot
	numFrac
	numE
	numESign
	numExp
)

// frame is one open value. Its fields mean what its kind says; it is copied on every byte of
// a trie walk, so it stays small.
type frame struct {
	n    int32 // the node, in the grammar's table: no pointer, so that copies are plain
	kind uint8
	st   uint8
	rem  uint8  // string: hex digits or UTF-8 bytes to go
	lo   uint8  // string: the next UTF-8 byte's range; \u escape: its first digit
	hi   uint8  //
	cnt  int32  // array: items; string: characters; number: digits of the current part
	pos  int32  // object key, literal: bytes matched
	cur  int32  // object: the property being read; literal: candidates [cur, end)
	end  int32  //
	seen uint64 // object: properties present; while in a key, bits 0-63 of the candidates
}

// Recognizer is the state of a text the grammar accepts so far. The zero value is unusable;
// get one from Grammar.Recognizer. Copy it with Clone, not by assignment.
type Recognizer struct {
	nodes []*node
	stack []frame
	text  int  // text frames (fSeq, fRepeat) on the stack: the rest is JSON's nesting
	ws    int  // whitespace bytes since the last JSON token
	nl    bool // one of them a newline
}

// Recognizer starts a text.
func (g *Grammar) Recognizer() *Recognizer {
	r := &Recognizer{nodes: g.nodes, stack: make([]frame, 1, g.stackCap())}
	r.stack[0] = frame{n: g.root.id, kind: fTop}
	return r
}

// copyFrom makes r the state s is in, reusing r's memory.
func (r *Recognizer) copyFrom(s *Recognizer) {
	r.nodes = s.nodes
	r.stack = append(r.stack[:0], s.stack...)
	r.text, r.ws, r.nl = s.text, s.ws, s.nl
}

// Clone returns an independent copy.
func (r *Recognizer) Clone() *Recognizer {
	c := &Recognizer{stack: make([]frame, 0, cap(r.stack))}
	c.copyFrom(r)
	return c
}

// Feed advances over text and reports whether the grammar accepts it; on false the state is
// unchanged.
func (r *Recognizer) Feed(text []byte) bool {
	save := r.Clone()
	for _, b := range text {
		if !r.step(b) {
			r.copyFrom(save)
			return false
		}
	}
	return true
}

// Complete reports whether the text so far is a whole value (one that may still go on, as a
// number may).
func (r *Recognizer) Complete() bool {
	top := len(r.stack) - 1
	if top == 0 {
		return r.stack[0].st == topDone
	}
	if !r.canEnd(&r.stack[top]) {
		return false
	}
	for i := top - 1; i >= 1; i-- {
		if !r.textEnds(&r.stack[i]) {
			return false
		}
	}
	return true
}

// Done reports whether the value is complete and nothing may follow it.
func (r *Recognizer) Done() bool {
	if len(r.stack) == 1 {
		return r.stack[0].st == topDone
	}
	// A text grammar is done when its sequences have read their last parts and its
	// repetitions their most items.
	for i := len(r.stack) - 1; i >= 1; i-- {
		f, top := &r.stack[i], i == len(r.stack)-1
		n := r.nodes[f.n]
		switch {
		case f.kind == fSeq && top && int(f.cur) == len(n.alts):
		case f.kind == fSeq && !top && int(f.cur) == len(n.alts)-1:
		case f.kind == fRepeat && top && f.st == repAfter && int(f.cnt) == n.maxItems:
		case f.kind == fRepeat && !top && f.st == repItem && int(f.cnt)+1 == n.maxItems:
		default:
			return false
		}
	}
	return true
}

// Match reports whether text is a whole value the grammar accepts.
func (g *Grammar) Match(text []byte) bool {
	r := g.Recognizer()
	return r.Feed(text) && r.Complete()
}

// canEnd says whether a number or literal frame holds a whole value: one the next byte may
// end.
func (r *Recognizer) canEnd(f *frame) bool {
	switch f.kind {
	case fNumber:
		return f.st == numZero || f.st == numInt || f.st == numFrac || f.st == numExp
	case fLiteral:
		return len(r.nodes[f.n].lits[f.cur]) == int(f.pos)
	case fSeq:
		return int(f.cur) == len(r.nodes[f.n].alts)
	case fRepeat:
		return f.st == repAfter && int(f.cnt) >= r.nodes[f.n].minItems
	}
	return false
}

func isWS(b byte) bool { return b == ' ' || b == '\n' || b == '\t' || b == '\r' }

// space takes b as whitespace between JSON tokens: a space or a tab, or a newline and an
// indentation (see MaxIndent). Only a container or the top frame is on top in a gap, so
// the stack's height is the nesting.
func (r *Recognizer) space(b byte) bool {
	switch {
	case b == '\n' && r.ws == 0:
		r.nl = true
	case (b == ' ' || b == '\t') && (r.ws == 0 || r.nl && r.ws <= min(MaxIndent, IndentPerLevel*(len(r.stack)-1-r.text))):
	default:
		return false
	}
	r.ws++
	return true
}

// step advances over one byte; on false the state is partly changed and must be discarded.
func (r *Recognizer) step(b byte) bool {
	if !isWS(b) {
		r.ws, r.nl = 0, false
	}
	return r.dispatch(b)
}

// dispatch gives b to the top frame, closing the frames it ends.
func (r *Recognizer) dispatch(b byte) bool {
	for {
		f := &r.stack[len(r.stack)-1]
		switch f.kind {
		case fTop:
			if f.st == topValue {
				return r.space(b) || r.open(r.nodes[f.n], b)
			}
			return false
		case fObject:
			return r.object(f, b)
		case fArray:
			return r.array(f, b)
		case fString:
			return r.str(f, b)
		case fNumber:
			switch r.number(f, b) {
			case 1:
				return true
			case 0:
				return false
			}
		case fLiteral:
			switch r.literal(f, b) {
			case 1:
				return true
			case 0:
				return false
			}
		case fSeq, fRepeat, fLoop, fUntil:
			var c int
			switch f.kind {
			case fSeq:
				c = r.seq(f, b)
			case fRepeat:
				c = r.repeat(f, b)
			case fLoop:
				c = r.loop(f, b)
			default:
				c = r.until(f, b)
			}
			switch c {
			case 1:
				return true
			case 0:
				return false
			case 3:
				continue // b belongs to the frame just opened
			}
		}
		// The number, literal or text part ended before b: b belongs to the frame below.
		r.pop()
	}
}

// pop closes the top frame, a whole value, and moves the frame below past it.
func (r *Recognizer) pop() {
	if k := r.stack[len(r.stack)-1].kind; k >= fSeq {
		r.text--
	}
	r.stack = r.stack[:len(r.stack)-1]
	f := &r.stack[len(r.stack)-1]
	switch f.kind {
	case fTop:
		f.st = topDone
	case fObject:
		if f.st == objFree {
			f.st = objColon
			return
		}
		f.st = objAfter
	case fArray:
		f.st = arrAfter
		f.cnt++
	case fSeq:
		f.cur, f.pos = f.cur+1, 0
	case fRepeat:
		f.st = repAfter
		f.cnt++
	case fLoop:
		f.pos = 0 // an alternative is done: choose again
	}
}

// open starts a value of n with its first byte b.
func (r *Recognizer) open(n *node, b byte) bool {
	for n.kind == kUnion {
		i := n.first[b]
		if i == 0 {
			return false
		}
		n = n.alts[i-1]
	}
	switch n.kind {
	case kObject:
		if b != '{' || len(r.stack)-r.text > MaxDepth {
			return false
		}
		r.stack = append(r.stack, frame{n: n.id, kind: fObject, st: objOpen})
		return true
	case kArray:
		if b != '[' || len(r.stack)-r.text > MaxDepth {
			return false
		}
		r.stack = append(r.stack, frame{n: n.id, kind: fArray, st: arrOpen})
		return true
	case kString:
		if b != '"' {
			return false
		}
		r.stack = append(r.stack, frame{n: n.id, kind: fString})
		return true
	case kNumber, kInteger:
		r.stack = append(r.stack, frame{n: n.id, kind: fNumber})
		return r.number(&r.stack[len(r.stack)-1], b) == 1
	case kLiteral:
		r.stack = append(r.stack, frame{n: n.id, kind: fLiteral, end: int32(len(n.lits))})
		return r.literal(&r.stack[len(r.stack)-1], b) == 1
	case kSeq, kRepeat:
		k := fSeq
		if n.kind == kRepeat {
			k = fRepeat
		}
		return r.push(frame{n: n.id, kind: k}) == 3 && r.dispatch(b)
	}
	return false
}

// keyPossible says whether another key may start in object frame f.
func (r *Recognizer) keyPossible(f *frame) bool {
	if r.nodes[f.n].extra != nil {
		return true
	}
	return ^f.seen&(1<<len(r.nodes[f.n].keys)-1) != 0
}

func (r *Recognizer) object(f *frame, b byte) bool {
	n := r.nodes[f.n]
	switch f.st {
	case objOpen, objComma:
		if r.space(b) {
			return true
		}
		if b == '}' && f.st == objOpen && f.seen&n.required == n.required {
			r.pop()
			return true
		}
		if b != '"' || !r.keyPossible(f) {
			return false
		}
		if n.extra != nil {
			f.st = objFree
			r.stack = append(r.stack, frame{n: freeKey.id, kind: fString})
			return true
		}
		f.st, f.pos = objKey, 0
		f.keyMask(^f.seen & (1<<len(n.keys) - 1))
		return true
	case objKey:
		m := f.mask()
		if b == '"' {
			for ; m != 0; m &= m - 1 {
				i := bits.TrailingZeros64(m)
				if len(n.keys[i]) == int(f.pos) {
					f.cur = int32(i)
					f.seen |= 1 << i
					f.st = objColon
					return true
				}
			}
			return false
		}
		var nm uint64
		for ; m != 0; m &= m - 1 {
			i := bits.TrailingZeros64(m)
			if k := n.keys[i]; len(k) > int(f.pos) && k[f.pos] == b {
				nm |= 1 << i
			}
		}
		if nm == 0 {
			return false
		}
		f.keyMask(nm)
		f.pos++
		return true
	case objColon:
		if r.space(b) {
			return true
		}
		if b != ':' {
			return false
		}
		f.st = objValue
		return true
	case objValue:
		if r.space(b) {
			return true
		}
		v := n.extra
		if v == nil {
			v = n.props[f.cur]
		}
		return r.open(v, b)
	case objAfter:
		if r.space(b) {
			return true
		}
		switch {
		case b == ',' && r.keyPossible(f):
			f.st = objComma
			return true
		case b == '}' && f.seen&n.required == n.required:
			r.pop()
			return true
		}
	}
	return false
}

// A declared key's candidates are kept in cnt and end (two 32-bit halves), so that the
// seen set stays intact while the key is read.
func (f *frame) keyMask(m uint64) { f.cnt, f.end = int32(uint32(m)), int32(uint32(m>>32)) }
func (f *frame) mask() uint64     { return uint64(uint32(f.cnt)) | uint64(uint32(f.end))<<32 }

func (r *Recognizer) array(f *frame, b byte) bool {
	n := r.nodes[f.n]
	switch f.st {
	case arrOpen, arrComma:
		if r.space(b) {
			return true
		}
		if b == ']' && f.st == arrOpen && n.minItems == 0 {
			r.pop()
			return true
		}
		if n.maxItems >= 0 && int(f.cnt) >= n.maxItems {
			return false
		}
		f.st = arrValue
		return r.open(n.items, b)
	case arrAfter:
		if r.space(b) {
			return true
		}
		switch {
		case b == ',' && (n.maxItems < 0 || int(f.cnt) < n.maxItems):
			f.st = arrComma
			return true
		case b == ']' && int(f.cnt) >= n.minItems:
			r.pop()
			return true
		}
	}
	return false
}

// str reads a string's bytes: valid UTF-8, no control characters, escapes as JSON has them
// (none for a UTF-16 surrogate, so that one escape is one character), and the schema's
// length in characters.
func (r *Recognizer) str(f *frame, b byte) bool {
	n := r.nodes[f.n]
	switch f.st {
	case strText:
		room := n.maxLen < 0 || int(f.cnt) < n.maxLen
		switch {
		case b == '"':
			if int(f.cnt) < n.minLen {
				return false
			}
			r.pop()
			return true
		case b == '\\':
			f.st = strEscape
		case b < 0x20:
			return false
		case b < 0x80:
		case b >= 0xC2 && b <= 0xDF:
			f.st, f.rem, f.lo, f.hi = strUTF8, 1, 0x80, 0xBF
		case b == 0xE0:
			f.st, f.rem, f.lo, f.hi = strUTF8, 2, 0xA0, 0xBF
		case b >= 0xE1 && b <= 0xEC, b == 0xEE, b == 0xEF:
			f.st, f.rem, f.lo, f.hi = strUTF8, 2, 0x80, 0xBF
		case b == 0xED:
			f.st, f.rem, f.lo, f.hi = strUTF8, 2, 0x80, 0x9F
		case b == 0xF0:
			f.st, f.rem, f.lo, f.hi = strUTF8, 3, 0x90, 0xBF
		case b >= 0xF1 && b <= 0xF3:
			f.st, f.rem, f.lo, f.hi = strUTF8, 3, 0x80, 0xBF
		case b == 0xF4:
			f.st, f.rem, f.lo, f.hi = strUTF8, 3, 0x80, 0x8F
		default:
			return false
		}
		if !room {
			return false
		}
		f.cnt++
		return true
	case strEscape:
		switch b {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			f.st = strText
		case 'u':
			f.st, f.rem = strHex, 4
		default:
			return false
		}
		return true
	case strHex:
		if !isHex(b) {
			return false
		}
		switch f.rem {
		case 4:
			f.lo = b | 0x20 // lower case
		case 3:
			if f.lo == 'd' && (b >= '8' && b <= '9' || b|0x20 >= 'a' && b|0x20 <= 'f') {
				return false // a surrogate
			}
		}
		if f.rem--; f.rem == 0 {
			f.st = strText
		}
		return true
	case strUTF8:
		if b < f.lo || b > f.hi {
			return false
		}
		f.lo, f.hi = 0x80, 0xBF
		if f.rem--; f.rem == 0 {
			f.st = strText
		}
		return true
	}
	return false
}

func isHex(b byte) bool {
	return b >= '0' && b <= '9' || b|0x20 >= 'a' && b|0x20 <= 'f'
}

// number reads a number's bytes: 1 taken, 0 refused, 2 the number ended before b.
func (r *Recognizer) number(f *frame, b byte) int {
	digit := b >= '0' && b <= '9'
	integer := r.nodes[f.n].kind == kInteger
	switch f.st {
	case numStart:
		switch {
		case b == '-':
			f.st = numMinus
			return 1
		case b == '0':
			f.st = numZero
			return 1
		case digit:
			f.st, f.cnt = numInt, 1
			return 1
		}
		return 0
	case numMinus:
		switch {
		case b == '0':
			f.st = numZero
			return 1
		case digit:
			f.st, f.cnt = numInt, 1
			return 1
		}
		return 0
	case numZero, numInt:
		switch {
		case digit && f.st == numInt && f.cnt < MaxIntDigits:
			f.cnt++
			return 1
		case b == '.' && !integer:
			f.st, f.cnt = numDot, 0
			return 1
		case (b == 'e' || b == 'E') && !integer:
			f.st, f.cnt = numE, 0
			return 1
		}
	case numDot:
		if digit {
			f.st, f.cnt = numFrac, 1
			return 1
		}
		return 0
	case numFrac:
		switch {
		case digit && f.cnt < MaxFracDigits:
			f.cnt++
			return 1
		case b == 'e' || b == 'E':
			f.st, f.cnt = numE, 0
			return 1
		}
	case numE:
		switch {
		case b == '+' || b == '-':
			f.st = numESign
			return 1
		case digit:
			f.st, f.cnt = numExp, 1
			return 1
		}
		return 0
	case numESign:
		if digit {
			f.st, f.cnt = numExp, 1
			return 1
		}
		return 0
	case numExp:
		if digit && f.cnt < MaxExpDigits {
			f.cnt++
			return 1
		}
	}
	// A whole number: b may be what follows it, unless b is of a number itself (a digit
	// past the limit, or a second '.').
	if digit || b == '.' || b == 'e' || b == 'E' || b == '+' || b == '-' {
		return 0
	}
	return 2
}

// literal matches one of the node's literal encodings, sorted so that those sharing the
// bytes matched so far are the run [cur, end): 1 taken, 0 refused, 2 the literal ended
// before b.
func (r *Recognizer) literal(f *frame, b byte) int {
	lits := r.nodes[f.n].lits
	p := int(f.pos)
	lo, hi := int(f.cur), int(f.end)
	for lo < hi && (len(lits[lo]) <= p || lits[lo][p] < b) {
		lo++
	}
	e := lo
	for e < hi && len(lits[e]) > p && lits[e][p] == b {
		e++
	}
	if e == lo {
		if len(lits[f.cur]) == p {
			return 2
		}
		return 0
	}
	f.cur, f.end, f.pos = int32(lo), int32(e), int32(p+1)
	if e-lo == 1 && len(lits[lo]) == p+1 {
		r.pop() // nothing can follow within the literal: it is whole now
	}
	return 1
}
