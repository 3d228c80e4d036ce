package offload

// onDemand copies each expert a layer needs into a slot when the router has chosen it, if it
// is not there already: the baseline every other policy is measured against.
type onDemand struct{}

func (onDemand) predictors() []string                        { return nil }
func (onDemand) minSlots(_, _, used int, _ string) int       { return used }
func (onDemand) loadsAhead() bool                            { return false }
func (onDemand) commits() bool                               { return false }
func (onDemand) onHost(*Offloader, int, []int, []int) []bool { return nil }
func (onDemand) hostsLayer(*Offloader, int) bool             { return false }
func (onDemand) copiesBehind(*Offloader, ExpertKey) bool     { return false }
func (onDemand) prepare(f *Offloader) error                  { return fillSlots(f) }
