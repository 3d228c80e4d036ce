package engine_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/grammar"
	"github.com/commit-run/commit-run/toolcall"
)

// TestLazyGrammar: a grammar with a trigger leaves the answer free until the trigger is
// written (the same tokens as with no grammar), then holds it from the trigger's start: what
// follows is the grammar's, and generation ends when it is whole.
func TestLazyGrammar(t *testing.T) {
	m, err := engine.Open(bundled, engine.Options{Threads: 2, ContextLength: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ids, err := m.ChatTokens([]engine.Message{{Role: "user", Content: "Tell me of the old prince."}})
	if err != nil {
		t.Fatal(err)
	}
	gen := func(o engine.GenerateOptions) engine.Result {
		s, err := m.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		o.Sampler = engine.SamplerOptions{Greedy: true}
		res, err := s.Generate(context.Background(), ids, o)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	free := gen(engine.GenerateOptions{MaxTokens: 12})
	// The trigger: a word the free answer writes after its first tokens.
	words := strings.Fields(free.Text)
	if len(words) < 4 {
		t.Fatalf("free answer %q: too short to find a trigger in", free.Text)
	}
	trigger := words[2]
	at := strings.Index(free.Text, trigger)
	g, err := grammar.Text("trigger then an object", grammar.Lit(trigger+" "), grammar.Value([]byte(`{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}`)))
	if err != nil {
		t.Fatal(err)
	}
	lazy := gen(engine.GenerateOptions{MaxTokens: 80, Grammar: g, GrammarTrigger: trigger})
	if !strings.HasPrefix(lazy.Text, free.Text[:at]) {
		t.Fatalf("before the trigger: %q, the free answer %q", lazy.Text, free.Text[:at])
	}
	rest := lazy.Text[at:]
	if !g.Match([]byte(rest)) || lazy.Reason != engine.StopGrammar {
		t.Fatalf("from the trigger: %q (%s), not the grammar's whole value", rest, lazy.Reason)
	}
	var v struct{ N *int }
	if json.Unmarshal([]byte(strings.TrimPrefix(rest, trigger+" ")), &v) != nil || v.N == nil {
		t.Errorf("the object %q", rest)
	}
	// A trigger never written leaves the whole answer free.
	never := gen(engine.GenerateOptions{MaxTokens: 12, Grammar: g, GrammarTrigger: "<never written>"})
	if never.Text != free.Text {
		t.Errorf("an unwritten trigger: %q, free %q", never.Text, free.Text)
	}
}

// TestToolGrammarChoice: which grammar each tool_choice generates under, by format.
func TestToolGrammarChoice(t *testing.T) {
	m, err := engine.Open(bundled, engine.Options{Threads: 2, ContextLength: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tools := []engine.Tool{{Name: "f", Parameters: json.RawMessage(`{"type": "object"}`)}}
	if m.ToolFormat().Name() != "generic" {
		t.Fatalf("the bundled model's format %s, want generic", m.ToolFormat().Name())
	}
	for _, c := range []struct {
		choice  engine.ToolChoice
		grammar bool
	}{
		{engine.ToolChoice{Mode: toolcall.Auto}, true}, // the generic format holds every answer
		{engine.ToolChoice{Mode: toolcall.None}, false},
		{engine.ToolChoice{Mode: toolcall.Required}, true},
		{engine.ToolChoice{Mode: toolcall.Named, Name: "f"}, true},
	} {
		g, trigger, err := m.ToolGrammar(engine.ChatOptions{Tools: tools, Choice: c.choice})
		if err != nil || (g != nil) != c.grammar || trigger != "" {
			t.Errorf("%+v: grammar %v, trigger %q, %v", c.choice, g, trigger, err)
		}
	}
	if _, _, err := m.ToolGrammar(engine.ChatOptions{Tools: tools, Choice: engine.ToolChoice{Mode: toolcall.Named, Name: "g"}}); err == nil {
		t.Error("a named function that is not a tool")
	}
}
