//go:build !linux

package models

import "errors"

// Populate is not available on this system: the caller touches t's pages instead.
func (f *File) Populate(t *Tensor) error {
	return errors.New("populating a memory map needs Linux's MADV_POPULATE_READ")
}
