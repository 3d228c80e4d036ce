// A fake CUDA driver for the binding's tests on machines without a GPU. It exports the calls
// package cuda binds, with the driver's prototypes and results, and keeps "device memory" in
// host memory. Kernels are C functions named fake_* and the project's own kernels, run by the
// emulator of emu.cc. Like the real driver it refuses calls
// that need a context when none is current on the calling thread, so the tests see whether
// the binding makes its context current on whatever thread Go runs it.
//
// Stream capture and graphs: a stream in capture (cuStreamBeginCapture_v2) records its kernel
// launches, copies and memsets instead of running them, with a copy of each launch's
// arguments, and cuGraphLaunch runs them again in order. Like the real driver it refuses, and
// invalidates the capture with, what a graph cannot hold: synchronising the stream, recording
// or waiting for an event on it, and copies to or from host memory that is not pinned (the
// driver's pinned allocations or registrations); the refusals are stricter than the real
// driver's only in refusing every event on a capturing stream.
//
// Modules: an image's .target and .entry lines say what it holds. A module whose target is
// newer than the device fails to load, as the JIT fails, and a module lends only its entries
// (an image with none, a test's stand-in, lends every kernel).
//
// Environment: FAKECUDA_DEVICES (default 1), FAKECUDA_MEM (bytes per device, default 1 GiB),
// FAKECUDA_CC (compute capability as 10*major+minor, default 89), FAKECUDA_INIT_ERROR (a
// CUresult cuInit returns), FAKECUDA_SKIP_KERNELS (set: launches are checked and counted but
// no kernel runs, so that what is left of a pass's time is the host's own: the engine's work
// and its waits between launches, which on a card the device may sit idle through; the
// numbers computed are then garbage).
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
	NOT_FOUND = 500, HOST_MEMORY_NOT_REGISTERED = 713, ILLEGAL_STATE = 401,
	CAPTURE_UNSUPPORTED = 900, CAPTURE_INVALIDATED = 901,
};

struct ctx { int dev; };
struct graph;
struct stream { int magic; int capturing, invalid; struct graph *g; };
struct event { int magic; int recorded; double t; };
// A module is its image's target (sm_XY as XY, 0 for none) and the names of its .entry
// functions (none: a test's stand-in image, which lends every kernel).
struct module { int magic; int sm; int nentries; char **entries; };

static struct ctx ctxs[16];
static __thread struct ctx *current;
static int initialized;
static long long used[16];

#define MAXALLOC 4096
static struct { void *p; size_t n; int dev; } allocs[MAXALLOC];
static struct { void *p; size_t n; } regs[MAXALLOC];
static struct { void *p; size_t n; } hosts[MAXALLOC]; // cuMemHostAlloc's
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
// The devices' compute capability as 10*major + minor: $FAKECUDA_CC, else 89 (an RTX 4090's).
static int device_cc(void) { return env_int("FAKECUDA_CC", 89); }

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
	{"719", "CUDA_ERROR_LAUNCH_FAILED"}, {"401", "CUDA_ERROR_ILLEGAL_STATE"},
	{"900", "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"}, {"901", "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"},
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
	case 75: *v = device_cc() / 10; break; // compute capability major
	case 76: *v = device_cc() % 10; break; // minor
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
	if (!*p) return OUT_OF_MEMORY;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAXALLOC; i++)
		if (!hosts[i].p) { hosts[i].p = *p; hosts[i].n = n; break; }
	pthread_mutex_unlock(&mu);
	return SUCCESS;
}
CUresult cuMemFreeHost(void *p) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAXALLOC; i++)
		if (hosts[i].p == p) { hosts[i].p = 0; break; }
	pthread_mutex_unlock(&mu);
	free(p);
	return SUCCESS;
}

// pinned says whether the n host bytes at p lie in one pinned allocation or registration.
static int pinned(const void *p, size_t n) {
	const char *c = p;
	int ok = 0;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAXALLOC && !ok; i++) {
		const char *h = hosts[i].p, *r = regs[i].p;
		ok = (h && c >= h && c + n <= h + hosts[i].n) || (r && c >= r && c + n <= r + regs[i].n);
	}
	pthread_mutex_unlock(&mu);
	return ok;
}
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
// A captured graph: its nodes in the order the stream enqueued them.
enum { NODE_KERNEL, NODE_COPY, NODE_MEMSET };
struct node {
	int kind;
	struct kern *k;
	unsigned int dims[6];
	int nparams;
	unsigned char *args;  // the arguments' bytes, each at an 8-byte aligned offset
	int offs[32];
	void *dst; const void *src; size_t n; unsigned char v;
};
struct graph { int magic; int n, cap; struct node *nodes; };
struct gexec { int magic; struct graph g; };

static struct node *add_node(struct stream *s) {
	struct graph *g = s->g;
	if (g->n == g->cap) {
		int cap = g->cap ? 2 * g->cap : 64;
		struct node *nodes = realloc(g->nodes, cap * sizeof *nodes);
		if (!nodes) return 0;
		g->nodes = nodes;
		g->cap = cap;
	}
	struct node *nd = &g->nodes[g->n++];
	memset(nd, 0, sizeof *nd);
	return nd;
}

// refuse invalidates s's capture and returns what a capturing stream answers.
static CUresult refuse(struct stream *s) { s->invalid = 1; return CAPTURE_UNSUPPORTED; }

static CUresult copy_node(struct stream *s, void *dst, const void *src, size_t n, const void *host) {
	if (host && !pinned(host, n)) return refuse(s);
	struct node *nd = add_node(s);
	if (!nd) return OUT_OF_MEMORY;
	nd->kind = NODE_COPY; nd->dst = dst; nd->src = src; nd->n = n;
	return SUCCESS;
}

#define NEED_STREAM(s) do { if (!(s) || (s)->magic != 0x5757) return INVALID_HANDLE; } while (0)

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, struct stream *s) {
	NEED_CTX();
	NEED_STREAM(s);
	if (s->capturing) return copy_node(s, (void *)(uintptr_t)dst, src, n, src);
	memcpy((void *)(uintptr_t)dst, src, n);
	return SUCCESS;
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, struct stream *s) {
	NEED_CTX();
	NEED_STREAM(s);
	if (s->capturing) return copy_node(s, dst, (void *)(uintptr_t)src, n, dst);
	memcpy(dst, (void *)(uintptr_t)src, n);
	return SUCCESS;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, struct stream *s) {
	NEED_CTX();
	NEED_STREAM(s);
	if (s->capturing) return copy_node(s, (void *)(uintptr_t)dst, (void *)(uintptr_t)src, n, 0);
	memmove((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n);
	return SUCCESS;
}
CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, struct stream *s) {
	NEED_CTX();
	NEED_STREAM(s);
	if (s->capturing) {
		struct node *nd = add_node(s);
		if (!nd) return OUT_OF_MEMORY;
		nd->kind = NODE_MEMSET; nd->dst = (void *)(uintptr_t)p; nd->n = n; nd->v = v;
		return SUCCESS;
	}
	memset((void *)(uintptr_t)p, v, n);
	return SUCCESS;
}

CUresult cuStreamCreate(struct stream **s, unsigned int flags) {
	NEED_CTX();
	if (flags > 1) return INVALID_VALUE;
	*s = calloc(1, sizeof **s);
	(*s)->magic = 0x5757;
	return SUCCESS;
}
static void free_graph(struct graph *g) {
	for (int i = 0; i < g->n; i++) free(g->nodes[i].args);
	free(g->nodes);
	g->nodes = 0;
	g->n = g->cap = 0;
}
CUresult cuStreamDestroy_v2(struct stream *s) {
	NEED_CTX();
	NEED_STREAM(s);
	if (s->g) { free_graph(s->g); free(s->g); }
	s->magic = 0;
	free(s);
	return SUCCESS;
}
CUresult cuStreamSynchronize(struct stream *s) {
	NEED_CTX();
	NEED_STREAM(s);
	return s->capturing ? refuse(s) : SUCCESS;
}
CUresult cuStreamWaitEvent(struct stream *s, struct event *e, unsigned int flags) {
	NEED_CTX();
	if (!s || s->magic != 0x5757 || !e || e->magic != 0xe7e7) return INVALID_HANDLE;
	if (s->capturing) return refuse(s);
	return flags ? INVALID_VALUE : SUCCESS;
}

// Capture: modes 0 (global), 1 (thread-local) and 2 (relaxed) are taken alike.
CUresult cuStreamBeginCapture_v2(struct stream *s, int mode) {
	NEED_CTX();
	NEED_STREAM(s);
	if (mode < 0 || mode > 2) return INVALID_VALUE;
	if (s->capturing) return ILLEGAL_STATE;
	struct graph *g = calloc(1, sizeof *g);
	if (!g) return OUT_OF_MEMORY;
	g->magic = 0x6a6a;
	s->g = g;
	s->capturing = 1;
	s->invalid = 0;
	return SUCCESS;
}
CUresult cuStreamEndCapture(struct stream *s, struct graph **out) {
	NEED_CTX();
	NEED_STREAM(s);
	if (!s->capturing) return ILLEGAL_STATE;
	struct graph *g = s->g;
	s->g = 0;
	s->capturing = 0;
	*out = 0;
	if (s->invalid) {
		free_graph(g);
		free(g);
		return CAPTURE_INVALIDATED;
	}
	*out = g;
	return SUCCESS;
}
CUresult cuGraphDestroy(struct graph *g) {
	NEED_CTX();
	if (!g || g->magic != 0x6a6a) return INVALID_HANDLE;
	g->magic = 0;
	free_graph(g);
	free(g);
	return SUCCESS;
}
CUresult cuGraphInstantiateWithFlags(struct gexec **out, struct graph *g, unsigned long long flags) {
	NEED_CTX();
	if (!g || g->magic != 0x6a6a) return INVALID_HANDLE;
	if (flags) return INVALID_VALUE;
	struct gexec *x = calloc(1, sizeof *x);
	if (!x) return OUT_OF_MEMORY;
	x->magic = 0x6b6b;
	x->g.n = x->g.cap = g->n;
	x->g.nodes = calloc(g->n ? g->n : 1, sizeof *x->g.nodes);
	for (int i = 0; i < g->n; i++) {
		x->g.nodes[i] = g->nodes[i];
		if (g->nodes[i].args) {
			int size = g->nodes[i].nparams ? g->nodes[i].offs[g->nodes[i].nparams] : 0;
			x->g.nodes[i].args = malloc(size ? size : 1);
			memcpy(x->g.nodes[i].args, g->nodes[i].args, size);
		}
	}
	*out = x;
	return SUCCESS;
}
CUresult cuGraphExecDestroy(struct gexec *x) {
	NEED_CTX();
	if (!x || x->magic != 0x6b6b) return INVALID_HANDLE;
	x->magic = 0;
	free_graph(&x->g);
	free(x);
	return SUCCESS;
}

static long long graph_launches;
long long fake_graph_launches(void) { return graph_launches; }

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
	if (s->capturing) return refuse(s);
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

// Modules: an image is text; one that contains "syntax error" fails to compile with a log, as
// does one whose .target is newer than the device (the driver's JIT refuses it so).
static CUresult ptx_error(unsigned int n, int *opts, void **vals, const char *log) {
	char *buf = 0;
	size_t size = 0;
	for (unsigned int i = 0; i < n; i++) {
		if (opts[i] == 5) buf = vals[i];
		if (opts[i] == 6) size = (size_t)(uintptr_t)vals[i];
	}
	if (buf && size) {
		strncpy(buf, log, size);
		buf[size - 1] = 0;
	}
	return INVALID_PTX;
}
CUresult cuModuleLoadDataEx(struct module **m, const void *image, unsigned int n, int *opts, void **vals) {
	NEED_CTX();
	const char *img = image;
	if (strstr(img, "syntax error"))
		return ptx_error(n, opts, vals, "ptxas application ptx input, line 1; fatal   : Parsing error near 'syntax': syntax error");
	int sm = 0;
	const char *t = strstr(img, "\n.target sm_");
	if (t) sm = atoi(t + strlen("\n.target sm_"));
	if (sm > device_cc())
		return ptx_error(n, opts, vals, "ptxas application ptx input, line 1; fatal   : SM version specified by .target is higher than default SM version assumed");
	struct module *mod = calloc(1, sizeof *mod);
	mod->magic = 0x3d3d;
	mod->sm = sm;
	const char *key = "\n.visible .entry ";
	for (const char *e = strstr(img, key); e; e = strstr(e + 1, key)) {
		const char *name = e + strlen(key), *end = strchr(name, '(');
		if (!end) break;
		mod->entries = realloc(mod->entries, (mod->nentries + 1) * sizeof *mod->entries);
		mod->entries[mod->nentries++] = strndup(name, end - name);
	}
	*m = mod;
	return SUCCESS;
}
static int module_has(struct module *m, const char *name) {
	if (m->nentries == 0) return 1;
	for (int i = 0; i < m->nentries; i++)
		if (!strcmp(m->entries[i], name)) return 1;
	return 0;
}
CUresult cuModuleUnload(struct module *m) {
	NEED_CTX();
	if (!m || m->magic != 0x3d3d) return INVALID_HANDLE;
	m->magic = 0;
	for (int i = 0; i < m->nentries; i++) free(m->entries[i]);
	free(m->entries);
	free(m);
	return SUCCESS;
}

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

// The project's kernels (cuda/kernels) run in the emulator of emu.cc: a module of .target
// sm_80 or newer takes the sm_80 module's build of them.
void *emu_find(const char *name, int sm);
int emu_launch(void *k, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, void **params);

int emu_param_sizes(void *k, int *sizes, int max);

// A kernel is one per name and module target: modules of two targets lend different handles,
// as a driver's do, over the same emulated code.
struct kern { const char *name; kernel fn; int shared; void *emu; int nparams; int sizes[4]; int sm; };
static struct kern kernels[512] = {
	{"fake_axpy", fake_axpy, 0, 0, 4, {4, 8, 8, 4}}, {"fake_iota64", fake_iota64, 0, 0, 3, {8, 8, 4}},
};
CUresult cuModuleGetFunction(void **f, struct module *m, const char *name) {
	NEED_CTX();
	if (!m || m->magic != 0x3d3d) return INVALID_HANDLE;
	if (!module_has(m, name)) return NOT_FOUND;
	CUresult r = NOT_FOUND;
	pthread_mutex_lock(&mu);
	size_t i = 0;
	for (; i < sizeof kernels / sizeof kernels[0] && kernels[i].name; i++)
		if (!strcmp(kernels[i].name, name) && (kernels[i].fn || kernels[i].sm == m->sm)) { *f = &kernels[i]; r = SUCCESS; break; }
	if (r == NOT_FOUND && i < sizeof kernels / sizeof kernels[0]) {
		void *k = emu_find(name, m->sm);
		if (k) {
			kernels[i].name = strdup(name);
			kernels[i].emu = k;
			kernels[i].sm = m->sm;
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

static CUresult run_kernel(struct kern *k, const unsigned int *d, void **params) {
	if (getenv("FAKECUDA_SKIP_KERNELS")) return SUCCESS;
	if (k->emu) return emu_launch(k->emu, d[0], d[1], d[2], d[3], d[4], d[5], params);
	k->fn(params);
	return SUCCESS;
}

// kernel_node records a launch on a capturing stream with a copy of its arguments.
static CUresult kernel_node(struct stream *s, struct kern *k, const unsigned int *d, void **params) {
	int sizes[32], n = k->emu ? emu_param_sizes(k->emu, sizes, 32) : k->nparams;
	if (!k->emu) memcpy(sizes, k->sizes, sizeof k->sizes);
	if (n < 0 || n > 31) return INVALID_VALUE;
	struct node *nd = add_node(s);
	if (!nd) return OUT_OF_MEMORY;
	nd->kind = NODE_KERNEL;
	nd->k = k;
	memcpy(nd->dims, d, sizeof nd->dims);
	nd->nparams = n;
	int off = 0;
	for (int i = 0; i < n; i++) {
		nd->offs[i] = off;
		off += (sizes[i] + 7) & ~7;
	}
	nd->offs[n] = off;
	nd->args = malloc(off ? off : 1);
	for (int i = 0; i < n; i++) memcpy(nd->args + nd->offs[i], params[i], sizes[i]);
	return SUCCESS;
}

CUresult cuLaunchKernel(void *f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
                        unsigned int bz, unsigned int shared, struct stream *s, void **params, void **extra) {
	NEED_CTX();
	if (!f || !s || s->magic != 0x5757 || extra) return INVALID_HANDLE;
	// A card's limits: grid.y and grid.z up to 65535, block.z up to 64 (block.x and .y up to
	// 1024, as the product), and grid.x up to 2^31 - 1 (an unsigned int past it is refused).
	if (gx == 0 || gy == 0 || gz == 0 || bx * by * bz == 0 || bx * by * bz > 1024) return INVALID_VALUE;
	if (gx > 0x7fffffffu || gy > 65535 || gz > 65535 || bz > 64) return INVALID_VALUE;
	unsigned int v[8] = {gx, gy, gz, bx, by, bz, shared, 1};
	memcpy(last, v, sizeof v);
	if (s->capturing) return kernel_node(s, f, v, params);
	return run_kernel(f, v, params);
}

// cuGraphLaunch runs the graph's nodes in order, as the stream would have.
CUresult cuGraphLaunch(struct gexec *x, struct stream *s) {
	NEED_CTX();
	if (!x || x->magic != 0x6b6b) return INVALID_HANDLE;
	NEED_STREAM(s);
	if (s->capturing) return refuse(s);
	__sync_fetch_and_add(&graph_launches, 1);
	for (int i = 0; i < x->g.n; i++) {
		struct node *nd = &x->g.nodes[i];
		CUresult r = SUCCESS;
		switch (nd->kind) {
		case NODE_KERNEL: {
			void *params[32];
			for (int j = 0; j < nd->nparams; j++) params[j] = nd->args + nd->offs[j];
			r = run_kernel(nd->k, nd->dims, params);
			break;
		}
		case NODE_COPY: memmove(nd->dst, nd->src, nd->n); break;
		case NODE_MEMSET: memset(nd->dst, nd->v, nd->n); break;
		}
		if (r != SUCCESS) return r;
	}
	return SUCCESS;
}
