// Package cuda will hold the CUDA driver binding (purego, one file per API area) and the
// CUDA device with its kernels. Nothing lives here yet; the CPU device in package cpu is the
// reference every CUDA kernel will be tested against.
package cuda
