package models

import "syscall"

// mapNoReserve keeps a large reservation that is never written from counting against the
// kernel's overcommit limit.
const mapNoReserve = syscall.MAP_NORESERVE
