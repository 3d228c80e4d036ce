// Package nccl is a binding of NVIDIA's collective communication library, NCCL, for the
// point-to-point exchanges of expert parallelism (sending tokens to the GPUs that hold their
// experts and their outputs back).
//
// Like package cuda, it loads the library at run time with purego (dlopen of libnccl.so.2,
// no cgo): one binary builds everywhere and runs on machines without NCCL, finding the library
// where it is installed. Load fails with ErrNoLibrary otherwise.
//
// Bound: the version and error strings; unique ids; communicators made for all local devices at
// once (ncclCommInitAll) or rank by rank across threads or processes
// (ncclCommInitRankScalable, NCCL 2.23 or newer: ncclCommInitRank takes its 128-byte id by
// value, which purego cannot pass); their destruction, abort, asynchronous error and queries;
// group calls, ncclSend and ncclRecv. Each bound symbol sits beside its C prototype. Hot calls
// (GroupStart, GroupEnd, Send, Recv) go through purego.SyscallN without reflection. Errors
// name the call, NCCL's result and its last error message; arguments that are wrong on
// their face (a negative count, a peer out of range, a nil or destroyed communicator) are
// refused on the Go side with an error of the same kind, before NCCL sees them.
//
// Threading rule. NCCL keeps its group state per OS thread, and Go moves goroutines between
// threads. A GroupStart, the calls it groups and its GroupEnd must therefore run on one locked
// OS thread (runtime.LockOSThread), and with the communicators' CUDA devices current on that
// thread (their primary contexts, as package cuda makes them): the caller arranges both. A
// thread may drive the communicators of several devices in one group, as after InitAll; or
// each rank may have its own goroutine, as after InitRank, whose call blocks until every rank
// has joined. Abort may be called from any goroutine, also to release a rank blocked in
// GroupEnd.
//
// The binding is tested on every machine against a fake library (internal/fakenccl, built by
// the tests with the C compiler) that moves data between the ranks of one process.
package nccl
