// A fake CUDA driver for the binding's tests on machines without a GPU. It exports the calls
// package cuda binds, with the driver's prototypes and results, and keeps "device memory" in
// host memory. Kernels are C functions named fake_* and the project's own kernels, run by the
// emulator of emu.cc. Like the real driver it refuses calls
// that need a context when none is current on the calling thread, so the tests see whether
// the binding makes its context current on whatever thread Go runs it.
//
// Environment: FAKECUDA_DEVICES (default 1), FAKECUDA_MEM (bytes per device, default 1 GiB),
// FAKECUDA_INIT_ERROR (a CUresult cuInit returns).
//
// Built by fakecuda.Build, linked with emu.cc.
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum {
	SUCCESS = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, NO_DEVICE = 100,
	INVALID_DEVICE = 101, INVALID_CONTEXT = 201, INVALID_PTX = 218, INVALID_HANDLE = 400,
	NOT_FOUND = 500, HOST_MEMORY_NOT_REGISTERED = 713,
};

struct ctx { int dev; };
struct stream { int magic; };
struct event { int magic; int recorded; double t; };
struct module { int magic; };

static struct ctx ctxs[16];
static __thread struct ctx *current;
static int initialized;
static long long used[16];

#define MAXALLOC 4096
static struct { void *p; size_t n; int dev; } allocs[MAXALLOC];
static struct { void *p; size_t n; } regs[MAXALLOC];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER; // the tests call from many threads

static int env_int(const char *name, int def) {
	const char *v = getenv(name);
	return v ? atoi(v) : def;
}
static long long env_ll(const char *name, long long def) {
	const char *v = getenv(name);
	return v ? atoll(v) : def;
}
static int ndevices(void) { return env_int("FAKECUDA_DEVICES", 1); }

#define NEED_CTX() do { if (!initialized) return NOT_INITIALIZED; if (!current) return INVALID_CONTEXT; } while (0)

CUresult cuInit(unsigned int flags) {
	int e = env_int("FAKECUDA_INIT_ERROR", 0);
	if (e) return e;
	if (flags != 0) return INVALID_VALUE;
	initialized = 1;
	return SUCCESS;
}
CUresult cuDriverGetVersion(int *v) { *v = 13000; return SUCCESS; }

static const char *names[][2] = {
	{"0", "CUDA_SUCCESS"}, {"1", "CUDA_ERROR_INVALID_VALUE"}, {"2", "CUDA_ERROR_OUT_OF_MEMORY"},
	{"3", "CUDA_ERROR_NOT_INITIALIZED"}, {"100", "CUDA_ERROR_NO_DEVICE"}, {"101", "CUDA_ERROR_INVALID_DEVICE"},
	{"201", "CUDA_ERROR_INVALID_CONTEXT"}, {"218", "CUDA_ERROR_INVALID_PTX"}, {"400", "CUDA_ERROR_INVALID_HANDLE"},
	{"500", "CUDA_ERROR_NOT_FOUND"}, {"713", "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"},
	{"719", "CUDA_ERROR_LAUNCH_FAILED"},
};
CUresult cuGetErrorName(CUresult e, const char **s) {
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		if (atoi(names[i][0]) == e) { *s = names[i][1]; return SUCCESS; }
	*s = 0;
	return INVALID_VALUE;
}
CUresult cuGetErrorString(CUresult e, const char **s) {
	switch (e) {
	case OUT_OF_MEMORY: *s = "out of memory"; return SUCCESS;
	case INVALID_CONTEXT: *s = "invalid device context"; return SUCCESS;
	case INVALID_PTX: *s = "a PTX JIT compilation failed"; return SUCCESS;
	case NOT_FOUND: *s = "named symbol not found"; return SUCCESS;
	case 719: *s = "unspecified launch failure"; return SUCCESS;
	}
	return cuGetErrorName(e, s);
}

CUresult cuDeviceGetCount(int *n) {
	if (!initialized) return NOT_INITIALIZED;
	*n = ndevices();
	return *n == 0 ? NO_DEVICE : SUCCESS;
}
CUresult cuDeviceGet(CUdevice *d, int ordinal) {
	if (!initialized) return NOT_INITIALIZED;
	if (ordinal < 0 || ordinal >= ndevices()) return INVALID_DEVICE;
	*d = ordinal;
	return SUCCESS;
}
CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
	if (d < 0 || d >= ndevices()) return INVALID_DEVICE;
	const char *s = "Fake GPU";
	strncpy(name, s, len);
	return SUCCESS;
}
CUresult cuDeviceTotalMem_v2(size_t *n, CUdevice d) {
	if (d < 0 || d >= ndevices()) return INVALID_DEVICE;
	*n = env_ll("FAKECUDA_MEM", 1LL << 30);
	return SUCCESS;
}
CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
	if (d < 0 || d >= ndevices()) return INVALID_DEVICE;
	switch (attr) {
	case 75: *v = 8; break;          // compute capability major
	case 76: *v = 9; break;          // minor
	case 16: *v = 128; break;        // SMs
	case 13: *v = 2520000; break;    // clock kHz
	case 36: *v = 10501000; break;   // memory clock kHz
	case 37: *v = 384; break;        // bus width
	case 38: *v = 72 << 20; break;   // L2
	case 33: *v = 1; break;          // PCI bus
	case 34: *v = 0; break;
	case 50: *v = 0; break;
	default: return INVALID_VALUE;
	}
	return SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(struct ctx **c, CUdevice d) {
	if (!initialized) return NOT_INITIALIZED;
	if (d < 0 || d >= ndevices()) return INVALID_DEVICE;
	ctxs[d].dev = d;
	*c = &ctxs[d];
	return SUCCESS;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { return d < 0 || d >= ndevices() ? INVALID_DEVICE : SUCCESS; }
CUresult cuCtxSetCurrent(struct ctx *c) { current = c; return SUCCESS; }
CUresult cuCtxSynchronize(void) { NEED_CTX(); return SUCCESS; }
CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
	NEED_CTX();
	*total = env_ll("FAKECUDA_MEM", 1LL << 30);
	*free = *total - used[current->dev];
	return SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	NEED_CTX();
	if (n == 0) return INVALID_VALUE;
	CUresult r = OUT_OF_MEMORY;
	pthread_mutex_lock(&mu);
	if (used[current->dev] + (long long)n <= env_ll("FAKECUDA_MEM", 1LL << 30)) {
		for (int i = 0; i < MAXALLOC; i++) {
			if (!allocs[i].p) {
				allocs[i].p = calloc(1, n);
				allocs[i].n = n;
				allocs[i].dev = current->dev;
				used[current->dev] += n;
				*p = (CUdeviceptr)(uintptr_t)allocs[i].p;
				r = SUCCESS;
				break;
			}
		}
	}
	pthread_mutex_unlock(&mu);
	return r;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
	NEED_CTX();
	CUresult r = INVALID_VALUE;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAXALLOC; i++) {
		if (allocs[i].p && (CUdeviceptr)(uintptr_t)allocs[i].p == p) {
			used[allocs[i].dev] -= allocs[i].n;
			free(allocs[i].p);
			allocs[i].p = 0;
			r = SUCCESS;
			break;
		}
	}
	pthread_mutex_unlock(&mu);
	return r;
}
CUresult cuMemHostAlloc(void **p, size_t n, unsigned int flags) {
	NEED_CTX();
	if (flags & ~0x7u) return INVALID_VALUE;
	*p = calloc(1, n);
	return *p ? SUCCESS : OUT_OF_MEMORY;
}
CUresult cuMemFreeHost(void *p) { NEED_CTX(); free(p); return SUCCESS; }
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned int flags) {
	NEED_CTX();
	if (flags & ~0xfu) return INVALID_VALUE;
	CUresult r = OUT_OF_MEMORY;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAXALLOC; i++)
		if (!regs[i].p) { regs[i].p = p; regs[i].n = n; r = SUCCESS; break; }
	pthread_mutex_unlock(&mu);
	return r;
}
CUresult cuMemHostUnregister(void *p) {
	NEED_CTX();
	CUresult r = HOST_MEMORY_NOT_REGISTERED;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAXALLOC; i++)
		if (regs[i].p == p) { regs[i].p = 0; r = SUCCESS; break; }
	pthread_mutex_unlock(&mu);
	return r;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, struct stream *s) {
	NEED_CTX();
	if (!s || s->magic != 0x5757) return INVALID_HANDLE;
	memcpy((void *)(uintptr_t)dst, src, n);
	return SUCCESS;
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, struct stream *s) {
	NEED_CTX();
	if (!s || s->magic != 0x5757) return INVALID_HANDLE;
	memcpy(dst, (void *)(uintptr_t)src, n);
	return SUCCESS;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, struct stream *s) {
	NEED_CTX();
	if (!s || s->magic != 0x5757) return INVALID_HANDLE;
	memmove((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n);
	return SUCCESS;
}
CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, struct stream *s) {
	NEED_CTX();
	if (!s || s->magic != 0x5757) return INVALID_HANDLE;
	memset((void *)(uintptr_t)p, v, n);
	return SUCCESS;
}

CUresult cuStreamCreate(struct stream **s, unsigned int flags) {
	NEED_CTX();
	if (flags > 1) return INVALID_VALUE;
	*s = malloc(sizeof **s);
	(*s)->magic = 0x5757;
	return SUCCESS;
}
CUresult cuStreamDestroy_v2(struct stream *s) { NEED_CTX(); if (!s || s->magic != 0x5757) return INVALID_HANDLE; s->magic = 0; free(s); return SUCCESS; }
CUresult cuStreamSynchronize(struct stream *s) { NEED_CTX(); return s && s->magic == 0x5757 ? SUCCESS : INVALID_HANDLE; }
CUresult cuStreamWaitEvent(struct stream *s, struct event *e, unsigned int flags) {
	NEED_CTX();
	if (!s || s->magic != 0x5757 || !e || e->magic != 0xe7e7) return INVALID_HANDLE;
	return flags ? INVALID_VALUE : SUCCESS;
}

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}
CUresult cuEventCreate(struct event **e, unsigned int flags) {
	NEED_CTX();
	if (flags & ~0x7u) return INVALID_VALUE;
	*e = calloc(1, sizeof **e);
	(*e)->magic = 0xe7e7;
	return SUCCESS;
}
CUresult cuEventDestroy_v2(struct event *e) { NEED_CTX(); if (!e || e->magic != 0xe7e7) return INVALID_HANDLE; e->magic = 0; free(e); return SUCCESS; }
CUresult cuEventRecord(struct event *e, struct stream *s) {
	NEED_CTX();
	if (!e || e->magic != 0xe7e7 || !s || s->magic != 0x5757) return INVALID_HANDLE;
	e->recorded = 1;
	e->t = now();
	return SUCCESS;
}
CUresult cuEventSynchronize(struct event *e) { NEED_CTX(); return e && e->magic == 0xe7e7 ? SUCCESS : INVALID_HANDLE; }
CUresult cuEventQuery(struct event *e) { NEED_CTX(); return e && e->magic == 0xe7e7 ? SUCCESS : INVALID_HANDLE; }
CUresult cuEventElapsedTime(float *ms, struct event *a, struct event *b) {
	NEED_CTX();
	if (!a || !b || !a->recorded || !b->recorded) return INVALID_HANDLE;
	*ms = (float)((b->t - a->t) * 1e3);
	return SUCCESS;
}

// Modules: an image is text; one that contains "syntax error" fails to compile with a log.
CUresult cuModuleLoadDataEx(struct module **m, const void *image, unsigned int n, int *opts, void **vals) {
	NEED_CTX();
	const char *img = image;
	if (strstr(img, "syntax error")) {
		char *buf = 0;
		size_t size = 0;
		for (unsigned int i = 0; i < n; i++) {
			if (opts[i] == 5) buf = vals[i];
			if (opts[i] == 6) size = (size_t)(uintptr_t)vals[i];
		}
		if (buf && size) {
			strncpy(buf, "ptxas application ptx input, line 1; fatal   : Parsing error near 'syntax': syntax error", size);
			buf[size - 1] = 0;
		}
		return INVALID_PTX;
	}
	*m = malloc(sizeof **m);
	(*m)->magic = 0x3d3d;
	return SUCCESS;
}
CUresult cuModuleUnload(struct module *m) { NEED_CTX(); if (!m || m->magic != 0x3d3d) return INVALID_HANDLE; m->magic = 0; free(m); return SUCCESS; }

// Kernels: (float a, const float *x, float *y, int n): y += a*x; (long long v, long long *dst,
// int n): dst[i] = v + i.
typedef void (*kernel)(void **params);
static void fake_axpy(void **p) {
	float a = *(float *)p[0];
	const float *x = *(const float **)p[1];
	float *y = *(float **)p[2];
	int n = *(int *)p[3];
	for (int i = 0; i < n; i++) y[i] += a * x[i];
}
static void fake_iota64(void **p) {
	long long v = *(long long *)p[0];
	long long *dst = *(long long **)p[1];
	int n = *(int *)p[2];
	for (int i = 0; i < n; i++) dst[i] = v + i;
}

// The project's kernels (cuda/kernels) run in the emulator of emu.cc.
void *emu_find(const char *name);
int emu_launch(void *k, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, void **params);

struct kern { const char *name; kernel fn; int shared; void *emu; };
static struct kern kernels[128] = {
	{"fake_axpy", fake_axpy, 0, 0}, {"fake_iota64", fake_iota64, 0, 0},
};
CUresult cuModuleGetFunction(void **f, struct module *m, const char *name) {
	NEED_CTX();
	if (!m || m->magic != 0x3d3d) return INVALID_HANDLE;
	CUresult r = NOT_FOUND;
	pthread_mutex_lock(&mu);
	size_t i = 0;
	for (; i < sizeof kernels / sizeof kernels[0] && kernels[i].name; i++)
		if (!strcmp(kernels[i].name, name)) { *f = &kernels[i]; r = SUCCESS; break; }
	if (r == NOT_FOUND && i < sizeof kernels / sizeof kernels[0]) {
		void *k = emu_find(name);
		if (k) {
			kernels[i].name = strdup(name);
			kernels[i].emu = k;
			*f = &kernels[i];
			r = SUCCESS;
		}
	}
	pthread_mutex_unlock(&mu);
	return r;
}
CUresult cuFuncSetAttribute(void *f, int attr, int value) {
	NEED_CTX();
	if (!f || attr != 8 || value < 0) return INVALID_VALUE;
	((struct kern *)f)->shared = value;
	return SUCCESS;
}

// The last launch's configuration, for the tests to read back.
static unsigned int last[8];
void fake_last_launch(unsigned int *out) { memcpy(out, last, sizeof last); }

CUresult cuLaunchKernel(void *f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
                        unsigned int bz, unsigned int shared, struct stream *s, void **params, void **extra) {
	NEED_CTX();
	if (!f || !s || s->magic != 0x5757 || extra) return INVALID_HANDLE;
	if (gx == 0 || gy == 0 || gz == 0 || bx * by * bz == 0 || bx * by * bz > 1024) return INVALID_VALUE;
	unsigned int v[8] = {gx, gy, gz, bx, by, bz, shared, 1};
	memcpy(last, v, sizeof v);
	struct kern *k = f;
	if (k->emu) return emu_launch(k->emu, gx, gy, gz, bx, by, bz, params);
	k->fn(params);
	return SUCCESS;
}
