package grammar

import (
	"fmt"
	"slices"
	"strings"
)

// Text grammars put JSON values inside fixed text: what a model writes to call a tool, such
// as Qwen's "<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>", where the text
// around the arguments is the chat format's and the arguments are the tool's schema.
//
// A text grammar is a sequence of parts: literal text, taken byte for byte; a JSON value
// of a schema; a choice among literals, each followed by a sequence of its own (a tool's
// name decides its arguments' schema); and a repetition with a separator (parallel calls).
// It stays deterministic, as the JSON recognizer is: a choice's literals must be prefix-free
// (none the start of another), so the bytes decide, and a repetition goes on whenever the
// next byte starts its separator.

// Part is one piece of a text grammar; build it with Lit, Value, AnyObject, OneOf or Repeat.
type Part struct {
	kind     partKind
	lit      string
	schema   []byte
	loose    bool
	alts     []Alt
	items    []Part
	sep      string
	min, max int
}

type partKind uint8

const (
	pNone partKind = iota
	pLit
	pValue
	pAnyObject
	pChoice
	pRepeat
	pUntil
	pLoop
)

// Alt is one alternative of OneOf: Lit, then the parts that follow it.
type Alt struct {
	Lit  string
	Then []Part
}

// Lit is text taken byte for byte.
func Lit(s string) Part { return Part{kind: pLit, lit: s} }

// Value is a JSON value of schema (see Compile for the keywords supported).
func Value(schema []byte) Part { return Part{kind: pValue, schema: schema} }

// LooseValue is a JSON value of schema as CompileLoose reads it.
func LooseValue(schema []byte) Part { return Part{kind: pValue, schema: schema, loose: true} }

// AnyObject is any JSON object.
func AnyObject() Part { return Part{kind: pAnyObject} }

// OneOf is one of alts, chosen by its literal; the literals must be non-empty and none may
// start another.
func OneOf(alts ...Alt) Part { return Part{kind: pChoice, alts: alts} }

// Repeat is min to max (-1: no bound) of items, with sep between them; sep must not be
// empty, min at least 1.
func Repeat(min, max int, sep string, items ...Part) Part {
	return Part{kind: pRepeat, items: items, sep: sep, min: min, max: max}
}

// Until is any text, in valid UTF-8, up to and with the first delim, at most max bytes with
// it: a raw value in a format that writes strings as they are (Qwen3-Coder's parameters).
// delim must be ASCII and not empty.
func Until(delim string, max int) Part { return Part{kind: pUntil, sep: delim, max: max} }

// Loop is zero or more of alts, each chosen by its literal and at most once, then end: the
// parameters of a call, in any order, then its closing tag. The literals and end must be
// prefix-free; 63 alternatives at most.
func Loop(end string, alts ...Alt) Part { return Part{kind: pLoop, sep: end, alts: alts} }

// Text compiles a sequence of parts. desc says what it accepts, for errors and String.
func Text(desc string, parts ...Part) (*Grammar, error) {
	c := compiler{}
	root, err := c.sequence(parts, "text")
	if err != nil {
		return nil, err
	}
	g := newGrammar(root, desc)
	g.text = textDepth(root)
	return g, nil
}

// sequence compiles parts into a kSeq node.
func (c *compiler) sequence(parts []Part, path string) (*node, error) {
	if len(parts) == 0 {
		return nil, fmt.Errorf("grammar: %s: an empty sequence", path)
	}
	seq := &node{kind: kSeq}
	for i, p := range parts {
		n, err := c.part(p, fmt.Sprintf("%s/%d", path, i))
		if err != nil {
			return nil, err
		}
		seq.alts = append(seq.alts, n)
	}
	return seq, nil
}

func (c *compiler) part(p Part, path string) (*node, error) {
	if c.nodes++; c.nodes > maxSchemaNodes {
		return nil, fmt.Errorf("grammar: %s: more than %d parts and subschemas", path, maxSchemaNodes)
	}
	switch p.kind {
	case pLit:
		if p.lit == "" {
			return nil, fmt.Errorf("grammar: %s: an empty literal", path)
		}
		return &node{kind: kRaw, lits: []string{p.lit}}, nil
	case pAnyObject:
		return anyObject, nil
	case pValue:
		return c.schemaPart(p.schema, p.loose)
	case pChoice:
		return c.choice(p.alts, path, false)
	case pUntil:
		if p.sep == "" || p.max < len(p.sep) || strings.IndexFunc(p.sep, func(r rune) bool { return r >= 0x80 }) >= 0 {
			return nil, fmt.Errorf("grammar: %s: Until needs an ASCII delimiter and room for it", path)
		}
		return &node{kind: kUntil, lits: []string{p.sep}, maxLen: p.max}, nil
	case pLoop:
		if p.sep == "" {
			return nil, fmt.Errorf("grammar: %s: a loop needs its end", path)
		}
		if len(p.alts) > 63 {
			return nil, fmt.Errorf("grammar: %s: a loop of %d alternatives, 63 at most", path, len(p.alts))
		}
		n, err := c.choice(append(slices.Clone(p.alts), Alt{Lit: p.sep}), path, true)
		if err != nil {
			return nil, err
		}
		n.kind = kLoop
		return n, nil
	case pRepeat:
		if p.sep == "" || p.min < 1 || p.max >= 0 && p.max < p.min {
			return nil, fmt.Errorf("grammar: %s: a repetition needs a separator and 1 <= min <= max", path)
		}
		item, err := c.sequence(p.items, path)
		if err != nil {
			return nil, err
		}
		return &node{kind: kRepeat, items: item, lits: []string{p.sep}, minItems: p.min, maxItems: p.max}, nil
	}
	return nil, fmt.Errorf("grammar: %s: a zero Part", path)
}

// schemaPart compiles a schema for a Value part; errors are *SchemaError as Compile's.
func (c *compiler) schemaPart(schema []byte, loose bool) (*node, error) {
	g, err := compileSchema(schema, loose)
	if err != nil {
		return nil, err
	}
	c.nodes += len(g.nodes)
	return g.root, nil
}

// choice compiles OneOf: its literals sorted, each with its continuation; with empty, an
// alternative may have none (a loop's end), its continuation nil.
func (c *compiler) choice(alts []Alt, path string, empty bool) (*node, error) {
	if len(alts) == 0 {
		return nil, fmt.Errorf("grammar: %s: a choice of nothing", path)
	}
	alts = slices.Clone(alts)
	slices.SortFunc(alts, func(a, b Alt) int { return strings.Compare(a.Lit, b.Lit) })
	n := &node{kind: kChoice}
	for i, a := range alts {
		if a.Lit == "" {
			return nil, fmt.Errorf("grammar: %s: an empty alternative", path)
		}
		if i > 0 && strings.HasPrefix(a.Lit, alts[i-1].Lit) {
			return nil, fmt.Errorf("grammar: %s: alternative %q starts with alternative %q", path, a.Lit, alts[i-1].Lit)
		}
		var next *node
		if len(a.Then) > 0 || !empty {
			var err error
			if next, err = c.sequence(a.Then, fmt.Sprintf("%s/%q", path, a.Lit)); err != nil {
				return nil, err
			}
		}
		n.lits = append(n.lits, a.Lit)
		n.alts = append(n.alts, next)
	}
	return n, nil
}

// Frame states of fRepeat.
const (
	repItem  uint8 = iota // an item is next
	repAfter              // after an item: the separator or the end
	repSep                // inside the separator: pos bytes matched
)

// seq reads a sequence's parts in turn (cur the part, pos the bytes of a literal matched;
// a choice's candidates are the run [cnt, end) of its sorted literals): 1 taken, 0
// refused, 2 the sequence ended before b, 3 a frame was pushed that b belongs to.
func (r *Recognizer) seq(f *frame, b byte) int {
	n := r.nodes[f.n]
	if int(f.cur) == len(n.alts) {
		return 2
	}
	switch p := n.alts[f.cur]; p.kind {
	case kRaw:
		if p.lits[0][f.pos] != b {
			return 0
		}
		if f.pos++; int(f.pos) == len(p.lits[0]) {
			f.cur, f.pos = f.cur+1, 0
		}
		return 1
	case kChoice:
		return r.choose(f, p, b)
	case kLoop:
		return r.push(frame{n: p.id, kind: fLoop})
	case kUntil:
		return r.push(frame{n: p.id, kind: fUntil})
	case kSeq:
		return r.push(frame{n: p.id, kind: fSeq})
	case kRepeat:
		return r.push(frame{n: p.id, kind: fRepeat})
	default:
		if r.open(p, b) {
			return 1
		}
		return 0
	}
}

// push opens a text frame that the byte at hand belongs to.
func (r *Recognizer) push(f frame) int {
	r.stack = append(r.stack, f)
	r.text++
	return 3
}

// textDepth is the most text frames n puts on the stack at once.
func textDepth(n *node) int {
	d := 0
	switch n.kind {
	case kSeq:
		for _, p := range n.alts {
			d = max(d, textDepth(p))
		}
		return d + 1
	case kChoice:
		for _, a := range n.alts {
			if a != nil {
				d = max(d, textDepth(a))
			}
		}
		return d
	case kLoop:
		for _, a := range n.alts {
			if a != nil {
				d = max(d, textDepth(a))
			}
		}
		return d + 1
	case kUntil:
		return 1
	case kRepeat:
		return 1 + textDepth(n.items)
	}
	return 0
}

// loop reads a Loop: its alternatives' literals and its end, narrowed as a choice's; an
// alternative's continuation comes back here, the end closes the loop.
// Alternatives taken are in seen, and not taken again.
func (r *Recognizer) loop(f *frame, b byte) int {
	n := r.nodes[f.n]
	c := r.chooseFrom(f, n, b, f.seen)
	if c == 1 && f.pos == 0 {
		if n.alts[f.cnt] == nil {
			r.pop() // the end: nothing was pushed, the loop is whole
		} else {
			f.seen |= 1 << f.cnt
		}
	}
	return c
}

// until reads an Until's text: valid UTF-8 (rem continuation bytes to go, the next within
// [lo, hi]), cnt bytes so far, pos bytes of the delimiter matched at its end.
func (r *Recognizer) until(f *frame, b byte) int {
	n := r.nodes[f.n]
	delim := n.lits[0]
	switch {
	case f.rem > 0:
		if b < f.lo || b > f.hi {
			return 0
		}
		f.rem--
		f.lo, f.hi = 0x80, 0xbf
	case b < 0x80:
	case b >= 0xc2 && b <= 0xdf:
		f.rem, f.lo, f.hi = 1, 0x80, 0xbf
	case b >= 0xe0 && b <= 0xef:
		f.rem, f.lo, f.hi = 2, 0x80, 0xbf
		if b == 0xe0 {
			f.lo = 0xa0
		} else if b == 0xed {
			f.hi = 0x9f
		}
	case b >= 0xf0 && b <= 0xf4:
		f.rem, f.lo, f.hi = 3, 0x80, 0xbf
		if b == 0xf0 {
			f.lo = 0x90
		} else if b == 0xf4 {
			f.hi = 0x8f
		}
	default:
		return 0
	}
	pos := delimState(delim, int(f.pos), b)
	if int(f.cnt)+1+int(f.rem)+len(delim)-pos > n.maxLen && pos < len(delim) {
		return 0 // no room left to finish with the delimiter
	}
	f.cnt++
	f.pos = int32(pos)
	if pos == len(delim) {
		r.pop()
	}
	return 1
}

// delimState is how much of delim the text ends with after b, given pos of it before: the
// longest prefix of delim that is a suffix of delim[:pos]+b.
func delimState(delim string, pos int, b byte) int {
	for k := min(pos+1, len(delim)); k > 0; k-- {
		if delim[k-1] == b && delim[:k-1] == delim[pos+1-k:pos] { // the text ends with delim[:pos]
			return k
		}
	}
	return 0
}

// choose narrows a choice's candidates by b; the one literal that is whole opens its
// continuation.
func (r *Recognizer) choose(f *frame, p *node, b byte) int { return r.chooseFrom(f, p, b, 0) }

// chooseFrom is choose with the literals in the set taken refused: a byte that leaves only
// those is refused too, so that no prefix taken is a dead end.
func (r *Recognizer) chooseFrom(f *frame, p *node, b byte, taken uint64) int {
	pos := int(f.pos)
	lo, hi := int(f.cnt), int(f.end)
	if pos == 0 {
		lo, hi = 0, len(p.lits)
	}
	for lo < hi && (len(p.lits[lo]) <= pos || p.lits[lo][pos] < b) {
		lo++
	}
	e := lo
	for e < hi && len(p.lits[e]) > pos && p.lits[e][pos] == b {
		e++
	}
	if taken != 0 {
		for lo < e && taken&(1<<lo) != 0 {
			lo++
		}
		for e > lo && taken&(1<<(e-1)) != 0 {
			e--
		}
	}
	if e == lo {
		return 0
	}
	f.cnt, f.end, f.pos = int32(lo), int32(e), int32(pos+1)
	if e-lo == 1 && len(p.lits[lo]) == pos+1 {
		f.pos = 0
		if p.alts[lo] != nil {
			r.push(frame{n: p.alts[lo].id, kind: fSeq})
		}
	}
	return 1
}

// repeat reads items and separators (cnt items read, pos bytes of the separator).
func (r *Recognizer) repeat(f *frame, b byte) int {
	n := r.nodes[f.n]
	sep := n.lits[0]
	switch f.st {
	case repItem:
		return r.push(frame{n: n.items.id, kind: fSeq})
	case repAfter:
		if (n.maxItems < 0 || int(f.cnt) < n.maxItems) && b == sep[0] {
			f.st, f.pos = repSep, 1
			if len(sep) == 1 {
				f.st = repItem
			}
			return 1
		}
		if int(f.cnt) >= n.minItems {
			return 2
		}
		return 0
	case repSep:
		if sep[f.pos] != b {
			return 0
		}
		if f.pos++; int(f.pos) == len(sep) {
			f.st = repItem
		}
		return 1
	}
	return 0
}

// textEnds says whether frame f, below the top, lets the text end once the frames above
// it have: its part in progress is its last (a sequence), or one more item is enough (a
// repetition).
func (r *Recognizer) textEnds(f *frame) bool {
	n := r.nodes[f.n]
	switch f.kind {
	case fSeq:
		return int(f.cur) == len(n.alts)-1
	case fRepeat:
		return f.st == repItem && int(f.cnt)+1 >= n.minItems
	}
	return false // a loop or an until closes itself with its end
}
