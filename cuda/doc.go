// Package cuda is the CUDA device: our own binding of the CUDA driver API, loaded at run time
// with purego (dlopen of libcuda.so.1, no cgo), and the kernels, CUDA C compiled to PTX and
// embedded. One binary builds everywhere, runs on machines without a GPU, and finds the GPU
// when the driver is there.
//
// The binding has one file per API area (init, device, context, memory, stream, event,
// module, launch, graph, errors); each bound symbol sits beside its C prototype. Calls return typed
// handles and errors that name the call and the driver's result. Hot calls (kernel launch,
// asynchronous copy, event record and wait) go through purego.SyscallN without reflection.
// Every call makes its context current on the calling thread first, since Go moves
// goroutines between threads and a CUDA context is current per thread.
//
// The binding is tested on every machine against a fake driver (internal/fakecuda, built by
// the tests with the C and C++ compilers), whose launches run the kernels' CUDA C on the host
// with every CUDA thread emulated, and, where a GPU is present, against the real one.
package cuda
