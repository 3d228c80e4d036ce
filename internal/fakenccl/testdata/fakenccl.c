// A fake NCCL library for the binding's tests on machines without GPUs. It exports the calls
// package nccl binds, with NCCL's prototypes and results, and moves data between the ranks of
// ONE process: "device pointers" are host addresses (the fake CUDA driver keeps device memory
// in host memory) and streams are ignored, so an operation is complete when the group that
// posted it ends.
//
// Point-to-point: each clique keeps, per (destination, source) pair, a FIFO of posted sends.
// At the outermost ncclGroupEnd a thread posts every send of its group, then takes the
// matching send for every receive of the group (in order, waiting for it), copies the data,
// and finally waits until its own sends have been taken, so that the caller may reuse its
// buffers when ncclGroupEnd returns. A failure (a size mismatch, a timeout, ncclCommAbort)
// aborts the whole clique: every waiter wakes and every later call fails with that error,
// so no test hangs.
//
// Environment: FAKENCCL_INIT_ERROR (an ncclResult_t the init calls return),
// FAKENCCL_INIT_TIMEOUT_MS (how long ncclCommInitRankScalable waits for the other ranks,
// default 5000), FAKENCCL_TIMEOUT_MS (how long a group waits for its peers, default 60000).
//
// Not modelled: collectives, non-blocking communicators (the config is ignored), init calls
// inside a group (they run at once), and the CUDA device of a rank made by
// ncclCommInitRankScalable, which the fake cannot see: it reports the rank.
//
// Built by fakenccl.Build.
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int ncclResult_t;
typedef int ncclDataType_t;
typedef void *cudaStream_t;
typedef struct ncclConfig ncclConfig_t; // opaque here: the fake ignores it

enum {
	ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
	ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6, ncclInProgress = 7,
};

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;

#define VERSION 22304 // 2.23.4: the first version with ncclCommInitRankScalable is 2.23
#define MAGIC "FAKENCCL"
#define MSG 320

struct op {
	struct ncclComm *comm; // the rank that posted it
	int send;              // 1: ncclSend, 0: ncclRecv
	int peer;
	void *buf;
	size_t bytes;
	struct op *next; // in the destination's FIFO
	int in_fifo;     // posted and not yet taken: the clique frees it if its sender gave up
	int consumed;    // the receiver has copied the data
};

struct ncclComm {
	struct clique *cl;
	int rank, dev;
	int joined; // the rank has joined its clique
	int live;   // not destroyed or aborted
	char msg[MSG];
};
typedef struct ncclComm *ncclComm_t;

struct clique {
	char id[NCCL_UNIQUE_ID_BYTES]; // ncclCommInitRankScalable's id; zero for ncclCommInitAll
	int nranks, joined;
	int refs;            // live communicators and group calls under way
	ncclResult_t error;  // set when the clique is aborted: every later call fails with it
	char errmsg[MSG];
	struct ncclComm *comms;    // [nranks]
	struct op **head, **tail;  // FIFO of sends from src to dst at [dst*nranks + src]
	struct clique *next;       // in forming, while its ranks join
};

// One lock and one condition variable for everything: a group may span several cliques, and
// the fake favours being obviously right over being fast.
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv;
static struct clique *forming; // cliques of ncclCommInitRankScalable still waiting for ranks
static uint64_t idcounter;

static __thread char last[MSG];    // the calling thread's last error
static __thread char lastret[MSG]; // a copy of a communicator's message, for ncclGetLastError

// The group state is per thread, as in NCCL.
static __thread int depth;
static __thread struct op **gops;
static __thread int ngops, capgops;
static __thread ncclResult_t group_err;

__attribute__((constructor)) static void init_cv(void) {
	pthread_condattr_t a;
	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(&cv, &a);
	pthread_condattr_destroy(&a);
}

static int env_int(const char *name, int def) {
	const char *v = getenv(name);
	return v && *v ? atoi(v) : def;
}

// fail records an error message for the calling thread and, when c is given, for the
// communicator (the caller holds mu then), and returns r.
static ncclResult_t fail(struct ncclComm *c, ncclResult_t r, const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(last, sizeof last, fmt, ap);
	va_end(ap);
	if (c) memcpy(c->msg, last, sizeof last);
	return r;
}

static struct timespec deadline(int ms) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	t.tv_sec += ms / 1000;
	t.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (t.tv_nsec >= 1000000000L) {
		t.tv_sec++;
		t.tv_nsec -= 1000000000L;
	}
	return t;
}

// timedwait waits on cv (mu held) and reports whether the deadline has passed.
static int timedwait(const struct timespec *dl) {
	return pthread_cond_timedwait(&cv, &mu, dl) == ETIMEDOUT;
}

static size_t type_size(ncclDataType_t t) {
	static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
	return t >= 0 && t < (int)(sizeof sizes / sizeof sizes[0]) ? sizes[t] : 0;
}

static struct clique *clique_new(int nranks) {
	struct clique *cl = calloc(1, sizeof *cl);
	cl->nranks = nranks;
	cl->comms = calloc(nranks, sizeof *cl->comms);
	cl->head = calloc((size_t)nranks * nranks, sizeof *cl->head);
	cl->tail = calloc((size_t)nranks * nranks, sizeof *cl->tail);
	for (int i = 0; i < nranks; i++) {
		cl->comms[i].cl = cl;
		cl->comms[i].rank = i;
		cl->comms[i].dev = i;
	}
	return cl;
}

// clique_unref drops one reference (mu held) and frees the clique with the last one, with the
// sends its FIFOs still hold: their senders gave up on them.
static void clique_unref(struct clique *cl) {
	if (--cl->refs > 0) return;
	for (int i = 0; i < cl->nranks * cl->nranks; i++) {
		for (struct op *o = cl->head[i], *next; o; o = next) {
			next = o->next;
			free(o);
		}
	}
	free(cl->head);
	free(cl->tail);
	free(cl->comms);
	free(cl);
}

// clique_abort makes every later call of the clique fail with r and msg, and wakes every
// waiter (mu held). The first error stays.
static void clique_abort(struct clique *cl, ncclResult_t r, const char *msg) {
	if (!cl->error) {
		cl->error = r;
		snprintf(cl->errmsg, sizeof cl->errmsg, "%s", msg);
		for (int i = 0; i < cl->nranks; i++) memcpy(cl->comms[i].msg, cl->errmsg, MSG);
	}
	pthread_cond_broadcast(&cv);
}

static void forming_remove(struct clique *cl) {
	for (struct clique **p = &forming; *p; p = &(*p)->next) {
		if (*p == cl) {
			*p = cl->next;
			return;
		}
	}
}

static ncclResult_t init_error(void) {
	int e = env_int("FAKENCCL_INIT_ERROR", 0);
	return e ? fail(NULL, e, "fake NCCL: FAKENCCL_INIT_ERROR=%d", e) : ncclSuccess;
}

ncclResult_t ncclGetVersion(int *version) {
	if (!version) return fail(NULL, ncclInvalidArgument, "fake NCCL: ncclGetVersion: NULL version");
	*version = VERSION;
	return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
	switch (r) {
	case ncclSuccess: return "no error";
	case ncclUnhandledCudaError: return "unhandled cuda error";
	case ncclSystemError: return "unhandled system error";
	case ncclInternalError: return "internal error";
	case ncclInvalidArgument: return "invalid argument";
	case ncclInvalidUsage: return "invalid usage";
	case ncclRemoteError: return "remote process exited or there was a network error";
	case ncclInProgress: return "NCCL operation in progress";
	}
	return "unknown result code";
}

// ncclGetLastError gives the communicator's last error when it has one, else the calling
// thread's (NCCL itself keeps one message for the process).
const char *ncclGetLastError(ncclComm_t comm) {
	if (comm) {
		pthread_mutex_lock(&mu);
		int has = comm->msg[0] != 0;
		if (has) memcpy(lastret, comm->msg, MSG);
		pthread_mutex_unlock(&mu);
		if (has) return lastret;
	}
	return last;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
	if (!id) return fail(NULL, ncclInvalidArgument, "fake NCCL: ncclGetUniqueId: NULL id");
	memset(id, 0, sizeof *id);
	uint64_t n = __atomic_add_fetch(&idcounter, 1, __ATOMIC_RELAXED);
	uint32_t pid = (uint32_t)getpid();
	memcpy(id->internal, MAGIC, 8);
	memcpy(id->internal + 8, &pid, sizeof pid);
	memcpy(id->internal + 16, &n, sizeof n);
	return ncclSuccess;
}

// ncclCommInitRankScalable joins the clique named by commIds[0] and, as NCCL does, waits
// until all nranks ranks have joined; after FAKENCCL_INIT_TIMEOUT_MS it gives up instead.
ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId *commIds, ncclConfig_t *config) {
	(void)config;
	ncclResult_t r = init_error();
	if (r) return r;
	if (!newcomm || !commIds) return fail(NULL, ncclInvalidArgument, "fake NCCL: NULL newcomm or commIds");
	if (nranks < 1 || myrank < 0 || myrank >= nranks)
		return fail(NULL, ncclInvalidArgument, "fake NCCL: rank %d of %d ranks", myrank, nranks);
	if (nId < 1 || nId > nranks)
		return fail(NULL, ncclInvalidArgument, "fake NCCL: nId %d is not in 1..%d", nId, nranks);
	if (memcmp(commIds[0].internal, MAGIC, 8) != 0)
		return fail(NULL, ncclInvalidArgument, "fake NCCL: the unique id was not made by ncclGetUniqueId");
	int ms = env_int("FAKENCCL_INIT_TIMEOUT_MS", 5000);
	struct timespec dl = deadline(ms);

	pthread_mutex_lock(&mu);
	struct clique *cl = forming;
	while (cl && memcmp(cl->id, commIds[0].internal, NCCL_UNIQUE_ID_BYTES) != 0) cl = cl->next;
	if (!cl) {
		cl = clique_new(nranks);
		memcpy(cl->id, commIds[0].internal, NCCL_UNIQUE_ID_BYTES);
		cl->next = forming;
		forming = cl;
	} else if (cl->nranks != nranks) {
		r = fail(NULL, ncclInvalidUsage, "fake NCCL: rank %d joins with %d ranks, the others with %d",
		         myrank, nranks, cl->nranks);
		pthread_mutex_unlock(&mu);
		return r;
	}
	struct ncclComm *c = &cl->comms[myrank];
	if (c->joined) {
		r = fail(NULL, ncclInvalidUsage, "fake NCCL: rank %d joined twice", myrank);
		pthread_mutex_unlock(&mu);
		return r;
	}
	c->joined = 1;
	cl->joined++;
	cl->refs++;
	if (cl->joined == nranks) {
		forming_remove(cl);
		pthread_cond_broadcast(&cv);
	}
	while (cl->joined < nranks) {
		if (timedwait(&dl) && cl->joined < nranks) {
			c->joined = 0;
			cl->joined--;
			int joined = cl->joined;
			if (joined == 0) forming_remove(cl);
			clique_unref(cl);
			r = fail(NULL, ncclSystemError, "fake NCCL: rank %d timed out after %d ms: %d of %d ranks joined",
			         myrank, ms, joined + 1, nranks);
			pthread_mutex_unlock(&mu);
			return r;
		}
	}
	c->live = 1;
	pthread_mutex_unlock(&mu);
	*newcomm = c;
	return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
	return ncclCommInitRankScalable(comm, nranks, rank, 1, &commId, NULL);
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
	ncclResult_t r = init_error();
	if (r) return r;
	if (!comms || ndev < 1) return fail(NULL, ncclInvalidArgument, "fake NCCL: ncclCommInitAll of %d devices", ndev);
	for (int i = 0; devlist && i < ndev; i++) {
		if (devlist[i] < 0) return fail(NULL, ncclInvalidArgument, "fake NCCL: device %d", devlist[i]);
		for (int j = 0; j < i; j++) {
			if (devlist[i] == devlist[j])
				return fail(NULL, ncclInvalidUsage, "fake NCCL: device %d is listed twice", devlist[i]);
		}
	}
	pthread_mutex_lock(&mu);
	struct clique *cl = clique_new(ndev);
	cl->joined = cl->refs = ndev;
	for (int i = 0; i < ndev; i++) {
		cl->comms[i].joined = cl->comms[i].live = 1;
		cl->comms[i].dev = devlist ? devlist[i] : i;
		comms[i] = &cl->comms[i];
	}
	pthread_mutex_unlock(&mu);
	return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
	if (!comm || !count) return fail(NULL, ncclInvalidArgument, "fake NCCL: ncclCommCount: NULL argument");
	*count = comm->cl->nranks;
	return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
	if (!comm || !rank) return fail(NULL, ncclInvalidArgument, "fake NCCL: ncclCommUserRank: NULL argument");
	*rank = comm->rank;
	return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
	if (!comm || !device) return fail(NULL, ncclInvalidArgument, "fake NCCL: ncclCommCuDevice: NULL argument");
	*device = comm->dev;
	return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
	if (!comm || !asyncError) return fail(NULL, ncclInvalidArgument, "fake NCCL: ncclCommGetAsyncError: NULL argument");
	pthread_mutex_lock(&mu);
	*asyncError = comm->cl->error;
	pthread_mutex_unlock(&mu);
	return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
	if (!comm) return ncclSuccess; // as NCCL
	pthread_mutex_lock(&mu);
	comm->live = 0;
	clique_unref(comm->cl);
	pthread_mutex_unlock(&mu);
	return ncclSuccess;
}

// ncclCommAbort may be called from another thread while comm's own thread waits in
// ncclGroupEnd: the clique stays allocated until that group call lets go of it.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
	if (!comm) return ncclSuccess;
	pthread_mutex_lock(&mu);
	clique_abort(comm->cl, ncclRemoteError, "fake NCCL: communicator aborted");
	comm->live = 0;
	clique_unref(comm->cl);
	pthread_mutex_unlock(&mu);
	return ncclSuccess;
}

// run_group carries out the operations one thread posted in one group.
static ncclResult_t run_group(struct op **ops, int n) {
	ncclResult_t r = ncclSuccess;
	int ms = env_int("FAKENCCL_TIMEOUT_MS", 60000);
	struct timespec dl = deadline(ms);
	char msg[MSG];
	pthread_mutex_lock(&mu);
	for (int i = 0; i < n; i++) ops[i]->comm->cl->refs++;
	for (int i = 0; i < n; i++) {
		struct ncclComm *c = ops[i]->comm;
		if (c->cl->error) {
			r = fail(c, c->cl->error, "%s", c->cl->errmsg);
			goto out;
		}
		if (!c->live) {
			r = fail(c, ncclInvalidUsage, "fake NCCL: rank %d's communicator was destroyed", c->rank);
			goto out;
		}
	}
	for (int i = 0; i < n; i++) {
		struct op *o = ops[i];
		if (!o->send) continue;
		struct clique *cl = o->comm->cl;
		int k = o->peer * cl->nranks + o->comm->rank;
		if (cl->tail[k]) cl->tail[k]->next = o;
		else cl->head[k] = o;
		cl->tail[k] = o;
		o->in_fifo = 1;
	}
	pthread_cond_broadcast(&cv);
	for (int i = 0; i < n; i++) {
		struct op *o = ops[i];
		if (o->send) continue;
		struct clique *cl = o->comm->cl;
		int k = o->comm->rank * cl->nranks + o->peer;
		while (!cl->error && !cl->head[k]) {
			if (timedwait(&dl) && !cl->error && !cl->head[k]) {
				snprintf(msg, sizeof msg, "fake NCCL: rank %d waited %d ms for a send from rank %d",
				         o->comm->rank, ms, o->peer);
				clique_abort(cl, ncclSystemError, msg);
			}
		}
		if (cl->error) {
			r = fail(o->comm, cl->error, "%s", cl->errmsg);
			goto out;
		}
		struct op *s = cl->head[k];
		if (s->bytes != o->bytes) {
			snprintf(msg, sizeof msg, "fake NCCL: rank %d receives %zu bytes from rank %d, which sends %zu",
			         o->comm->rank, o->bytes, o->peer, s->bytes);
			clique_abort(cl, ncclInvalidUsage, msg);
			r = fail(o->comm, cl->error, "%s", cl->errmsg);
			goto out;
		}
		cl->head[k] = s->next;
		if (!cl->head[k]) cl->tail[k] = NULL;
		s->next = NULL;
		s->in_fifo = 0;
		// Under the lock, so that an aborted sender cannot return while its buffer is read.
		if (o->bytes) memcpy(o->buf, s->buf, o->bytes);
		s->consumed = 1;
		pthread_cond_broadcast(&cv);
	}
	for (int i = 0; i < n; i++) {
		struct op *o = ops[i];
		if (!o->send) continue;
		struct clique *cl = o->comm->cl;
		while (!cl->error && !o->consumed) {
			if (timedwait(&dl) && !cl->error && !o->consumed) {
				snprintf(msg, sizeof msg, "fake NCCL: rank %d waited %d ms for rank %d to receive",
				         o->comm->rank, ms, o->peer);
				clique_abort(cl, ncclSystemError, msg);
			}
		}
		if (!o->consumed) {
			r = fail(o->comm, cl->error, "%s", cl->errmsg);
			goto out;
		}
	}
out:
	for (int i = 0; i < n; i++) {
		struct clique *cl = ops[i]->comm->cl;
		if (!ops[i]->in_fifo) free(ops[i]); // else the clique frees it: a receiver may still look at it
		clique_unref(cl);
	}
	pthread_mutex_unlock(&mu);
	return r;
}

static void group_reset(void) {
	for (int i = 0; i < ngops; i++) free(gops[i]);
	free(gops);
	gops = NULL;
	ngops = capgops = 0;
	group_err = ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
	depth++;
	return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
	if (depth == 0) return fail(NULL, ncclInvalidUsage, "fake NCCL: ncclGroupEnd without ncclGroupStart");
	if (--depth > 0) return ncclSuccess;
	ncclResult_t r = group_err;
	if (r) {
		// An operation of the group was refused: NCCL fails the whole group with its error.
		group_reset();
		return r;
	}
	struct op **ops = gops;
	int n = ngops;
	gops = NULL;
	ngops = capgops = 0;
	if (n) r = run_group(ops, n);
	free(ops);
	return r;
}

// post checks one send or receive and adds it to the thread's group; outside a group it runs
// as a group of one.
static ncclResult_t post(const char *call, int send, void *buf, size_t count, ncclDataType_t dt, int peer,
                         ncclComm_t comm) {
	ncclResult_t r = ncclSuccess;
	size_t size = type_size(dt);
	if (!comm) {
		r = fail(NULL, ncclInvalidArgument, "fake NCCL: %s: NULL communicator", call);
	} else {
		pthread_mutex_lock(&mu);
		if (!size)
			r = fail(comm, ncclInvalidArgument, "fake NCCL: %s: invalid data type %d", call, dt);
		else if (peer < 0 || peer >= comm->cl->nranks)
			r = fail(comm, ncclInvalidArgument, "fake NCCL: %s: peer %d is not a rank of %d", call, peer,
			         comm->cl->nranks);
		else if (count > SIZE_MAX / size)
			r = fail(comm, ncclInvalidArgument, "fake NCCL: %s: count %zu overflows", call, count);
		else if (count && !buf)
			r = fail(comm, ncclInvalidArgument, "fake NCCL: %s: NULL buffer", call);
		pthread_mutex_unlock(&mu);
	}
	if (r) {
		if (depth > 0 && !group_err) group_err = r;
		return r;
	}
	struct op *o = calloc(1, sizeof *o);
	o->comm = comm;
	o->send = send;
	o->peer = peer;
	o->buf = buf;
	o->bytes = count * size;
	if (depth == 0) {
		r = run_group(&o, 1);
		return r;
	}
	if (ngops == capgops) {
		capgops = capgops ? 2 * capgops : 16;
		gops = realloc(gops, capgops * sizeof *gops);
	}
	gops[ngops++] = o;
	return ncclSuccess;
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
	(void)stream;
	return post("ncclSend", 1, (void *)sendbuff, count, datatype, peer, comm);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
	(void)stream;
	return post("ncclRecv", 0, recvbuff, count, datatype, peer, comm);
}
