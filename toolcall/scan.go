package toolcall

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
)

// joinCalls writes each call with format (its name, then its arguments) and sep between.
func joinCalls(calls []Call, format, sep string) string {
	parts := make([]string, len(calls))
	for i, c := range calls {
		parts[i] = fmt.Sprintf(format, c.Name, c.Arguments)
	}
	return strings.Join(parts, sep)
}

// valueEnd finds how far a JSON value written at the start of s goes (leading whitespace
// included): n bytes so far, and whether it is whole. It reads structure only (brackets,
// strings and their escapes), so that the arguments of a call can be given out as they
// stream; whether the value is valid JSON is checked once it is whole.
func valueEnd(s string) (n int, whole bool) {
	i := len(s) - len(strings.TrimLeft(s, " \t\r\n"))
	if i == len(s) {
		return i, false
	}
	switch s[i] {
	case '{', '[', '"':
	default:
		// A scalar ends at the first byte that cannot be in one.
		j := i
		for j < len(s) && strings.IndexByte(",}] \t\r\n", s[j]) < 0 {
			j++
		}
		return j, j < len(s)
	}
	depth, inStr, esc := 0, false, false
	for j := i; j < len(s); j++ {
		c := s[j]
		switch {
		case esc:
			esc = false
		case inStr && c == '\\':
			esc = true
		case c == '"':
			inStr = !inStr
			if !inStr && depth == 0 {
				return j + 1, true
			}
		case inStr:
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			depth--
			if depth == 0 {
				return j + 1, true
			}
		}
	}
	return len(s), false
}

// nameFirst matches the start of a call object that names its function first, as every
// format that writes a JSON call object does: {"name": "f", "arguments": ...
var nameFirst = regexp.MustCompile(`^\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*`)

// callObject reads a JSON call object ({"name": ..., "arguments": ...}; Llama's
// "parameters" too) from the start of s: as far as it goes while it streams, the whole call
// and the bytes it took once whole, or an error when it cannot be one. A call whose name
// has been read stays a call: what was given out of it while it streamed cannot be taken
// back, so a whole object with broken arguments is the call with its arguments as written.
func callObject(s string) (p partial, n int, err error) {
	end, whole := valueEnd(s)
	if whole {
		if c, err := wholeCall(s[:end]); err == nil {
			return c, end, nil
		}
	}
	m := nameFirst.FindStringSubmatch(s)
	if m == nil {
		if whole {
			return p, 0, errNoName
		}
		return p, 0, nil
	}
	if err := json.Unmarshal([]byte(m[1]), &p.name); err != nil || p.name == "" {
		return partial{}, 0, errNoName
	}
	// Arguments stream while they are an object; a string holding JSON waits to be whole.
	rest := s[len(m[0]):]
	if strings.HasPrefix(rest, "{") {
		an, _ := valueEnd(rest)
		p.args = rest[:an]
	}
	if whole {
		p.complete = true
		return p, end, nil
	}
	return p, 0, nil
}

// wholeCall decodes a whole call object.
// Keys are matched exactly, as the model's trainers' Python does (encoding/json's structs
// would take "NAME" for "name").
func wholeCall(s string) (partial, error) {
	var c map[string]json.RawMessage
	if err := json.Unmarshal([]byte(s), &c); err != nil {
		return partial{}, err
	}
	var name string
	if err := json.Unmarshal(c["name"], &name); err != nil || name == "" {
		return partial{}, errNoName
	}
	args, err := argumentsText(c["arguments"], c["parameters"])
	if err != nil {
		return partial{}, err
	}
	return partial{name: name, args: args, complete: true}, nil
}

// argumentsText is a call's arguments as JSON text: the object as written, or the JSON a
// string holds (some models quote their arguments); no arguments are {}.
func argumentsText(args, params json.RawMessage) (string, error) {
	raw := args
	if raw == nil {
		raw = params
	}
	raw = json.RawMessage(strings.TrimSpace(string(raw)))
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return "{}", nil
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", err
		}
		if !json.Valid([]byte(s)) {
			return "", errArguments
		}
		return s, nil
	case raw[0] != '{':
		return "", errArguments
	}
	return string(raw), nil
}

type parseError string

func (e parseError) Error() string { return string(e) }

const (
	errNoName    = parseError("a call without a function name")
	errArguments = parseError("a call's arguments are not a JSON object")
)

// streamed is what of a call's arguments text may be given out before it is whole: an
// object's text as it grows; anything else waits.
func streamed(args string) string {
	args = strings.TrimLeft(args, " \t\r\n")
	if strings.HasPrefix(args, "{") {
		return args
	}
	return ""
}

// finalArgs is a whole call's arguments: as argumentsText reads them, or as written where they
// are broken (the call has been given out by its name already).
func finalArgs(args string) string {
	if a, err := argumentsText([]byte(args), nil); err == nil {
		return a
	}
	return strings.TrimLeft(args, " \t\r\n")
}

// callArray reads a JSON array of call objects in text from at, just after its '[': the
// calls read so far, and where the list ends once it does (0 while open): after its ']'
// (closed), or before a call that breaks it after others were read (those given out stand,
// the rest is text). A call that breaks it first is an error.
func callArray(text string, at int) (calls []partial, end int, closed bool, err error) {
	for {
		item := strings.TrimLeft(text[at:], " \t\r\n,")
		if strings.HasPrefix(item, "]") {
			return calls, len(text) - len(item) + 1, true, nil
		}
		c, n, err := callObject(item)
		if err != nil && len(calls) > 0 {
			return calls, at, false, nil
		}
		if err != nil {
			return nil, 0, false, err
		}
		if c.name != "" {
			calls = append(calls, c)
		}
		if n == 0 {
			return calls, 0, false, nil
		}
		at = len(text) - len(item) + n
	}
}
