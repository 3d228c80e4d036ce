package tokenizer

import (
	"fmt"
	"reflect"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/exec"
)

// Where gonja differs from the Jinja that Hugging Face renders chat templates with, on what
// real templates do: dicts keep their keys in the order written (the messages, the tools
// and the arguments come in as gonja's ordered Dict, see orderedJSON), where gonja's dict
// methods and items filter sort them or see none; a list's first item is its [-len] (gonja
// v2.9.1 finds no item there, so that Mistral's templates, which look for
// user_messages[-1], never see the first turn's user message); and tojson is Python's
// json.dumps.

// pyList is a list as templates index it: from the end too, down to the first item.
type pyList []any

// GetItem is gonja's item access for pyList.
func (l pyList) GetItem(key any) (*exec.Value, bool) {
	v := reflect.ValueOf(key)
	if !v.CanInt() {
		return exec.AsValue(nil), false
	}
	i := int(v.Int())
	if i < 0 {
		i += len(l)
	}
	if i < 0 || i >= len(l) {
		return exec.AsValue(nil), false
	}
	return exec.ToValue(l[i]), true
}

// hfFilters are gonja's filters with tojson and items as Hugging Face's Jinja has them.
func hfFilters() *exec.FilterSet {
	filters := exec.NewFilterSet(map[string]exec.FilterFunction{}).Update(builtins.Filters)
	for name, f := range map[string]exec.FilterFunction{"tojson": filterToJSON, "items": filterItems, "list": filterList} {
		if err := filters.Replace(name, f); err != nil {
			panic(err) // a gonja without the filter: not the gonja this code was built on
		}
	}
	return filters
}

// hfMethods are gonja's methods with a dict's keys, values, items and get in its order.
func hfMethods() exec.Methods {
	m := builtins.Methods
	ordered := map[string]func(pairs []*exec.Pair, args *exec.VarArgs) (any, error){
		"keys":   dictKeys,
		"values": dictValues,
		"items":  dictItems,
		"get":    dictGet,
	}
	set := map[string]exec.Method[map[string]any]{}
	for _, name := range []string{"keys", "values", "items", "get", "pop", "setdefault", "update", "copy", "clear"} {
		builtin, ok := builtins.Methods.Dict.Get(name)
		if !ok {
			continue
		}
		own := ordered[name]
		set[name] = func(self map[string]any, v *exec.Value, args *exec.VarArgs) (any, error) {
			if d := asDict(v); d != nil && own != nil {
				return own(d.Pairs, args)
			}
			return builtin(self, v, args)
		}
	}
	m.Dict = exec.NewMethodSet(set)
	// The lists a string's methods make are pyLists too: Qwen's templates take
	// content.split('</think>')[-1] of a content with no </think>, a list of one.
	strs := map[string]exec.Method[string]{}
	for _, name := range []string{"split", "rsplit", "splitlines", "partition", "rpartition"} {
		builtin, ok := builtins.Methods.Str.Get(name)
		if !ok {
			continue
		}
		set := builtin
		strs[name] = func(self string, v *exec.Value, args *exec.VarArgs) (any, error) {
			out, err := set(self, v, args)
			return asPyList(out), err
		}
	}
	for _, name := range strMethods {
		if _, ok := strs[name]; !ok {
			if builtin, ok := builtins.Methods.Str.Get(name); ok {
				strs[name] = builtin
			}
		}
	}
	m.Str = exec.NewMethodSet(strs)
	return m
}

// strMethods are gonja's string methods, which hfMethods keeps.
var strMethods = []string{"capitalize", "capwords", "casefold", "center", "count", "encode", "endswith",
	"expandtabs", "find", "format", "format_map", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit",
	"islower", "isnumeric", "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip",
	"partition", "removeprefix", "removesuffix", "replace", "rfind", "rjust", "rpartition", "rsplit", "rstrip",
	"split", "splitlines", "startswith", "strip", "swapcase", "title", "upper", "zfill"}

// asPyList is a slice a method made as a pyList; anything else as it is.
func asPyList(v any) any {
	rv := reflect.ValueOf(v)
	if !rv.IsValid() || rv.Kind() != reflect.Slice || rv.Type().Elem().Kind() == reflect.Uint8 {
		return v
	}
	out := make(pyList, rv.Len())
	for i := range out {
		out[i] = rv.Index(i).Interface()
	}
	return out
}

// asDict is the ordered Dict a value holds, or nil.
func asDict(v *exec.Value) *exec.Dict {
	switch d := v.Interface().(type) {
	case *exec.Dict:
		return d
	case exec.Dict:
		return &d
	}
	return nil
}

func dictKeys(pairs []*exec.Pair, args *exec.VarArgs) (any, error) {
	if len(args.Args) > 0 {
		return nil, fmt.Errorf("keys() takes no arguments")
	}
	out := make([]any, len(pairs))
	for i, p := range pairs {
		out[i] = p.Key.Interface()
	}
	return out, nil
}

func dictValues(pairs []*exec.Pair, args *exec.VarArgs) (any, error) {
	if len(args.Args) > 0 {
		return nil, fmt.Errorf("values() takes no arguments")
	}
	out := make([]any, len(pairs))
	for i, p := range pairs {
		out[i] = p.Value.Interface()
	}
	return out, nil
}

func dictItems(pairs []*exec.Pair, args *exec.VarArgs) (any, error) {
	if len(args.Args) > 0 {
		return nil, fmt.Errorf("items() takes no arguments")
	}
	out := make([]any, len(pairs))
	for i, p := range pairs {
		out[i] = []any{p.Key.Interface(), p.Value.Interface()}
	}
	return out, nil
}

func dictGet(pairs []*exec.Pair, args *exec.VarArgs) (any, error) {
	if len(args.Args) < 1 || len(args.Args) > 2 {
		return nil, fmt.Errorf("get() takes 1 or 2 arguments")
	}
	key := args.Args[0].String()
	for _, p := range pairs {
		if p.Key.String() == key {
			return p.Value.Interface(), nil
		}
	}
	if len(args.Args) == 2 {
		return args.Args[1].Interface(), nil
	}
	return nil, nil
}

// filterList is the list filter, making a pyList.
func filterList(e *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	f, _ := builtins.Filters.Get("list")
	out := f(e, in, params)
	if l, ok := out.Interface().([]any); ok {
		return exec.AsValue(pyList(l))
	}
	return out
}

// filterItems is the items filter over an ordered Dict too (gonja's sees no pairs in one).
func filterItems(e *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if d := asDict(in); d != nil {
		items, _ := dictItems(d.Pairs, exec.NewVarArgs())
		return exec.AsValue(items)
	}
	f, _ := builtins.Filters.Get("items")
	return f(e, in, params)
}
