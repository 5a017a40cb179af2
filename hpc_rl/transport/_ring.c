/* The experience ring's hot paths, in C: the MPI calls of a writer's batch and of an owner's poll
 * (docs/transport.md, section 5).
 *
 * Written in Python, a put spent ~15 us in the interpreter around ~1 us of MPI calls (the transport benchmark's cost
 * model), and an owner ~6 us per segment it took and freed: either kept 64 KiB segments under 0.8x the bare Put.
 * Only the common case lives here:
 *   Writer.put:   checks the batch (sizes), then the ticket Fetch_and_op and the claim's first read (Get_accumulate
 *                 NO_OP of the state words of the tickets the writer expects), one Flush (a second read if another
 *                 writer put in between); once every slot is FREE for its ticket, the payload Puts and one header
 *                 Put per run of slots, Flush, READY by Accumulate(REPLACE) per run, Flush;
 *   Owner.take:   Win_sync, the READY slots not lent out (under drop_oldest each shut to writers by a CAS to
 *                 TAKEN), their header rows in ticket order;
 *   Owner.free:   FREE(t + N) into the state words of the slots given back, one Accumulate(REPLACE) per run, Flush.
 * Waiting for a slot and steals (the claim callback Writer.put is given), checking what the owner takes, the segments'
 * views and the errors of the protocol stay in rma.py. The window is mpi4py's, passed by its Fortran handle.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <mpi.h>
#include <stdint.h>

/* These mirror hpc_rl/transport/layout.py and rma.py; tests/test_transport_units.py compares them. */
#define TICKET_BITS 30
#define TICKET_MASK ((UINT64_C(1) << TICKET_BITS) - 1)
#define PHASE_READY 2
#define HEADER_BYTES 64
#define HEADER_WORDS (HEADER_BYTES / 8) /* a header row: nbytes, writer, seq, checksum, ticket, after, kind, 1 unused */
#define NO_TICKET UINT64_MAX           /* `after` of a writer's first segment, and of void rows */
#define KIND_SEGMENT 0
#define KIND_VOID 1                    /* a ticket whose put gave up, filled with nothing (rma.py) */

#define PHASE_TAKEN 3

/* layout.free_for: the state of a slot only ticket `ticket` may fill */
static inline uint32_t free_for(uint64_t ticket) { return (uint32_t)((ticket & TICKET_MASK) << 2); }

/* FREE(t + slots) for a slot in READY(t) or TAKEN(t), modulo 2^32 like the ticket's low 30 bits times 4 */
static inline uint32_t freed(uint32_t state, int slots) {
    return (state | PHASE_TAKEN) + 4 * (uint32_t)slots - PHASE_TAKEN;
}

typedef struct {
    PyObject_HEAD
    MPI_Win win; /* MPI_WIN_NULL after close() */
    int owner, slots;
    uint64_t rank;
    Py_ssize_t slot_bytes;
    MPI_Aint ticket_at, states_at, headers_at, payloads_at, stride;
    uint64_t next_ticket;             /* the ticket after this writer's last batch: its guess for the next one */
    uint64_t last_published;          /* the ticket of this writer's last segment made READY, or NO_TICKET */
    uint64_t ticket_add, ticket_old;
    uint64_t *headers;                /* slots header rows: a batch's, untouched until its first Flush */
    uint32_t *noop, *found, *words;   /* slots words each: NO_OP origin, states read, READY words */
    Py_buffer *views;                 /* slots payload buffers of the batch being published */
} Writer;

/* A batch of `count` tickets from `first` maps to one run of slots, or two when it wraps past the last slot. */
typedef struct {
    int offset, slot, length;
} Run;

static int runs_of(const Writer *w, uint64_t first, int count, Run runs[2]) {
    int slot = (int)(first % (uint64_t)w->slots);
    int head = count < w->slots - slot ? count : w->slots - slot;
    runs[0] = (Run){0, slot, head};
    runs[1] = (Run){head, 0, count - head};
    return count > head ? 2 : 1;
}

typedef struct {
    int code;         /* of the first MPI call that failed, MPI_SUCCESS if none */
    const char *call; /* its name */
} Failure;

#define CHECK(failure, call, name)                               \
    do {                                                         \
        int code_ = (call);                                      \
        if (code_ != MPI_SUCCESS && (failure)->code == MPI_SUCCESS) \
            *(failure) = (Failure){code_, (name)};               \
    } while (0)

static PyObject *mpi_error(Failure failure) {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(failure.code, text, &length);
    return PyErr_Format(PyExc_RuntimeError, "transport ring: %s failed: %.*s", failure.call, length, text);
}

/* 1, or 0 with ValueError once close() has forgotten the window */
static int open_or_raise(MPI_Win win) {
    if (win == MPI_WIN_NULL) {
        PyErr_SetString(PyExc_ValueError, "transport ring: the ring is closed");
        return 0;
    }
    return 1;
}

static void Writer_dealloc(Writer *w) {
    PyMem_Free(w->headers);
    PyMem_Free(w->noop);
    PyMem_Free(w->found);
    PyMem_Free(w->words);
    PyMem_Free(w->views);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static int Writer_init(Writer *w, PyObject *args, PyObject *kwds) {
    static char *names[] = {"fortran_win", "owner", "rank", "slots", "slot_bytes", "ticket_at", "states_at",
                            "headers_at", "payloads_at", "stride", NULL};
    long long fwin, ticket_at, states_at, headers_at, payloads_at, stride;
    unsigned long long rank;
    if (w->headers) {
        PyErr_SetString(PyExc_TypeError, "transport ring: a Writer is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "LiKinLLLLL", names, &fwin, &w->owner, &rank, &w->slots,
                                     &w->slot_bytes, &ticket_at, &states_at, &headers_at, &payloads_at, &stride))
        return -1;
    if (w->slots < 1 || w->slot_bytes < 1 || w->slot_bytes > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "transport ring: need slots >= 1 and 1 <= slot_bytes <= %d", INT_MAX);
        return -1;
    }
    w->win = MPI_Win_f2c((MPI_Fint)fwin);
    w->rank = rank;
    w->ticket_at = ticket_at, w->states_at = states_at, w->headers_at = headers_at;
    w->payloads_at = payloads_at, w->stride = stride;
    size_t n = (size_t)w->slots;
    w->headers = PyMem_Calloc(n * HEADER_WORDS, sizeof(uint64_t));
    w->noop = PyMem_Calloc(n, sizeof(uint32_t));
    w->found = PyMem_Calloc(n, sizeof(uint32_t));
    w->words = PyMem_Calloc(n, sizeof(uint32_t));
    w->views = PyMem_Calloc(n, sizeof(Py_buffer));
    if (!w->headers || !w->noop || !w->found || !w->words || !w->views) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < n; i++) w->headers[i * HEADER_WORDS + 1] = rank; /* the writer column never changes */
    w->last_published = NO_TICKET;
    return 0;
}

/* Issue atomic reads of the state words of tickets first .. first + count - 1; complete at the next Flush. */
static int read_states(Writer *w, uint64_t first, int count) {
    Run runs[2];
    int n = runs_of(w, first, count, runs), code = MPI_SUCCESS;
    for (int r = 0; r < n && code == MPI_SUCCESS; r++)
        code = MPI_Get_accumulate(w->noop + runs[r].offset, runs[r].length, MPI_UINT32_T, w->found + runs[r].offset,
                                  runs[r].length, MPI_UINT32_T, w->owner, w->states_at + runs[r].slot * 4,
                                  runs[r].length, MPI_UINT32_T, MPI_NO_OP, w->win);
    return code;
}

/* The ticket Fetch_and_op and the claim's first read, for the tickets the writer expects (`next_ticket`): the read
 * need not follow the fetch, since a slot found in FREE(t) stays so until the holder of ticket t fills it. One Flush
 * completes both; a wrong guess (another writer put in between) reads again. Returns the first ticket; `*all_free`:
 * every slot is FREE for its ticket. */
static uint64_t take_tickets(Writer *w, int k, int *all_free, Failure *failure) {
    uint64_t guess = w->next_ticket, first;
    w->ticket_add = (uint64_t)k;
    CHECK(failure,
          MPI_Fetch_and_op(&w->ticket_add, &w->ticket_old, MPI_UINT64_T, w->owner, w->ticket_at, MPI_SUM, w->win),
          "MPI_Fetch_and_op (ticket)");
    CHECK(failure, read_states(w, guess, k), "MPI_Get_accumulate (claim read)");
    CHECK(failure, MPI_Win_flush(w->owner, w->win), "MPI_Win_flush");
    first = w->ticket_old;
    if (failure->code == MPI_SUCCESS && first != guess) {
        CHECK(failure, read_states(w, first, k), "MPI_Get_accumulate (claim read)");
        CHECK(failure, MPI_Win_flush(w->owner, w->win), "MPI_Win_flush");
    }
    w->next_ticket = first + (uint64_t)k;
    *all_free = 1;
    for (int i = 0; i < k; i++) *all_free &= w->found[i] == free_for(first + (uint64_t)i);
    return first;
}

/* Payloads and header rows (R4: complete at the owner before any READY can be seen), then READY(t) per run.
 * A segment's row names the writer's previous segment (`after`): the owner takes it only once that one is taken
 * (Owner.take). Void rows (kind KIND_VOID) carry no payload and name none. */
static void publish(Writer *w, uint64_t first, int k, uint64_t kind, Failure *failure) {
    Run runs[2];
    int nruns = runs_of(w, first, k, runs);
    for (int i = 0; i < k; i++) {
        uint64_t *row = w->headers + i * HEADER_WORDS;
        row[4] = first + (uint64_t)i;
        row[6] = kind;
        if (kind == KIND_VOID) {
            row[0] = row[2] = row[3] = 0;
            row[5] = NO_TICKET;
            continue;
        }
        row[5] = i == 0 ? w->last_published : first + (uint64_t)i - 1;
        MPI_Aint at = w->payloads_at + (MPI_Aint)((first + (uint64_t)i) % (uint64_t)w->slots) * w->stride;
        int bytes = (int)w->views[i].len;
        CHECK(failure, MPI_Put(w->views[i].buf, bytes, MPI_BYTE, w->owner, at, bytes, MPI_BYTE, w->win),
              "MPI_Put (payload)");
    }
    for (int r = 0; r < nruns; r++) {
        int bytes = runs[r].length * HEADER_BYTES;
        CHECK(failure,
              MPI_Put(w->headers + runs[r].offset * HEADER_WORDS, bytes, MPI_BYTE, w->owner,
                      w->headers_at + (MPI_Aint)runs[r].slot * HEADER_BYTES, bytes, MPI_BYTE, w->win),
              "MPI_Put (headers)");
    }
    CHECK(failure, MPI_Win_flush(w->owner, w->win), "MPI_Win_flush");
    for (int i = 0; i < k; i++) w->words[i] = free_for(first + (uint64_t)i) + PHASE_READY;
    for (int r = 0; r < nruns; r++)
        CHECK(failure,
              MPI_Accumulate(w->words + runs[r].offset, runs[r].length, MPI_UINT32_T, w->owner,
                             w->states_at + (MPI_Aint)runs[r].slot * 4, runs[r].length, MPI_UINT32_T, MPI_REPLACE,
                             w->win),
              "MPI_Accumulate (READY)");
    CHECK(failure, MPI_Win_flush(w->owner, w->win), "MPI_Win_flush");
    if (kind == KIND_SEGMENT) w->last_published = first + (uint64_t)k - 1;
}

static PyObject *Writer_put(Writer *w, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) return PyErr_Format(PyExc_TypeError, "put(payloads, seq, checksums, claim, timeout_s) takes 5 "
                                        "arguments");
    if (!open_or_raise(w->win)) return NULL;
    PyObject *payloads = args[0], *sums = args[2], *claim = args[3], *timeout_s = args[4];
    unsigned long long seq = PyLong_AsUnsignedLongLong(args[1]);
    if (seq == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    if (!PyList_CheckExact(payloads) || (sums != Py_None && !PyList_CheckExact(sums)) || !PyCallable_Check(claim))
        return PyErr_Format(PyExc_TypeError, "put takes a list of payloads, a list of checksums or None, a callable");
    Py_ssize_t k = PyList_GET_SIZE(payloads);
    if (k < 1 || k > w->slots || (sums != Py_None && PyList_GET_SIZE(sums) != k))
        return PyErr_Format(PyExc_ValueError, "transport ring: a batch is 1 to %d payloads with a checksum each",
                            w->slots);
    /* Everything is checked before the first ticket is taken: a ticket taken is a slot the ring waits for. */
    Py_ssize_t held = 0;
    for (; held < k; held++) {
        uint64_t *row = w->headers + held * HEADER_WORDS;
        if (PyObject_GetBuffer(PyList_GET_ITEM(payloads, held), &w->views[held], PyBUF_SIMPLE) < 0) goto release;
        if (w->views[held].len > w->slot_bytes) {
            PyErr_Format(PyExc_ValueError, "segment of %zd bytes exceeds slot_bytes=%zd", w->views[held].len,
                         w->slot_bytes);
            held++;
            goto release;
        }
        row[0] = (uint64_t)w->views[held].len;
        row[2] = seq + (uint64_t)held;
        if (sums != Py_None) {
            row[3] = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(sums, held));
            if (PyErr_Occurred()) {
                held++;
                goto release;
            }
        }
    }
    Failure failure = {MPI_SUCCESS, NULL};
    int all_free;
    uint64_t first;
    Py_BEGIN_ALLOW_THREADS
    first = take_tickets(w, (int)k, &all_free, &failure);
    if (failure.code == MPI_SUCCESS && all_free) publish(w, first, (int)k, KIND_SEGMENT, &failure);
    Py_END_ALLOW_THREADS
    if (failure.code == MPI_SUCCESS && !all_free) {
        /* a slot still holds an earlier round's segment: rma.py waits for it (or steals it, drop_oldest) */
        PyObject *done = PyObject_CallFunction(claim, "KnO", (unsigned long long)first, k, timeout_s);
        if (!done) goto release;
        Py_DECREF(done);
        Py_BEGIN_ALLOW_THREADS
        publish(w, first, (int)k, KIND_SEGMENT, &failure);
        Py_END_ALLOW_THREADS
    }
    for (Py_ssize_t i = 0; i < k; i++) PyBuffer_Release(&w->views[i]);
    if (failure.code != MPI_SUCCESS) return mpi_error(failure);
    Py_RETURN_NONE;
release:
    for (Py_ssize_t i = 0; i < held; i++) PyBuffer_Release(&w->views[i]);
    return NULL;
}

static PyObject *Writer_void(Writer *w, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) return PyErr_Format(PyExc_TypeError, "void(first_ticket, count) takes 2 arguments");
    if (!open_or_raise(w->win)) return NULL;
    unsigned long long first = PyLong_AsUnsignedLongLong(args[0]);
    long count = PyLong_AsLong(args[1]);
    if (PyErr_Occurred()) return NULL;
    if (count < 1 || count > w->slots)
        return PyErr_Format(PyExc_ValueError, "transport ring: void fills 1 to %d tickets", w->slots);
    Failure failure = {MPI_SUCCESS, NULL};
    Py_BEGIN_ALLOW_THREADS
    publish(w, (uint64_t)first, (int)count, KIND_VOID, &failure);
    Py_END_ALLOW_THREADS
    if (failure.code != MPI_SUCCESS) return mpi_error(failure);
    Py_RETURN_NONE;
}

static PyObject *Writer_close(Writer *w, PyObject *unused) {
    (void)unused;
    w->win = MPI_WIN_NULL;
    Py_RETURN_NONE;
}

static PyMethodDef Writer_methods[] = {
    {"put", (PyCFunction)(void (*)(void))Writer_put, METH_FASTCALL,
     "put(payloads, seq, checksums, claim, timeout_s): hand a batch (a list of at most `slots` bytes-like objects) "
     "to the owner with seqs seq, seq + 1, ... and the given checksums (0 when None). When a slot is not yet FREE "
     "for its ticket, calls claim(first_ticket, count, timeout_s), which returns once every slot is this writer's."},
    {"void", (PyCFunction)(void (*)(void))Writer_void, METH_FASTCALL,
     "void(first_ticket, count): make the slots of tickets first_ticket .. first_ticket + count - 1, which must be "
     "this writer's (FREE for their tickets, or stolen), READY with void rows: no payload, nothing for the owner to "
     "hand out; what a put that gave up after taking its tickets leaves."},
    {"close", (PyCFunction)Writer_close, METH_NOARGS, "forget the window (it is being freed); later calls raise"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hpc_rl.transport._ring.Writer",
    .tp_basicsize = sizeof(Writer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Writer(fortran_win, owner, rank, slots, slot_bytes, ticket_at, states_at, headers_at, payloads_at, "
              "stride): one writer's view of one experience ring (byte offsets in the owner's window).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Writer_init,
    .tp_dealloc = (destructor)Writer_dealloc,
    .tp_methods = Writer_methods,
};

/* ---- the owner --------------------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    MPI_Win win; /* MPI_WIN_NULL after close() */
    int rank, slots;
    Py_buffer mem;                    /* the owner's window memory (held from init to close) */
    const volatile uint32_t *states;  /* its state words, written by RMA calls of other ranks */
    const uint64_t *headers;          /* its header table */
    const volatile uint64_t *ticket;  /* its ticket counter, added to by writers */
    MPI_Aint states_at;
    unsigned char *held;              /* slots lent out by take() until free() */
    uint32_t *seen, *words;           /* states loaded by take(); FREE words stored by free(), READY words restored */
    uint64_t *due;                    /* per slot, the lowest ticket it has not yet handed out (take()) */
    int *candidates;                  /* READY slots take() may take (under drop_oldest: TAKEN now), by ticket */
    int *taken;                       /* those it takes, in ticket order */
} Owner;

static void Owner_release_memory(Owner *o) {
    if (o->mem.obj) PyBuffer_Release(&o->mem);
    o->states = NULL, o->headers = NULL;
}

static void Owner_dealloc(Owner *o) {
    Owner_release_memory(o);
    PyMem_Free(o->held);
    PyMem_Free(o->seen);
    PyMem_Free(o->words);
    PyMem_Free(o->due);
    PyMem_Free(o->candidates);
    PyMem_Free(o->taken);
    Py_TYPE(o)->tp_free((PyObject *)o);
}

static int Owner_init(Owner *o, PyObject *args, PyObject *kwds) {
    static char *names[] = {"fortran_win", "rank", "memory", "slots", "ticket_at", "states_at", "headers_at", NULL};
    long long fwin, ticket_at, states_at, headers_at;
    PyObject *memory;
    if (o->held) {
        PyErr_SetString(PyExc_TypeError, "transport ring: an Owner is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "LiOiLLL", names, &fwin, &o->rank, &memory, &o->slots, &ticket_at,
                                     &states_at, &headers_at))
        return -1;
    if (PyObject_GetBuffer(memory, &o->mem, PyBUF_SIMPLE) < 0) return -1;
    if (o->slots < 1 || ticket_at < 0 || ticket_at % 8 || ticket_at + 8 > o->mem.len ||
        states_at < 0 || states_at % 4 || headers_at % 8 ||
        states_at + 4 * (long long)o->slots > o->mem.len ||
        headers_at < 0 || headers_at + (long long)HEADER_BYTES * o->slots > o->mem.len) {
        PyErr_SetString(PyExc_ValueError, "transport ring: the ticket counter, state words and header table must lie "
                                          "in the window");
        return -1;
    }
    o->win = MPI_Win_f2c((MPI_Fint)fwin);
    o->states_at = (MPI_Aint)states_at;
    o->states = (const volatile uint32_t *)((char *)o->mem.buf + states_at);
    o->headers = (const uint64_t *)((char *)o->mem.buf + headers_at);
    o->ticket = (const volatile uint64_t *)((char *)o->mem.buf + ticket_at);
    size_t n = (size_t)o->slots;
    o->held = PyMem_Calloc(n, 1);
    o->seen = PyMem_Calloc(n, sizeof(uint32_t));
    o->words = PyMem_Calloc(n, sizeof(uint32_t));
    o->due = PyMem_Calloc(n, sizeof(uint64_t));
    o->candidates = PyMem_Calloc(n, sizeof(int));
    o->taken = PyMem_Calloc(n, sizeof(int));
    if (!o->held || !o->seen || !o->words || !o->due || !o->candidates || !o->taken) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* The full ticket of a state's low 30 bits: the latest ticket below `bound` with those bits. Every ticket in a
 * state word is below the ticket counter plus N (a slot is freed for t + N only once t was handed out). */
static inline uint64_t full_ticket(uint32_t state, uint64_t bound) {
    return bound - ((bound - (state >> 2)) & TICKET_MASK);
}

/* Per-writer order. A batch's READY words land one by one, and the owner loads N state words one by one, so one
 * load can find a writer's later segment READY and an earlier one not yet. Each header row names the writer's
 * previous segment (`after`); a segment is taken only once that one has been handed out (taken now or before, or
 * stolen under drop_oldest), i.e. once `after`'s slot is due a later ticket. Only READY segments are named, so
 * what holds a segment back is READY already and is taken at the next poll at the latest: the owner never waits
 * on a ticket whose writer gave up (void rows, rma.py). */
static PyObject *Owner_take(Owner *o, PyObject *steals_arg) {
    if (!open_or_raise(o->win)) return NULL;
    int steals = PyObject_IsTrue(steals_arg);
    if (steals < 0) return NULL;
    Failure failure = {MPI_SUCCESS, NULL};
    int candidates = 0, count = 0, restored = 0;
    long lost = 0;
    const uint64_t *headers = o->headers;
    uint64_t n = (uint64_t)o->slots;
    Py_BEGIN_ALLOW_THREADS
    CHECK(&failure, MPI_Win_sync(o->win), "MPI_Win_sync");
    for (int slot = 0; slot < o->slots; slot++) o->seen[slot] = o->states[slot];
    uint64_t bound = *o->ticket + n; /* loaded after the states: no state word carries a ticket past it */
    CHECK(&failure, MPI_Win_sync(o->win), "MPI_Win_sync"); /* header and payload loads after the state loads */
    for (int slot = 0; slot < o->slots && failure.code == MPI_SUCCESS; slot++) {
        uint32_t state = o->seen[slot];
        uint64_t ticket = full_ticket(state, bound);
        /* lent out: its ticket is handed out; FREE(t), WRITING(t): t is not; READY(t): decided below */
        o->due[slot] = o->held[slot] ? ticket + n : ticket;
        if ((state & 3) != PHASE_READY || o->held[slot]) continue;
        if (steals) { /* READY(t) -> TAKEN(t) shuts out writers, or a writer stole the slot first (it counted) */
            uint32_t origin = state | PHASE_TAKEN, compare = state, result = 0;
            CHECK(&failure, MPI_Compare_and_swap(&origin, &compare, &result, MPI_UINT32_T, o->rank,
                                       o->states_at + (MPI_Aint)slot * 4, o->win), "MPI_Compare_and_swap");
            CHECK(&failure, MPI_Win_flush(o->rank, o->win), "MPI_Win_flush");
            if (result != state) {
                lost++;
                o->due[slot] = ticket + n;
                continue;
            }
        }
        /* insertion into ticket order: a poll looks at most N slots */
        uint64_t header_ticket = headers[slot * HEADER_WORDS + 4];
        int at = candidates++;
        for (; at > 0 && headers[o->candidates[at - 1] * HEADER_WORDS + 4] > header_ticket; at--)
            o->candidates[at] = o->candidates[at - 1];
        o->candidates[at] = slot;
    }
    /* in ticket order, so that a writer's earlier segment is decided before its later one */
    for (int i = 0; i < candidates && failure.code == MPI_SUCCESS; i++) {
        int slot = o->candidates[i];
        const uint64_t *h = headers + slot * HEADER_WORDS;
        uint64_t after = h[5];
        if (h[6] == KIND_VOID || after == NO_TICKET || o->due[after % n] > after) {
            o->due[slot] = h[4] + n;
            o->taken[count++] = slot;
        } else if (steals) { /* not taken after all: READY again, for the owner's next poll or a writer's steal */
            o->words[slot] = o->seen[slot];
            CHECK(&failure,
                  MPI_Accumulate(o->words + slot, 1, MPI_UINT32_T, o->rank, o->states_at + (MPI_Aint)slot * 4, 1,
                                 MPI_UINT32_T, MPI_REPLACE, o->win),
                  "MPI_Accumulate (READY)");
            restored++;
        }
    }
    if (restored) CHECK(&failure, MPI_Win_flush(o->rank, o->win), "MPI_Win_flush");
    Py_END_ALLOW_THREADS
    /* The slots taken are lent out until free(); after a failed MPI call, every candidate (its word may be TAKEN
     * already), as before the order check. */
    if (failure.code != MPI_SUCCESS)
        for (count = 0; count < candidates; count++) o->taken[count] = o->candidates[count];
    for (int i = 0; i < count; i++) o->held[o->taken[i]] = 1;
    if (failure.code != MPI_SUCCESS) return mpi_error(failure);
    PyObject *rows = PyList_New(count);
    if (!rows) return NULL;
    for (int i = 0; i < count; i++) {
        int slot = o->taken[i];
        const uint64_t *h = headers + slot * HEADER_WORDS;
        PyObject *row = Py_BuildValue("(KKKKKiIK)", (unsigned long long)h[0], (unsigned long long)h[1],
                                      (unsigned long long)h[2], (unsigned long long)h[3], (unsigned long long)h[4],
                                      slot, (unsigned int)o->seen[slot], (unsigned long long)h[6]);
        if (!row) {
            Py_DECREF(rows);
            return NULL;
        }
        PyList_SET_ITEM(rows, i, row);
    }
    return Py_BuildValue("(Nl)", rows, lost);
}

static PyObject *Owner_free(Owner *o, PyObject *slots_arg) {
    if (!open_or_raise(o->win)) return NULL;
    if (!PyList_CheckExact(slots_arg)) return PyErr_Format(PyExc_TypeError, "free takes a list of slots");
    Py_ssize_t k = PyList_GET_SIZE(slots_arg);
    if (k == 0) Py_RETURN_NONE;
    /* check every slot before storing any word: a bad call changes nothing */
    for (Py_ssize_t i = 0; i < k; i++) {
        long slot = PyLong_AsLong(PyList_GET_ITEM(slots_arg, i));
        if (slot == -1 && PyErr_Occurred()) return NULL;
        if (slot < 0 || slot >= o->slots || o->held[slot] != 1)
            return PyErr_Format(PyExc_ValueError, "transport ring: slot %ld is not lent out", slot);
    }
    for (Py_ssize_t i = 0; i < k; i++) o->held[PyLong_AsLong(PyList_GET_ITEM(slots_arg, i))] = 2; /* freeing */
    Failure failure = {MPI_SUCCESS, NULL};
    Py_BEGIN_ALLOW_THREADS
    /* Only the owner moves a slot out of READY (block) or TAKEN (drop_oldest): a store, not a CAS, frees it */
    CHECK(&failure, MPI_Win_sync(o->win), "MPI_Win_sync");
    for (int slot = 0; slot < o->slots; slot++)
        if (o->held[slot] == 2) o->words[slot] = freed(o->states[slot], o->slots);
    for (int first = 0; first < o->slots && failure.code == MPI_SUCCESS;) {
        if (o->held[first] != 2) {
            first++;
            continue;
        }
        int end = first;
        while (end < o->slots && o->held[end] == 2) o->held[end++] = 0;
        CHECK(&failure,
              MPI_Accumulate(o->words + first, end - first, MPI_UINT32_T, o->rank,
                             o->states_at + (MPI_Aint)first * 4, end - first, MPI_UINT32_T, MPI_REPLACE, o->win),
              "MPI_Accumulate (FREE)");
        first = end;
    }
    CHECK(&failure, MPI_Win_flush(o->rank, o->win), "MPI_Win_flush");
    Py_END_ALLOW_THREADS
    if (failure.code != MPI_SUCCESS) return mpi_error(failure);
    Py_RETURN_NONE;
}

static PyObject *Owner_close(Owner *o, PyObject *unused) {
    (void)unused;
    o->win = MPI_WIN_NULL;
    Owner_release_memory(o);
    Py_RETURN_NONE;
}

static PyMethodDef Owner_methods[] = {
    {"take", (PyCFunction)Owner_take, METH_O,
     "take(steals) -> (rows, lost): the READY slots not lent out whose writer's previous segment is handed out, now "
     "lent out, as header rows (nbytes, writer, seq, checksum, ticket, slot, state, kind) in ticket order; steals: "
     "CAS each to TAKEN first (back to READY if held back), lost counts the CASes a writer's steal beat."},
    {"free", (PyCFunction)Owner_free, METH_O,
     "free(slots): give back slots lent out by take(): FREE(t + N) into their state words."},
    {"close", (PyCFunction)Owner_close, METH_NOARGS, "forget the window (it is being freed); later calls raise"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject OwnerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hpc_rl.transport._ring.Owner",
    .tp_basicsize = sizeof(Owner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Owner(fortran_win, rank, memory, slots, states_at, headers_at): the owner's view of its ring "
              "(memory: its window's bytes; byte offsets into them).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Owner_init,
    .tp_dealloc = (destructor)Owner_dealloc,
    .tp_methods = Owner_methods,
};

/* ---- the state arithmetic, for tests against layout.py ------------------------------------------------------ */

static PyObject *py_free_for(PyObject *module, PyObject *ticket) {
    (void)module;
    unsigned long long t = PyLong_AsUnsignedLongLongMask(ticket);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromUnsignedLong(free_for(t));
}

static PyObject *py_freed(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2) return PyErr_Format(PyExc_TypeError, "freed(state, slots) takes 2 arguments");
    unsigned long state = PyLong_AsUnsignedLong(args[0]);
    long slots = PyLong_AsLong(args[1]);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromUnsignedLong(freed((uint32_t)state, (int)slots));
}

static PyMethodDef module_functions[] = {
    {"free_for", (PyCFunction)py_free_for, METH_O, "free_for(ticket): FREE(ticket), as the writer computes it"},
    {"freed", (PyCFunction)(void (*)(void))py_freed, METH_FASTCALL,
     "freed(state, slots): the FREE word the owner stores for a slot in READY(t) or TAKEN(t)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef ring_module = {
    PyModuleDef_HEAD_INIT, .m_name = "hpc_rl.transport._ring",
    .m_doc = "The experience ring's MPI calls, issued from C (see the comment atop _ring.c).", .m_size = -1,
    .m_methods = module_functions,
};

PyMODINIT_FUNC PyInit__ring(void) {
    if (PyType_Ready(&WriterType) < 0 || PyType_Ready(&OwnerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&ring_module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Writer", (PyObject *)&WriterType) < 0 ||
        PyModule_AddObjectRef(m, "Owner", (PyObject *)&OwnerType) < 0 ||
        PyModule_AddIntConstant(m, "TICKET_BITS", TICKET_BITS) < 0 ||
        PyModule_AddIntConstant(m, "PHASE_READY", PHASE_READY) < 0 ||
        PyModule_AddIntConstant(m, "HEADER_BYTES", HEADER_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "KIND_VOID", KIND_VOID) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
