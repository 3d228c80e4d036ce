package offload

import "fmt"

// ExpertKey identifies one routed expert of a model.
type ExpertKey struct{ Layer, Expert int }

// String gives the short form used in errors and logs, e.g. "L3/E7".
func (k ExpertKey) String() string { return fmt.Sprintf("L%d/E%d", k.Layer, k.Expert) }

// compare orders keys by layer, then expert. It is the last tie-break of the eviction
// order, which keeps victims deterministic whatever else is equal.
func (k ExpertKey) compare(o ExpertKey) int {
	switch {
	case k.Layer != o.Layer:
		if k.Layer < o.Layer {
			return -1
		}
		return 1
	case k.Expert != o.Expert:
		if k.Expert < o.Expert {
			return -1
		}
		return 1
	}
	return 0
}
