package grammar

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

const (
	weatherSchema = `{"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}`
	addSchema     = `{"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}`
)

// hermesCalls is the grammar of Qwen's tool calls to get_weather, add and get (any object):
// one or more, a newline between.
func hermesCalls(t testing.TB, max int) *Grammar {
	t.Helper()
	call := func(name string, args Part) Alt {
		return Alt{Lit: name + `", "arguments": `, Then: []Part{args, Lit("}\n</tool_call>")}}
	}
	g, err := Text("tool calls", Repeat(1, max, "\n",
		Lit("<tool_call>\n{\"name\": \""),
		OneOf(call("get_weather", Value([]byte(weatherSchema))), call("add", Value([]byte(addSchema))), call("get", AnyObject()))))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

var hermesRe = regexp.MustCompile(`(?s)^<tool_call>\n\{"name": "(get_weather|add|get)", "arguments": (.*)\}\n</tool_call>$`)

// hermesValid is the reference: the calls split at their markers, each name known and its
// arguments valid JSON of the name's schema, as the recognizer reads JSON (lexicalOK, valid).
func hermesValid(text string, max int) bool {
	calls := strings.Split(text, "</tool_call>\n<tool_call>")
	if max >= 0 && len(calls) > max {
		return false
	}
	schemas := map[string]string{"get_weather": weatherSchema, "add": addSchema, "get": `{"type": "object"}`}
	for i, c := range calls {
		if i > 0 {
			c = "<tool_call>" + c
		}
		if i < len(calls)-1 {
			c += "</tool_call>"
		}
		m := hermesRe.FindStringSubmatch(c)
		if m == nil {
			return false
		}
		args := []byte(m[2])
		if !json.Valid(args) || !lexicalOK(args) || args[0] != '{' {
			return false
		}
		var s any
		d := json.NewDecoder(strings.NewReader(schemas[m[1]]))
		d.UseNumber()
		d.Decode(&s)
		if !valid(args, s) {
			return false
		}
	}
	return true
}

func TestTextMatch(t *testing.T) {
	g := hermesCalls(t, 2)
	one := "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
	two := one + "\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"b\": 2, \"a\": 1.5}}\n</tool_call>"
	anyArgs := "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"x\": [1, {}]}}\n</tool_call>"
	for _, c := range []struct {
		text string
		want bool
	}{
		{one, true},
		{two, true},
		{anyArgs, true},
		{two + "\n" + one, false}, // three calls, two at most
		{one + "\n", false},
		{one[:len(one)-1], false},
		{strings.Replace(one, "Paris", "Paris\", \"unit\": \"k", 1), false},
		{strings.Replace(one, `{"city": "Paris"}`, `{}`, 1), false}, // city is required
		{strings.Replace(one, "get_weather", "get_weathe", 1), false},
		{strings.Replace(one, "get_weather", "set", 1), false},
		{strings.Replace(one, `"arguments": {`, `"arguments":{`, 1), false}, // the format's text is exact
		{strings.Replace(one, `{"city"`, `{ "city"`, 1), true},              // JSON's own whitespace is free
		{" " + one, true},
		{"", false},
	} {
		if got := g.Match([]byte(c.text)); got != c.want {
			t.Errorf("Match(%q) = %v, want %v", c.text, got, c.want)
		}
		if ref := hermesValid(strings.TrimLeft(c.text, " "), 2); ref != c.want {
			t.Errorf("reference(%q) = %v, want %v", c.text, ref, c.want)
		}
	}
	// Every prefix of a whole text is accepted, and only the whole is complete; a text
	// that reached its last call's end is done.
	r := g.Recognizer()
	for i := range len(two) {
		if !r.Feed([]byte{two[i]}) {
			t.Fatalf("prefix %q refused", two[:i+1])
		}
		if r.Complete() != (i == len(one)-1 || i == len(two)-1) {
			t.Fatalf("prefix %q: Complete %v", two[:i+1], r.Complete())
		}
	}
	if !r.Done() {
		t.Error("two calls of two at most: not done")
	}
}

func TestTextErrors(t *testing.T) {
	for _, c := range []struct {
		name  string
		parts []Part
	}{
		{"empty", nil},
		{"empty literal", []Part{Lit("")}},
		{"prefix alternatives", []Part{OneOf(Alt{Lit: "get", Then: []Part{Lit("x")}}, Alt{Lit: "get_x", Then: []Part{Lit("y")}})}},
		{"no alternatives", []Part{OneOf()}},
		{"empty continuation", []Part{OneOf(Alt{Lit: "a"})}},
		{"no separator", []Part{Repeat(1, 2, "", Lit("a"))}},
		{"min 0", []Part{Repeat(0, 2, ",", Lit("a"))}},
		{"bad schema", []Part{Value([]byte(`{"type": "object", "patternProperties": {}}`))}},
		{"zero part", []Part{{}}},
	} {
		if _, err := Text(c.name, c.parts...); err == nil {
			t.Errorf("%s: compiled", c.name)
		}
	}
}

// TestTextMatcher: held to a tool-call grammar, random walks over a vocabulary with the
// markers as special markup tokens end in calls the reference accepts, and the markers are
// allowed as one token where the format writes them, never inside a JSON string.
func TestTextMatcher(t *testing.T) {
	pieces, _ := testVocab()
	pieces = append(pieces, "<tool_call>", "</tool_call>", "<think>")
	call, end, think := int32(len(pieces)-3), int32(len(pieces)-2), int32(len(pieces)-1)
	v := NewVocab(pieces, func(id int32) bool { return id == 0 || id >= call }, []int32{1},
		Markup(func(id int32) bool { return id == call || id == end }))
	g := hermesCalls(t, -1)
	sawMarker := false
	for seed := range 30 {
		rng := rand.New(rand.NewPCG(uint64(seed), 7))
		m := NewMatcher(v, g)
		var text []byte
		logits := make([]float32, len(pieces))
		for step := 0; !m.Done(); step++ {
			if step > 3000 {
				t.Fatalf("seed %d: no end after 3000 tokens: %q", seed, text)
			}
			clear(logits)
			if !m.Mask(logits) {
				t.Fatalf("seed %d: no token allowed after %q", seed, text)
			}
			if !math.IsInf(float64(logits[think]), -1) || !math.IsInf(float64(logits[0]), -1) {
				t.Fatalf("seed %d: a special token that is not markup allowed after %q", seed, text)
			}
			inString := m.r.stack[len(m.r.stack)-1].kind == fString
			var allowed []int32
			for id := range pieces {
				if !math.IsInf(float64(logits[id]), -1) {
					allowed = append(allowed, int32(id))
					if (int32(id) == call || int32(id) == end) && inString {
						t.Fatalf("seed %d: marker allowed inside a string after %q", seed, text)
					}
				}
			}
			id := allowed[rng.IntN(len(allowed))]
			if step > 40 {
				for _, a := range allowed {
					if a == 1 || a == end || strings.ContainsAny(pieces[a], "}]\"") && rng.IntN(2) == 0 {
						id = a
					}
				}
			}
			sawMarker = sawMarker || id == call || id == end
			m.Accept(id)
			if err := m.Err(); err != nil {
				t.Fatal(err)
			}
			if id != 1 {
				text = append(text, pieces[id]...)
			}
		}
		if !g.Match(text) || !hermesValid(strings.TrimLeft(string(text), " \n\t"), -1) {
			t.Fatalf("seed %d: ended with %q, which does not match", seed, text)
		}
	}
	if !sawMarker {
		t.Error("no walk wrote a marker as its one token")
	}
}

// FuzzText: a text grammar accepts exactly what the reference does.
func FuzzText(f *testing.F) {
	one := "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
	for _, s := range []string{one, one + "\n" + one, strings.Replace(one, "Paris", "é", 1),
		"<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": -2e3}}\n</tool_call>",
		"<tool_call>\n{\"name\": \"get\", \"arguments\": {\"k\": [true, null]}}\n</tool_call>"} {
		f.Add([]byte(s))
	}
	g := hermesCalls(f, 3)
	f.Fuzz(func(t *testing.T, text []byte) {
		if strings.ContainsRune(string(text), '\\') || len(text) > 0 && strings.ContainsRune(" \t\n\r", rune(text[0])) {
			return // escapes: see FuzzMatch; leading whitespace: the top frame's, tested there
		}
		if got, want := g.Match(text), hermesValid(string(text), 3); got != want {
			t.Fatalf("Match(%q) = %v, reference %v", text, got, want)
		}
	})
}

// xmlCall is Qwen3-Coder's call of get_weather (parameters city and unit, any order, each
// once or more) and of ping (none).
func xmlCall(t testing.TB) *Grammar {
	t.Helper()
	param := func(k string) Alt {
		return Alt{Lit: "<parameter=" + k + ">\n", Then: []Part{Until("\n</parameter>\n", 40)}}
	}
	end := "</function>\n</tool_call>"
	g, err := Text("XML call", Lit("<tool_call>\n<function="), OneOf(
		Alt{Lit: "get_weather>\n", Then: []Part{Loop(end, param("city"), param("unit"))}},
		Alt{Lit: "ping>\n", Then: []Part{Loop(end)}}))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestTextLoopUntil(t *testing.T) {
	g := xmlCall(t)
	call := "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York, \"NY\" </par\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>"
	for _, c := range []struct {
		text string
		want bool
	}{
		{call, true},
		{"<tool_call>\n<function=ping>\n</function>\n</tool_call>", true},
		{"<tool_call>\n<function=get_weather>\n</function>\n</tool_call>", true},
		{strings.Replace(call, "city", "town", 1), false},
		{strings.Replace(call, "New York", "Zürich\xff", 1), false},            // not UTF-8
		{strings.Replace(call, "New York", strings.Repeat("x", 40), 1), false}, // past 40 bytes
		{strings.Replace(call, "New York", "日本", 1), true},
		{strings.Replace(call, "<parameter=unit>", "<parameter=city>", 1), false}, // each at most once
		{call[:len(call)-1], false},
	} {
		if got := g.Match([]byte(c.text)); got != c.want {
			t.Errorf("Match(%q) = %v, want %v", c.text, got, c.want)
		}
	}
	// The value ends at the delimiter's first whole occurrence, even one that overlaps a
	// false start ("\n</par\n</parameter>\n").
	r := g.Recognizer()
	if !r.Feed([]byte(call)) || !r.Done() {
		t.Errorf("the call is not done: %v", r.Complete())
	}
	for _, bad := range []string{"", "é"} {
		if _, err := Text("x", Until(bad, 10)); err == nil {
			t.Errorf("Until(%q) compiled", bad)
		}
	}
	if _, err := Text("x", Loop("end", Alt{Lit: "e", Then: []Part{Lit("x")}})); err == nil {
		t.Error("a loop whose end starts with an alternative compiled")
	}
}

// TestLoopUntilMatcher: random walks over a vocabulary held to the XML call grammar end in
// texts it matches, the tokens allowed at each step exactly those the recognizer takes (the
// fast path for raw text included).
func TestLoopUntilMatcher(t *testing.T) {
	pieces, v := testVocab()
	g := xmlCall(t)
	for seed := range 20 {
		rng := rand.New(rand.NewPCG(uint64(seed), 11))
		m := NewMatcher(v, g)
		var text []byte
		logits := make([]float32, len(pieces))
		for step := 0; !m.Done(); step++ {
			if step > 4000 {
				t.Fatalf("seed %d: no end: %q", seed, text)
			}
			clear(logits)
			if !m.Mask(logits) {
				t.Fatalf("seed %d: no token after %q", seed, text)
			}
			var allowed []int32
			for id := range pieces {
				ok := !math.IsInf(float64(logits[id]), -1)
				want := false
				switch {
				case id == 0 || pieces[id] == "":
				case id == 1:
					want = m.r.Complete()
				default:
					want = m.r.Clone().Feed([]byte(pieces[id]))
				}
				if ok != want {
					t.Fatalf("seed %d: %q allowed %v after %q, the recognizer says %v", seed, pieces[id], ok, text, want)
				}
				if ok {
					allowed = append(allowed, int32(id))
				}
			}
			id := allowed[rng.IntN(len(allowed))]
			m.Accept(id)
			if err := m.Err(); err != nil {
				t.Fatal(err)
			}
			if id != 1 {
				text = append(text, pieces[id]...)
			}
		}
		if !g.Match(text) {
			t.Fatalf("seed %d: ended with %q", seed, text)
		}
	}
}
