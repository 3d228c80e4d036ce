package grammar

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// testSchema holds every keyword Compile supports.
const testSchema = `{
  "type": "object",
  "title": "a person",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 8},
    "age": {"type": "integer"},
    "score": {"type": ["number", "null"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "minItems": 1, "maxItems": 2},
    "kind": {"enum": ["cat", "dog", 12, [1, 2]]},
    "ok": {"type": "boolean"},
    "v": {"const": "x"},
    "any": {},
    "alt": {"anyOf": [{"type": "string"}, {"type": "object", "additionalProperties": {"type": "integer"}}]}
  },
  "required": ["name", "age"],
  "additionalProperties": false
}`

func TestMatch(t *testing.T) {
	schema, err := Compile([]byte(testSchema))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		g    *Grammar
		text string
		want bool
	}{
		{JSON(), `{"a": [1, -2.5e+3, true, null, "x\u00e9\n"]}`, true},
		{JSON(), ` 0`, true},
		{JSON(), `-0.0E-1`, true},
		{JSON(), `01`, false},
		{JSON(), `1.`, false},
		{JSON(), `{"a":1,}`, false},
		{JSON(), `[1 2]`, false},
		{JSON(), `"\ud800"`, false},         // a surrogate escape: refused
		{JSON(), "\"\xff\"", false},         // invalid UTF-8
		{JSON(), "\"\xed\xa0\x80\"", false}, // an encoded surrogate
		{JSON(), "\"tab\there\"", false},    // a control character
		{JSON(), `{}` + " ", false},         // nothing follows the value
		{JSON(), "\n1", true},
		{JSON(), "\n 1", false}, // no indentation outside a container
		{JSON(), "[[\n" + strings.Repeat(" ", 2*IndentPerLevel) + "1]]", true},
		{JSON(), "[[\n" + strings.Repeat(" ", 2*IndentPerLevel+1) + "1]]", false},
		{JSON(), strings.Repeat("[", 10) + "\n" + strings.Repeat("\t", MaxIndent) + "1" + strings.Repeat("]", 10), true},
		{JSON(), strings.Repeat("[", 10) + "\n" + strings.Repeat("\t", MaxIndent+1) + "1" + strings.Repeat("]", 10), false},
		{JSON(), "[1,\n\t 2]", true},
		{JSON(), "[1, \n2]", false}, // the newline first
		{JSON(), "[1,\n\n2]", false},
		{JSON(), "[1,  2]", false},
		{JSON(), "[1,\r\n2]", false},
		{JSON(), strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth), true},
		{JSON(), strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1), false},
		{JSON(), strings.Repeat("9", MaxIntDigits), true},
		{JSON(), strings.Repeat("9", MaxIntDigits+1), false},
		{JSONObject(), `{"k": {"n": []}, "k": 1}`, true},
		{JSONObject(), `[]`, false},
		{schema, `{"name": "Ann", "age": 3}`, true},
		{schema, `{"age": 3, "name": "Ann"}`, true},
		{schema, `{"name": "Ann"}`, false},                       // age is required
		{schema, `{"name": "", "age": 3}`, false},                // minLength
		{schema, `{"name": "Annabelle", "age": 3}`, false},       // maxLength
		{schema, `{"name": "é", "age": 3}`, true},                // a character, two bytes
		{schema, `{"name": "A", "age": 3, "name": "B"}`, false},  // twice
		{schema, `{"name": "A", "age": 3.5}`, false},             // integer
		{schema, `{"name": "A", "age": 3, "x": 1}`, false},       // undeclared
		{schema, `{"name": "A", "age": 3, "score": null}`, true}, // type list
		{schema, `{"name": "A", "age": 3, "score": 1.5}`, true},
		{schema, `{"name": "A", "age": 3, "tags": []}`, false}, // minItems
		{schema, `{"name": "A", "age": 3, "tags": ["a", "b"]}`, true},
		{schema, `{"name": "A", "age": 3, "tags": ["a", "b", "c"]}`, false}, // maxItems
		{schema, `{"name": "A", "age": 3, "tags": ["abcd"]}`, false},
		{schema, `{"name": "A", "age": 3, "kind": "dog"}`, true},
		{schema, `{"name": "A", "age": 3, "kind": "do"}`, false},
		{schema, `{"name": "A", "age": 3, "kind": 12}`, true},
		{schema, `{"name": "A", "age": 3, "kind": 1}`, false},
		{schema, `{"name": "A", "age": 3, "kind": [1,2]}`, true},
		{schema, `{"name": "A", "age": 3, "kind": [1, 2]}`, false}, // only the compact encoding
		{schema, `{"name": "A", "age": 3, "ok": false, "v": "x"}`, true},
		{schema, `{"name": "A", "age": 3, "v": "y"}`, false},
		{schema, `{"name": "A", "age": 3, "any": {"z": [null]}}`, true},
		{schema, `{"name": "A", "age": 3, "alt": "s"}`, true},
		{schema, `{"name": "A", "age": 3, "alt": {"q": 1}}`, true},
		{schema, `{"name": "A", "age": 3, "alt": {"q": "1"}}`, false},
		{schema, `{"name": "A", "age": 3, "alt": 1}`, false},
	}
	for _, c := range cases {
		if got := c.g.Match([]byte(c.text)); got != c.want {
			t.Errorf("%s: Match(%q) = %v, want %v", c.g, c.text, got, c.want)
		}
	}
}

// TestPrefix: Feed refuses a byte without changing the state, and a number is complete before
// the byte that ends it.
func TestPrefix(t *testing.T) {
	r := JSON().Recognizer()
	if !r.Feed([]byte(`[12`)) || r.Feed([]byte(`x`)) || !r.Feed([]byte(`]`)) || !r.Done() {
		t.Fatal("[12 x ]: want the x refused and the array whole")
	}
	r = JSON().Recognizer()
	if !r.Feed([]byte(`12`)) || !r.Complete() || r.Done() {
		t.Fatal("12: want complete, not done (a digit may follow)")
	}
	r = JSONObject().Recognizer()
	if !r.Feed([]byte(`{"a":1`)) || r.Complete() {
		t.Fatal(`{"a":1: want incomplete`)
	}
}

func TestCompileErrors(t *testing.T) {
	cases := []struct{ schema, keyword string }{
		{`{"type": "integer", "minimum": 0}`, "minimum"},
		{`{"type": "string", "pattern": "a+"}`, "pattern"},
		{`{"$ref": "#/$defs/x"}`, "$ref"},
		{`{"type": "object", "properties": {"a": {"type": "string", "format": "date"}}}`, "format"},
		{`{"anyOf": [{"type": "object"}, {"type": "object", "properties": {"a": {}}}]}`, "anyOf"},
		{`{"type": "string", "items": {}}`, "items"},
		{`{"type": "array", "items": [{}, {}]}`, "items"},
		{`{"type": "array", "minItems": 3, "maxItems": 2}`, "minItems"},
		{`{"type": "object", "properties": {"a": {}}, "required": ["b"]}`, "required"},
		{`{"type": "whatever"}`, "type"},
		{`{"enum": []}`, "enum"},
		{`{"type": "string", "enum": [1]}`, "enum"},
		{`{"allOf": [{}]}`, "allOf"},
	}
	for _, c := range cases {
		_, err := Compile([]byte(c.schema))
		var se *SchemaError
		if !errors.As(err, &se) || se.Keyword != c.keyword || !strings.Contains(err.Error(), c.keyword) {
			t.Errorf("%s: got %v, want an error naming %q", c.schema, err, c.keyword)
		}
	}
	for _, bad := range []string{``, `[]`, `false`, `{} {}`,
		strings.Repeat(`{"items":`, 40) + `{}` + strings.Repeat(`}`, 40)} {
		if _, err := Compile([]byte(bad)); err == nil {
			t.Errorf("%.40s: compiled", bad)
		}
	}
}

// --- the fuzz target's reference: encoding/json, a schema check, and the limits ---

// lexicalOK checks what Limits bounds and what the recognizer asks beyond encoding/json:
// valid UTF-8, no surrogate escapes, nothing after the value.
func lexicalOK(text []byte) bool {
	if !utf8.Valid(text) || len(text) > 0 && isWS(text[len(text)-1]) {
		return false
	}
	var gap []byte
	depth := 0
	in, esc := false, 0
	for i := 0; i < len(text); i++ {
		b := text[i]
		if in {
			switch {
			case esc == 1:
				esc = 0
				if b == 'u' && i+2 < len(text) && text[i+1]|0x20 == 'd' && strings.IndexByte("89abAB", text[i+2]) >= 0 {
					return false
				}
			case b == '\\':
				esc = 1
			case b == '"':
				in = false
			}
			continue
		}
		if isWS(b) {
			gap = append(gap, b)
			continue
		}
		if !gapOK(gap, depth) {
			return false
		}
		gap = gap[:0]
		switch {
		case b == '"':
			in = true
		case b == '[' || b == '{':
			if depth++; depth > MaxDepth {
				return false
			}
		case b == ']' || b == '}':
			depth--
		case b == '-' || b >= '0' && b <= '9':
			j := i
			for j < len(text) && strings.IndexByte("+-.eE0123456789", text[j]) >= 0 {
				j++
			}
			num := string(text[i:j])
			num = strings.TrimPrefix(num, "-")
			mant, exp, _ := strings.Cut(strings.ToLower(num), "e")
			ip, fp, _ := strings.Cut(mant, ".")
			exp = strings.TrimLeft(exp, "+-")
			if len(ip) > MaxIntDigits || len(fp) > MaxFracDigits || len(exp) > MaxExpDigits {
				return false
			}
			i = j - 1
		}
	}
	return true
}

// gapOK: nothing, a space or a tab, or a newline and the indentation MaxIndent allows at
// depth.
func gapOK(gap []byte, depth int) bool {
	switch {
	case len(gap) == 0:
		return true
	case gap[0] == '\n':
		return len(gap) <= min(MaxIndent, IndentPerLevel*depth)+1 && len(bytes.Trim(gap[1:], " \t")) == 0
	}
	return len(gap) == 1 && (gap[0] == ' ' || gap[0] == '\t')
}

// valid checks a value against a schema as the recognizer reads it: declared properties
// only, each once; enum and const values in their compact encoding.
func valid(raw json.RawMessage, s any) bool {
	m, ok := s.(map[string]any)
	if !ok {
		return s == true
	}
	raw = bytes.TrimSpace(raw)
	if lits, ok := m["enum"].([]any); ok || m["const"] != nil {
		if !ok {
			lits = []any{m["const"]}
		}
		for _, l := range lits {
			if e, _ := encodeValue(l); e == string(raw) {
				return true
			}
		}
		return false
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		if alts, ok := m[k].([]any); ok {
			n := 0
			for _, a := range alts {
				if valid(raw, a) {
					n++
				}
			}
			return n > 0
		}
	}
	var v any
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if d.Decode(&v) != nil {
		return false
	}
	types, _ := schemaTypes(m, "")
	if types == nil {
		switch {
		case m["properties"] != nil || m["additionalProperties"] != nil:
			types = []string{"object"}
		case m["items"] != nil:
			types = []string{"array"}
		default:
			return true
		}
	}
	if !slices.ContainsFunc(types, func(t string) bool {
		if t == "integer" {
			n, ok := v.(json.Number)
			return ok && !strings.ContainsAny(string(n), ".eE")
		}
		return hasType(v, t) || t == "number" && hasType(v, "integer")
	}) {
		return false
	}
	num := func(k string, def int) int {
		if n, ok := m[k].(json.Number); ok {
			i, _ := n.Int64()
			return int(i)
		}
		return def
	}
	switch v := v.(type) {
	case string:
		n := utf8.RuneCountInString(v)
		return n >= num("minLength", 0) && (num("maxLength", -1) < 0 || n <= num("maxLength", -1))
	case []any:
		var items []json.RawMessage
		json.Unmarshal(raw, &items)
		if len(items) < num("minItems", 0) || num("maxItems", -1) >= 0 && len(items) > num("maxItems", -1) {
			return false
		}
		is, ok := m["items"]
		for _, it := range items {
			if ok && !valid(it, is) {
				return false
			}
		}
	case map[string]any:
		props, _ := m["properties"].(map[string]any)
		d := json.NewDecoder(bytes.NewReader(raw))
		d.Token()
		seen := map[string]bool{}
		for d.More() {
			k, _ := d.Token()
			var sub json.RawMessage
			if d.Decode(&sub) != nil {
				return false
			}
			key := k.(string)
			if len(props) > 0 {
				ps, ok := props[key]
				if !ok || seen[key] || !valid(sub, ps) {
					return false
				}
			} else if ap, ok := m["additionalProperties"]; ok && !valid(sub, ap) {
				return false
			}
			seen[key] = true
		}
		req, _ := m["required"].([]any)
		for _, r := range req {
			if !seen[r.(string)] {
				return false
			}
		}
	}
	return true
}

var fuzzSchemas = []string{
	testSchema,
	`{"type": "array", "items": {"type": "integer"}, "maxItems": 3}`,
	`{"anyOf": [{"type": "null"}, {"type": "number"}, {"enum": ["a", "b", true]}]}`,
	`{"type": "object", "additionalProperties": {"type": "array", "items": {"type": ["string", "boolean"]}}}`,
}

// FuzzMatch: Match accepts exactly what encoding/json, the limits and a schema check accept.
// Escapes are fuzzed against the any-value grammars only, since the schema check compares
// keys decoded where the recognizer compares them encoded.
func FuzzMatch(f *testing.F) {
	for _, s := range []string{`{"name": "Ann", "age": 3, "tags": ["x"]}`, `[1, 2]`, `null`, `{"a": ["s", true]}`,
		`{"a": 1, "b": [1.5e3, "\u00e9"]}`, `"a"`, `1`, `true`} {
		for i := range 6 {
			f.Add([]byte(s), uint8(i))
		}
	}
	var gs []*Grammar
	var schemas []any
	for _, s := range fuzzSchemas {
		g, err := Compile([]byte(s))
		if err != nil {
			f.Fatal(err)
		}
		var v any
		d := json.NewDecoder(strings.NewReader(s))
		d.UseNumber()
		d.Decode(&v)
		gs, schemas = append(gs, g), append(schemas, v)
	}
	f.Fuzz(func(t *testing.T, text []byte, which uint8) {
		var g *Grammar
		want := json.Valid(text) && lexicalOK(text)
		switch i := int(which) % (len(gs) + 2); i {
		case 0:
			g = JSON()
		case 1:
			g = JSONObject()
			want = want && bytes.TrimSpace(text)[0] == '{'
		default:
			if bytes.IndexByte(text, '\\') >= 0 {
				return
			}
			g = gs[i-2]
			want = want && valid(text, schemas[i-2])
		}
		if got := g.Match(text); got != want {
			t.Fatalf("%s (%d): Match(%q) = %v, want %v", g, which, text, got, want)
		}
	})
}
