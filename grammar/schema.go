// Package grammar constrains generation to JSON: a byte-level recognizer for any JSON value,
// any object, or the values a JSON Schema (a subset, see Compile) allows, JSON values inside
// fixed text (Text: a model's tool calls in its chat format), and a Matcher that
// turns the recognizer into a token filter over a model's vocabulary (see Vocab), which the
// sampler chain of package sample runs before its other stages.
//
// The recognizer is a pushdown automaton over bytes: a stack of frames, one per open object,
// array, string, number or literal, and of a text grammar's sequences. It never accepts a prefix that cannot be completed, so
// that a model held to it cannot be driven into a dead end, and it bounds what a model could
// repeat forever without finishing: whitespace between tokens, nesting, and the digits of a
// number. The language it accepts is what encoding/json accepts, in valid UTF-8, within those
// bounds and the schema; see Limits.
package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Limits of the accepted language. They keep a model from looping forever inside a value a
// grammar would otherwise allow without end, and a hostile schema or text from costing
// without bound.
const (
	// MaxIndent bounds the whitespace between two JSON tokens, which is nothing, a space
	// or a tab, or a newline and an indentation of up to IndentPerLevel spaces or tabs per
	// object or array open, MaxIndent at most: pretty-printing's line break and indentation,
	// never a model stuck on blank lines or spaces.
	MaxIndent      = 20
	IndentPerLevel = 4
	// MaxDepth is the most objects and arrays open at once.
	MaxDepth = 32
	// MaxIntDigits, MaxFracDigits and MaxExpDigits bound a number's integer part, fraction
	// and exponent.
	MaxIntDigits  = 16
	MaxFracDigits = 16
	MaxExpDigits  = 3
	// MaxProperties is the most properties an object schema may declare: the recognizer
	// tracks them in a 64-bit set.
	MaxProperties = 64
	// maxSchemaDepth bounds the nesting of a schema, below MaxDepth so that a schema's
	// objects and arrays can always be opened.
	maxSchemaDepth = MaxDepth - 2
	// maxLiterals bounds enum values, and maxLiteralBytes their encodings together.
	maxLiterals     = 4096
	maxLiteralBytes = 1 << 20
	// maxSchemaNodes bounds the compiled schema.
	maxSchemaNodes = 10000
)

type kind uint8

const (
	kObject kind = iota
	kArray
	kString
	kNumber
	kInteger
	kLiteral // enum and const values, true, false, null: their exact encodings
	kUnion   // anyOf, oneOf, a list of types: told apart by their first byte
	// text grammars (text.go)
	kRaw    // literal text: lits[0]
	kSeq    // parts in turn: alts
	kChoice // one of the literals lits, each followed by its sequence in alts
	kRepeat // items, a sequence, minItems to maxItems times, lits[0] between them
	kLoop   // a choice (lits, alts) taken again until its literal with no continuation
	kUntil  // any text up to and with lits[0], maxLen bytes at most
)

// node is a compiled schema. Nodes may form cycles (any value holds any values).
type node struct {
	id   int32 // in its grammar's table
	kind kind
	// object: the declared properties, by their JSON-encoded names (between the quotes),
	// sorted; required, a set of their indices; extra, the schema of any key when none is
	// declared (nil: no key at all).
	keys     []string
	props    []*node
	required uint64
	extra    *node
	// array
	items              *node
	minItems, maxItems int // maxItems -1: unbounded
	// string: characters (code points)
	minLen, maxLen int // maxLen -1: unbounded
	// literal: the values' compact encodings, sorted
	lits []string
	// union: first[b] is 1 + the index in alts of the alternative a value starting with
	// byte b belongs to, 0 if none
	alts  []*node
	first *[256]uint8
}

// Grammar is a compiled JSON constraint; it is immutable and safe for concurrent use.
type Grammar struct {
	root  *node
	nodes []*node // every node by id, so that frames hold ids, not pointers
	desc  string
	text  int // the most text frames open at once (text.go)
}

// stackCap is the most frames a text of g opens: the top, JSON's nesting and its last
// scalar, and the text frames.
func (g *Grammar) stackCap() int { return MaxDepth + 3 + g.text }

// String says what the grammar accepts.
func (g *Grammar) String() string { return g.desc }

var anyValue, anyObject, freeKey, anyNodes = buildAny()

func buildAny() (*node, *node, *node, []*node) {
	v := &node{kind: kUnion}
	obj := &node{kind: kObject, extra: v}
	arr := &node{kind: kArray, items: v, maxItems: -1}
	str := &node{kind: kString, maxLen: -1}
	num := &node{kind: kNumber}
	lit := &node{kind: kLiteral, lits: []string{"false", "null", "true"}}
	v.alts = []*node{obj, arr, str, num, lit}
	if err := v.index(); err != nil {
		panic(err) // the any value's alternatives are disjoint by construction
	}
	key := &node{kind: kString, maxLen: -1} // an object's key where any is allowed
	nodes := []*node{v, obj, arr, str, num, lit, key}
	for i, n := range nodes {
		n.id = int32(i)
	}
	return v, obj, key, nodes
}

// newGrammar numbers the nodes reachable from root after the any value's, which every
// grammar shares at the same ids.
func newGrammar(root *node, desc string) *Grammar {
	g := &Grammar{root: root, nodes: slices.Clone(anyNodes), desc: desc}
	seen := map[*node]bool{}
	for _, n := range anyNodes {
		seen[n] = true
	}
	var visit func(n *node)
	visit = func(n *node) {
		if n == nil || seen[n] {
			return
		}
		seen[n] = true
		n.id = int32(len(g.nodes))
		g.nodes = append(g.nodes, n)
		for _, c := range n.props {
			visit(c)
		}
		for _, c := range n.alts {
			visit(c)
		}
		visit(n.extra)
		visit(n.items)
	}
	visit(root)
	return g
}

// JSON accepts any JSON value.
func JSON() *Grammar { return newGrammar(anyValue, "any JSON value") }

// JSONObject accepts any JSON object: OpenAI's json_object response format.
func JSONObject() *Grammar { return newGrammar(anyObject, "any JSON object") }

// SchemaError is a schema Compile cannot honour: where in the schema (a JSON pointer), the
// keyword at fault, and why.
type SchemaError struct {
	Path    string
	Keyword string
	Msg     string
}

func (e *SchemaError) Error() string {
	if e.Keyword == "" {
		return fmt.Sprintf("JSON schema at %s: %s", e.Path, e.Msg)
	}
	return fmt.Sprintf("JSON schema at %s: keyword %q: %s", e.Path, e.Keyword, e.Msg)
}

// annotations are keywords that do not constrain a value.
var annotations = map[string]bool{
	"$schema": true, "$id": true, "$comment": true, "title": true, "description": true,
	"default": true, "examples": true, "readOnly": true, "writeOnly": true, "deprecated": true,
}

// supported are the keywords Compile honours; any other is an error, never ignored.
var supported = map[string]bool{
	"type": true, "properties": true, "required": true, "additionalProperties": true,
	"items": true, "minItems": true, "maxItems": true, "minLength": true, "maxLength": true,
	"enum": true, "const": true, "anyOf": true, "oneOf": true,
}

// Compile compiles a JSON Schema: type (object, array, string, number, integer, boolean,
// null, or a list of them), properties, required, additionalProperties, items, minItems,
// maxItems, minLength, maxLength, enum, const, anyOf and oneOf (whose alternatives must
// differ in the first byte of their values: a string and a null, not two objects), with the
// annotations (title, description, default, ...) ignored. Any other keyword is a
// *SchemaError naming it.
//
// An object that declares properties is generated with those properties only, in any order,
// each at most once, the required ones always: what additionalProperties false asks, and a
// subset of what the schema allows otherwise. An object that declares none takes any keys,
// with additionalProperties as their values' schema.
func Compile(schema []byte) (*Grammar, error) { return compileSchema(schema, false) }

// CompileLoose is Compile with the keywords it does not support ignored, as annotations
// are: the grammar then allows more than the schema does (a number beyond its maximum, a
// string of another format), never less. For schemas written for something else, such as
// a tool's parameters, whose values are the model's to get right.
func CompileLoose(schema []byte) (*Grammar, error) { return compileSchema(schema, true) }

func compileSchema(schema []byte, loose bool) (*Grammar, error) {
	d := json.NewDecoder(bytes.NewReader(schema))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, &SchemaError{Path: "#", Msg: "not JSON: " + err.Error()}
	}
	if d.More() {
		return nil, &SchemaError{Path: "#", Msg: "not one JSON value"}
	}
	c := compiler{loose: loose}
	root, err := c.compile(v, "#", 0)
	if err != nil {
		return nil, err
	}
	return newGrammar(root, "a JSON schema"), nil
}

type compiler struct {
	nodes, litBytes int
	loose           bool // ignore unsupported keywords (CompileLoose)
}

func (c *compiler) compile(v any, path string, depth int) (*node, error) {
	if depth > maxSchemaDepth {
		return nil, &SchemaError{Path: path, Msg: fmt.Sprintf("nested deeper than %d levels", maxSchemaDepth)}
	}
	if c.nodes++; c.nodes > maxSchemaNodes {
		return nil, &SchemaError{Path: path, Msg: fmt.Sprintf("more than %d subschemas", maxSchemaNodes)}
	}
	switch s := v.(type) {
	case bool:
		if s {
			return anyValue, nil
		}
		return nil, &SchemaError{Path: path, Msg: "the schema false allows no value"}
	case map[string]any:
		return c.compileObject(s, path, depth)
	}
	return nil, &SchemaError{Path: path, Msg: "a schema is an object or a boolean"}
}

// compileObject compiles a schema object: its literals (const, enum), its alternatives
// (anyOf, oneOf), or its types with the keywords that shape them.
func (c *compiler) compileObject(s map[string]any, path string, depth int) (*node, error) {
	used, err := keywords(s, path, c.loose)
	if err != nil {
		return nil, err
	}
	has := func(k string) bool { _, ok := s[k]; return ok }
	types, err := schemaTypes(s, path)
	if err != nil {
		return nil, err
	}
	switch {
	case has("const") || has("enum"):
		return c.literalSchema(s, used, types, path)
	case has("anyOf") || has("oneOf"):
		return c.unionSchema(s, used, path, depth)
	}
	if types == nil {
		if types = impliedTypes(has); types == nil {
			return anyValue, nil
		}
	}
	// Each keyword must apply to one of the types, or it would be silently ignored.
	applies := map[string]string{"properties": "object", "required": "object", "additionalProperties": "object",
		"items": "array", "minItems": "array", "maxItems": "array", "minLength": "string", "maxLength": "string"}
	for _, u := range used {
		if t, ok := applies[u]; ok && !slices.Contains(types, t) {
			return nil, &SchemaError{Path: path, Keyword: u, Msg: fmt.Sprintf("applies to type %s, which the schema's type excludes", t)}
		}
	}
	return c.typedSchema(s, types, path, depth)
}

// keywords lists the schema's keywords that shape its values, sorted, and refuses those the
// grammar cannot enforce; annotations (title, description, ...) are left out.
func keywords(s map[string]any, path string, loose bool) ([]string, error) {
	var used []string
	for k := range s {
		if annotations[k] || loose && !supported[k] {
			continue
		}
		if !supported[k] {
			return nil, &SchemaError{Path: path, Keyword: k, Msg: "not supported"}
		}
		used = append(used, k)
	}
	sort.Strings(used)
	return used, nil
}

// literalSchema compiles const or enum, which may stand beside type alone.
func (c *compiler) literalSchema(s map[string]any, used, types []string, path string) (*node, error) {
	_, hasConst := s["const"]
	_, hasEnum := s["enum"]
	k := "enum"
	vals, _ := s["enum"].([]any)
	if hasConst {
		if hasEnum {
			return nil, &SchemaError{Path: path, Keyword: "const", Msg: "not supported beside \"enum\""}
		}
		k, vals = "const", []any{s["const"]}
	} else if _, ok := s["enum"].([]any); !ok || len(vals) == 0 {
		return nil, &SchemaError{Path: path, Keyword: "enum", Msg: "want a non-empty array"}
	}
	for _, u := range used {
		if u != k && u != "type" {
			return nil, &SchemaError{Path: path, Keyword: u, Msg: fmt.Sprintf("not supported beside %q", k)}
		}
	}
	return c.literals(vals, types, path+"/"+k, k)
}

// unionSchema compiles anyOf or oneOf, which must stand alone: a value of any alternative.
func (c *compiler) unionSchema(s map[string]any, used []string, path string, depth int) (*node, error) {
	k := "anyOf"
	if _, ok := s["oneOf"]; ok {
		if _, both := s["anyOf"]; both {
			return nil, &SchemaError{Path: path, Keyword: "oneOf", Msg: "not supported beside \"anyOf\""}
		}
		k = "oneOf"
	}
	for _, u := range used {
		if u != k {
			return nil, &SchemaError{Path: path, Keyword: u, Msg: fmt.Sprintf("not supported beside %q", k)}
		}
	}
	alts, ok := s[k].([]any)
	if !ok || len(alts) == 0 {
		return nil, &SchemaError{Path: path, Keyword: k, Msg: "want a non-empty array of schemas"}
	}
	u := &node{kind: kUnion}
	for i, a := range alts {
		n, err := c.compile(a, fmt.Sprintf("%s/%s/%d", path, k, i), depth+1)
		if err != nil {
			return nil, err
		}
		u.alts = append(u.alts, n)
	}
	if len(u.alts) == 1 {
		return u.alts[0], nil
	}
	if err := u.index(); err != nil {
		return nil, &SchemaError{Path: path, Keyword: k, Msg: err.Error()}
	}
	return u, nil
}

// impliedTypes is the type a schema without one describes by its keywords; nil: any value.
func impliedTypes(has func(string) bool) []string {
	switch {
	case has("properties") || has("required") || has("additionalProperties"):
		return []string{"object"}
	case has("items") || has("minItems") || has("maxItems"):
		return []string{"array"}
	case has("minLength") || has("maxLength"):
		return []string{"string"}
	}
	return nil
}

// typedSchema compiles a value of one of types, each shaped by its keywords.
func (c *compiler) typedSchema(s map[string]any, types []string, path string, depth int) (*node, error) {
	var alts []*node
	for _, t := range types {
		var n *node
		var err error
		switch t {
		case "object":
			n, err = c.object(s, path, depth)
		case "array":
			n, err = c.array(s, path, depth)
		case "string":
			n = &node{kind: kString, maxLen: -1}
			if n.minLen, err = count(s, "minLength", path, 0); err == nil {
				n.maxLen, err = count(s, "maxLength", path, -1)
			}
			if err == nil && n.maxLen >= 0 && n.minLen > n.maxLen {
				err = &SchemaError{Path: path, Keyword: "minLength", Msg: "above maxLength"}
			}
		case "number":
			n = &node{kind: kNumber}
		case "integer":
			n = &node{kind: kInteger}
		case "boolean":
			n = &node{kind: kLiteral, lits: []string{"false", "true"}}
		case "null":
			n = &node{kind: kLiteral, lits: []string{"null"}}
		}
		if err != nil {
			return nil, err
		}
		alts = append(alts, n)
	}
	if len(alts) == 1 {
		return alts[0], nil
	}
	u := &node{kind: kUnion, alts: alts}
	if err := u.index(); err != nil {
		return nil, &SchemaError{Path: path, Keyword: "type", Msg: err.Error()}
	}
	return u, nil
}

var typeNames = []string{"object", "array", "string", "number", "integer", "boolean", "null"}

// schemaTypes reads type: nil when absent.
func schemaTypes(s map[string]any, path string) ([]string, error) {
	t, ok := s["type"]
	if !ok {
		return nil, nil
	}
	var ts []string
	switch t := t.(type) {
	case string:
		ts = []string{t}
	case []any:
		for _, x := range t {
			name, ok := x.(string)
			if !ok {
				return nil, &SchemaError{Path: path, Keyword: "type", Msg: "want a type name or an array of them"}
			}
			ts = append(ts, name)
		}
	default:
		return nil, &SchemaError{Path: path, Keyword: "type", Msg: "want a type name or an array of them"}
	}
	if len(ts) == 0 {
		return nil, &SchemaError{Path: path, Keyword: "type", Msg: "an empty list of types allows no value"}
	}
	for _, name := range ts {
		if !slices.Contains(typeNames, name) {
			return nil, &SchemaError{Path: path, Keyword: "type", Msg: fmt.Sprintf("unknown type %q", name)}
		}
	}
	// integer is a number: both would start alike.
	if slices.Contains(ts, "number") {
		ts = slices.DeleteFunc(ts, func(x string) bool { return x == "integer" })
	}
	slices.Sort(ts)
	return slices.Compact(ts), nil
}

// count reads a non-negative integer keyword; def when absent.
func count(s map[string]any, k, path string, def int) (int, error) {
	v, ok := s[k]
	if !ok {
		return def, nil
	}
	n, ok := v.(json.Number)
	if !ok {
		return 0, &SchemaError{Path: path, Keyword: k, Msg: "want a non-negative integer"}
	}
	i, err := n.Int64()
	if err != nil || i < 0 || i > 1<<30 {
		return 0, &SchemaError{Path: path, Keyword: k, Msg: fmt.Sprintf("%s: want a non-negative integer up to 2^30", n)}
	}
	return int(i), nil
}

func (c *compiler) object(s map[string]any, path string, depth int) (*node, error) {
	n := &node{kind: kObject}
	props := map[string]any{}
	if p, ok := s["properties"]; ok {
		if props, ok = p.(map[string]any); !ok {
			return nil, &SchemaError{Path: path, Keyword: "properties", Msg: "want an object of schemas"}
		}
	}
	if len(props) > MaxProperties {
		return nil, &SchemaError{Path: path, Keyword: "properties", Msg: fmt.Sprintf("%d properties: at most %d are supported", len(props), MaxProperties)}
	}
	names := make([]string, 0, len(props))
	for name := range props {
		names = append(names, name)
	}
	// Sorted by encoding, which the key matcher walks.
	enc := make(map[string]string, len(names))
	for _, name := range names {
		enc[name] = encodeString(name)
	}
	sort.Slice(names, func(i, j int) bool { return enc[names[i]] < enc[names[j]] })
	for _, name := range names {
		p, err := c.compile(props[name], path+"/properties/"+pointerEscape(name), depth+1)
		if err != nil {
			return nil, err
		}
		n.keys = append(n.keys, enc[name])
		n.props = append(n.props, p)
	}
	if r, ok := s["required"]; ok {
		req, ok := r.([]any)
		if !ok {
			return nil, &SchemaError{Path: path, Keyword: "required", Msg: "want an array of property names"}
		}
		for _, x := range req {
			name, ok := x.(string)
			if !ok {
				return nil, &SchemaError{Path: path, Keyword: "required", Msg: "want an array of property names"}
			}
			i := slices.Index(names, name)
			if i < 0 {
				return nil, &SchemaError{Path: path, Keyword: "required", Msg: fmt.Sprintf("property %q is not declared in properties", name)}
			}
			n.required |= 1 << i
		}
	}
	ap, hasAP := s["additionalProperties"]
	if len(names) == 0 {
		switch ap := ap.(type) {
		case bool:
			if ap {
				n.extra = anyValue
			}
		case nil:
			if hasAP {
				return nil, &SchemaError{Path: path, Keyword: "additionalProperties", Msg: "want a boolean or a schema"}
			}
			n.extra = anyValue
		default:
			x, err := c.compile(ap, path+"/additionalProperties", depth+1)
			if err != nil {
				return nil, err
			}
			n.extra = x
		}
	} else if hasAP {
		// Only the declared properties are generated, which any additionalProperties
		// allows; its schema is still checked.
		if _, ok := ap.(bool); !ok {
			if _, err := c.compile(ap, path+"/additionalProperties", depth+1); err != nil {
				return nil, err
			}
		}
	}
	return n, nil
}

func (c *compiler) array(s map[string]any, path string, depth int) (*node, error) {
	n := &node{kind: kArray, items: anyValue, maxItems: -1}
	if it, ok := s["items"]; ok {
		if _, tuple := it.([]any); tuple {
			return nil, &SchemaError{Path: path, Keyword: "items", Msg: "an array of schemas (a tuple) is not supported"}
		}
		x, err := c.compile(it, path+"/items", depth+1)
		if err != nil {
			return nil, err
		}
		n.items = x
	}
	var err error
	if n.minItems, err = count(s, "minItems", path, 0); err != nil {
		return nil, err
	}
	if n.maxItems, err = count(s, "maxItems", path, -1); err != nil {
		return nil, err
	}
	if n.maxItems >= 0 && n.minItems > n.maxItems {
		return nil, &SchemaError{Path: path, Keyword: "minItems", Msg: "above maxItems"}
	}
	return n, nil
}

// literals compiles enum or const values, keeping those of the schema's types.
func (c *compiler) literals(vals []any, types []string, path, k string) (*node, error) {
	if len(vals) > maxLiterals {
		return nil, &SchemaError{Path: path, Keyword: k, Msg: fmt.Sprintf("%d values: at most %d are supported", len(vals), maxLiterals)}
	}
	n := &node{kind: kLiteral}
	for _, v := range vals {
		if types != nil && !slices.ContainsFunc(types, func(t string) bool { return hasType(v, t) }) {
			continue
		}
		e, err := encodeValue(v)
		if err != nil {
			return nil, &SchemaError{Path: path, Keyword: k, Msg: err.Error()}
		}
		if c.litBytes += len(e); c.litBytes > maxLiteralBytes {
			return nil, &SchemaError{Path: path, Keyword: k, Msg: fmt.Sprintf("values longer than %d bytes together", maxLiteralBytes)}
		}
		n.lits = append(n.lits, e)
	}
	if len(n.lits) == 0 {
		return nil, &SchemaError{Path: path, Keyword: k, Msg: "no value of the schema's type"}
	}
	slices.Sort(n.lits)
	n.lits = slices.Compact(n.lits)
	return n, nil
}

// hasType says whether a decoded value (numbers as json.Number) is of JSON Schema type t.
func hasType(v any, t string) bool {
	switch v := v.(type) {
	case map[string]any:
		return t == "object"
	case []any:
		return t == "array"
	case string:
		return t == "string"
	case bool:
		return t == "boolean"
	case nil:
		return t == "null"
	case json.Number:
		if t == "number" {
			return true
		}
		f, err := v.Float64()
		return t == "integer" && err == nil && f == float64(int64(f))
	}
	return false
}

// encodeValue is v's compact encoding, keys sorted, HTML characters unescaped: the one text
// the recognizer accepts for an enum or const value.
func encodeValue(v any) (string, error) {
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	if err := e.Encode(v); err != nil {
		return "", err
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}

// encodeString is the JSON encoding of s between its quotes.
func encodeString(s string) string {
	e, _ := encodeValue(s) // a string always encodes
	return e[1 : len(e)-1]
}

func pointerEscape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// index builds a union's dispatch on the first byte of a value, and refuses alternatives
// that a first byte cannot tell apart.
func (u *node) index() error {
	u.first = new([256]uint8)
	for i, a := range u.alts {
		if len(u.alts) > 255 {
			return fmt.Errorf("more than 255 alternatives")
		}
		var fb [4]uint64
		a.firstBytes(&fb, 0)
		for b := range 256 {
			if fb[b/64]&(1<<(b%64)) == 0 {
				continue
			}
			if j := u.first[b]; j != 0 {
				return fmt.Errorf("alternatives %d and %d both allow a value starting with %q: alternatives must differ in type (or in their values' first byte)", j-1, i, rune(b))
			}
			u.first[b] = uint8(i + 1)
		}
	}
	return nil
}

// firstBytes adds the bytes a value of n can start with to fb.
func (n *node) firstBytes(fb *[4]uint64, depth int) {
	set := func(b byte) { fb[b/64] |= 1 << (b % 64) }
	switch n.kind {
	case kObject:
		set('{')
	case kArray:
		set('[')
	case kString:
		set('"')
	case kNumber, kInteger:
		set('-')
		for b := byte('0'); b <= '9'; b++ {
			set(b)
		}
	case kLiteral:
		for _, l := range n.lits {
			set(l[0])
		}
	case kUnion:
		if depth > maxSchemaDepth {
			return
		}
		for _, a := range n.alts {
			a.firstBytes(fb, depth+1)
		}
	}
}
