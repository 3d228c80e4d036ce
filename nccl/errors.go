package nccl

import (
	"fmt"
	"unsafe"

	"github.com/commit-run/commit-run/internal/dl"
	"github.com/ebitengine/purego"
)

// Result is an ncclResult_t, the status every NCCL call returns.
type Result int32

// The results of nccl.h.
const (
	Success            Result = 0
	UnhandledCudaError Result = 1
	SystemError        Result = 2
	InternalError      Result = 3
	InvalidArgument    Result = 4
	InvalidUsage       Result = 5
	RemoteError        Result = 6
	InProgress         Result = 7 // a non-blocking communicator's call is still running: not an error
)

var resultNames = [...]string{
	"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
	"ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress",
}

// resultTexts describe the results when the library is not asked: for the errors this
// package raises itself, before a call.
var resultTexts = [...]string{
	"no error", "unhandled cuda error", "unhandled system error", "internal error",
	"invalid argument", "invalid usage", "remote process exited or there was a network error",
	"NCCL operation in progress",
}

// String is the result's name in nccl.h, e.g. "ncclInvalidUsage".
func (r Result) String() string {
	if r >= 0 && int(r) < len(resultNames) {
		return resultNames[r]
	}
	return fmt.Sprintf("ncclResult(%d)", int32(r))
}

// Error lets a Result be the target of errors.Is: errors.Is(err, nccl.RemoteError).
func (r Result) Error() string { return r.String() }

type errorSyms struct {
	getErrorString, getLastError uintptr
}

func (s *errorSyms) table() []symbol {
	return []symbol{
		// const char *ncclGetErrorString(ncclResult_t result);
		{Name: "ncclGetErrorString", Addr: &s.getErrorString},
		// const char *ncclGetLastError(ncclComm_t comm);  (NCCL 2.13 and newer)
		{Name: "ncclGetLastError", Addr: &s.getLastError, Optional: true},
	}
}

// Error is an NCCL call that failed, or that this package refused before calling: which
// call, its result, NCCL's description of the result and what it says went wrong.
type Error struct {
	Call   string // the NCCL function, e.g. "ncclSend"
	Result Result
	Desc   string // ncclGetErrorString(Result), e.g. "invalid usage"
	Detail string // ncclGetLastError, or what this package found wrong with the arguments
}

// Error reads e.g. "ncclSend: invalid usage (ncclInvalidUsage): <detail>".
func (e *Error) Error() string {
	desc := e.Desc
	if desc == "" && e.Result >= 0 && int(e.Result) < len(resultTexts) {
		desc = resultTexts[e.Result]
	}
	s := fmt.Sprintf("%s: %s (%s)", e.Call, desc, e.Result)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Is makes errors.Is(err, nccl.InvalidUsage) and the like work on wrapped errors.
func (e *Error) Is(target error) bool {
	r, ok := target.(Result)
	return ok && r == e.Result
}

// newError describes res with the library's own strings. The last error is comm's when
// comm is given, else the process's (or, in some libraries, the calling thread's).
func (l *Library) newError(call string, res Result, comm uintptr) *Error {
	e := &Error{Call: call, Result: res}
	r, _, _ := purego.SyscallN(l.getErrorString, uintptr(res))
	e.Desc = cString(r)
	if l.getLastError != 0 {
		r, _, _ := purego.SyscallN(l.getLastError, comm)
		e.Detail = cString(r)
	}
	return e
}

// cString copies the C string a call returned at address p, memory the library owns.
// (Read through a pointer to p, as vet allows: p is no Go pointer the collector could move.)
func cString(p uintptr) string {
	return dl.GoString(*(*unsafe.Pointer)(unsafe.Pointer(&p)))
}

// argError is an argument this package refuses before calling NCCL.
func argError(call, format string, args ...any) *Error {
	return &Error{Call: call, Result: InvalidArgument, Detail: fmt.Sprintf(format, args...)}
}
