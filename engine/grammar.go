package engine

import "errors"

// errNoToken: the grammar allows no token of the vocabulary, which lacks the bytes the value
// needs next.
var errNoToken = errors.New("no token of the vocabulary continues the value")
