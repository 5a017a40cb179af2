/* The MPI calls of an experience-ring put, issued from C with no Python and no owner: the protocol's own cost.
 *
 * Run by `python -m hpc_rl.bench transport` (it compiles this with mpicc and starts 2 ranks; see transport.py).
 * Rank 0 issues, into rank 1's window of SLOTS segments, for each segment size:
 *   raw:    Put + Flush per segment (the bare loop of the Python benchmark);
 *   single: per segment, the writer's calls of a ring put (docs/transport.md, section 5): ticket Fetch_and_op and
 *           claim Get_accumulate, Flush; payload Put, header Put, Flush; READY Accumulate, Flush;
 *   batch:  the same for BATCH segments per call: one ticket, one claim read of BATCH words, BATCH payload Puts,
 *           one header Put, one READY Accumulate of BATCH words, three Flushes.
 * Nobody consumes: rank 1 waits in a barrier, the calls go to fixed words, and no state is checked. These are the
 * protocol's MPI calls alone: the floor under the ring, whose calls hpc_rl/transport/_ring.c issues with an owner
 * taking what arrives and Python around each call. One JSON line: microseconds per segment, the best of REPEATS
 * runs of each.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 32
#define BATCH 16
#define REPEATS 3
#define HEADER 64

static MPI_Win win;
static char *payload;
static uint64_t one = 1, old;
static uint32_t noop[BATCH], found[BATCH], words[BATCH];
static uint64_t headers[BATCH * HEADER / 8];

static MPI_Aint slot_at(long i, long size) { return SLOTS * HEADER + (i % SLOTS) * (MPI_Aint)size; }

static void claim(int count) {
    MPI_Fetch_and_op(&one, &old, MPI_UINT64_T, 1, 0, MPI_SUM, win);
    MPI_Get_accumulate(noop, count, MPI_UINT32_T, found, count, MPI_UINT32_T, 1, 64, count, MPI_UINT32_T,
                       MPI_NO_OP, win);
    MPI_Win_flush(1, win);
}

static void publish(int count) {
    MPI_Put(headers, count * HEADER, MPI_BYTE, 1, 256, count * HEADER, MPI_BYTE, win);
    MPI_Win_flush(1, win);
    MPI_Accumulate(words, count, MPI_UINT32_T, 1, 64, count, MPI_UINT32_T, MPI_REPLACE, win);
    MPI_Win_flush(1, win);
}

/* microseconds per segment of `count` segments of `size` bytes, written `batch` per call (0: the bare loop) */
static double run(long size, long count, int batch) {
    double start = MPI_Wtime();
    for (long i = 0; i < count; i += batch ? batch : 1) {
        if (!batch) {
            MPI_Put(payload, (int)size, MPI_BYTE, 1, slot_at(i, size), (int)size, MPI_BYTE, win);
            MPI_Win_flush(1, win);
            continue;
        }
        claim(batch);
        for (int j = 0; j < batch; j++)
            MPI_Put(payload, (int)size, MPI_BYTE, 1, slot_at(i + j, size), (int)size, MPI_BYTE, win);
        publish(batch);
    }
    return (MPI_Wtime() - start) / count * 1e6;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, ranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    if (ranks != 2 || argc != 2) {
        if (rank == 0) fprintf(stderr, "usage: mpirun -np 2 %s BYTES_PER_RUN\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    long bytes_per_run = atol(argv[1]);
    const long sizes[] = {64L << 10, 1L << 20};
    const char *labels[] = {"64KiB", "1MiB"};
    long largest = sizes[1];
    void *base;
    MPI_Aint window_bytes = rank == 1 ? SLOTS * HEADER + SLOTS * largest : 0;
    MPI_Win_allocate(window_bytes, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
    if (rank == 1) memset(base, 0, window_bytes);
    MPI_Win_lock_all(MPI_MODE_NOCHECK, win);
    payload = malloc(largest);
    memset(payload, 1, largest);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        printf("{");
        for (int s = 0; s < 2; s++) {
            long count = bytes_per_run / sizes[s];
            if (count < 2 * SLOTS) count = 2 * SLOTS;
            count -= count % BATCH;
            run(sizes[s], SLOTS, 0); /* first touch of the window's pages (docs/transport.md, P2) */
            double best[3] = {1e30, 1e30, 1e30};
            const int batches[3] = {0, 1, BATCH};
            for (int r = 0; r < REPEATS; r++)
                for (int m = 0; m < 3; m++) {
                    double us = run(sizes[s], count, batches[m]);
                    if (us < best[m]) best[m] = us;
                }
            printf("%s\"%s\": {\"raw_put_us\": %.3f, \"single_put_us\": %.3f, \"batch_put_us\": %.3f}", s ? ", " : "",
                   labels[s], best[0], best[1], best[2]);
        }
        printf("}\n");
        fflush(stdout);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_unlock_all(win);
    MPI_Win_free(&win);
    free(payload);
    MPI_Finalize();
    return 0;
}
