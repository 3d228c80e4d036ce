package tokenizer

import (
	"fmt"
	"math"
	"strings"

	"github.com/ollama/ollama/fs/ggml"
)

// The KV map from ggml.Decode holds scalars as Go values and arrays as an
// unexported type whose values are reachable only through KV's typed
// getters, which return nil both for a wrong type and for an array larger
// than the decoder's maxArraySize. These helpers tell those cases apart and
// also accept plain slices, so callers (and tests) can build a KV by hand.

// arrayHint explains a nil array from a present key.
func arrayHint(key string, v any, want string) error {
	if strings.Contains(fmt.Sprintf("%T", v), "array[") && strings.Contains(fmt.Sprintf("%T", v), want) {
		return fmt.Errorf("tokenizer: %s was not loaded (decode the GGUF with maxArraySize -1)", key)
	}
	return fmt.Errorf("tokenizer: %s has type %T, want an array of %s", key, v, want)
}

func kvString(kv ggml.KV, key string) (string, bool, error) {
	v, ok := kv[key]
	if !ok {
		return "", false, nil
	}
	s, ok := v.(string)
	if !ok {
		return "", false, fmt.Errorf("tokenizer: %s has type %T, want string", key, v)
	}
	return s, true, nil
}

func kvBool(kv ggml.KV, key string) (bool, bool, error) {
	v, ok := kv[key]
	if !ok {
		return false, false, nil
	}
	b, ok := v.(bool)
	if !ok {
		return false, false, fmt.Errorf("tokenizer: %s has type %T, want bool", key, v)
	}
	return b, true, nil
}

// kvInt reads an integer of any GGUF integer type.
func kvInt(kv ggml.KV, key string) (int64, bool, error) {
	v, ok := kv[key]
	if !ok {
		return 0, false, nil
	}
	switch v := v.(type) {
	case uint8:
		return int64(v), true, nil
	case int8:
		return int64(v), true, nil
	case uint16:
		return int64(v), true, nil
	case int16:
		return int64(v), true, nil
	case uint32:
		return int64(v), true, nil
	case int32:
		return int64(v), true, nil
	case uint64:
		if v > math.MaxInt64 {
			return 0, false, fmt.Errorf("tokenizer: %s = %d is out of range", key, v)
		}
		return int64(v), true, nil
	case int64:
		return v, true, nil
	}
	return 0, false, fmt.Errorf("tokenizer: %s has type %T, want an integer", key, v)
}

func kvStrings(kv ggml.KV, key string) ([]string, bool, error) {
	v, ok := kv[key]
	if !ok {
		return nil, false, nil
	}
	if s, ok := v.([]string); ok {
		return s, true, nil
	}
	if s := kv.Strings(key); s != nil {
		return s, true, nil
	}
	return nil, false, arrayHint(key, v, "string")
}

// kvInts reads token types, stored as int32 by llama.cpp's converter; other
// integer arrays are accepted too.
func kvInts(kv ggml.KV, key string) ([]int32, bool, error) {
	v, ok := kv[key]
	if !ok {
		return nil, false, nil
	}
	switch v := v.(type) {
	case []int32:
		return v, true, nil
	case []uint32:
		out := make([]int32, len(v))
		for i, x := range v {
			out[i] = int32(min(x, math.MaxInt32))
		}
		return out, true, nil
	}
	if s := kv.Ints(key); s != nil {
		return s, true, nil
	}
	if u := kv.Uints(key); u != nil {
		return kvInts(ggml.KV{key: u}, key)
	}
	return nil, false, arrayHint(key, v, "int32")
}

// kvFloats reads scores: float32, or int32 as newer llama.cpp also accepts.
func kvFloats(kv ggml.KV, key string) ([]float32, bool, error) {
	v, ok := kv[key]
	if !ok {
		return nil, false, nil
	}
	if f, ok := v.([]float32); ok {
		return f, true, nil
	}
	if f := kv.Floats(key); f != nil {
		return f, true, nil
	}
	ints, _, err := kvInts(kv, key)
	if err != nil {
		return nil, false, arrayHint(key, v, "float32")
	}
	out := make([]float32, len(ints))
	for i, x := range ints {
		out[i] = float32(x)
	}
	return out, true, nil
}
