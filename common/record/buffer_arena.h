/* The buffers of producer batches, from an arena mapped for transparent huge pages.
 *
 * A producer over a thousand topics appends each message to a different batch, so every append
 * lands on another page: with 4 KiB pages nearly each one missed the TLB (the record's first
 * store was over half of the append's time), and batches freed and opened by the thousand a
 * second faulted their buffers in afresh. Here a buffer is a block of 4 KiB to 2 MiB (a power of
 * two) carved from one virtual range reserved at the first batch and advised MADV_HUGEPAGE, so a
 * few huge pages cover the buffers of thousands of batches; an answered batch's block goes on a
 * free list of its size for the next batches (Kafka's producer keeps its buffers the same way).
 * What the arena has carved stays the process's (at most ARENA_BYTES); past that, and for
 * buffers below 4 KiB or above 2 MiB, buffers are malloc's (PyMem). Only the GIL guards it: every
 * caller holds it.
 */
#ifndef GMS_BUFFER_ARENA_H
#define GMS_BUFFER_ARENA_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <sys/mman.h>

#define ARENA_BLOCK_SHIFT_MIN 12                       /* 4 KiB */
#define ARENA_BLOCK_SHIFT_MAX 21                       /* 2 MiB: a huge page, and a region */
#define ARENA_CLASSES (ARENA_BLOCK_SHIFT_MAX - ARENA_BLOCK_SHIFT_MIN + 1)
#define ARENA_REGION_BYTES ((Py_ssize_t)1 << ARENA_BLOCK_SHIFT_MAX)
#define ARENA_BYTES ((Py_ssize_t)256 << 20)
/* A free block up to this many sizes above the one asked for is taken before a region is carved:
 * a new batch then starts in the buffer of one that was answered, with no copies as it grows. */
#define ARENA_LARGER_TAKEN 4

static char *arena_base;       /* the reserved range, ARENA_REGION_BYTES-aligned; NULL: not yet */
static int arena_unavailable;  /* the reservation failed: buffers are all malloc's */
static Py_ssize_t arena_carved; /* bytes of the range carved into blocks so far */
static char *arena_free[ARENA_CLASSES];  /* per size, free blocks linked through their first bytes */

static inline int arena_holds(const char *buf) {
    return arena_base != NULL && buf >= arena_base && buf < arena_base + ARENA_BYTES;
}

static int arena_reserve(void) {
    size_t span = (size_t)(ARENA_BYTES + ARENA_REGION_BYTES);
    char *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) {
        arena_unavailable = 1;
        return -1;
    }
    uintptr_t aligned = ((uintptr_t)raw + (uintptr_t)ARENA_REGION_BYTES - 1) & ~((uintptr_t)ARENA_REGION_BYTES - 1);
    size_t head = aligned - (uintptr_t)raw;
    if (head) munmap(raw, head);
    size_t tail = span - head - (size_t)ARENA_BYTES;
    if (tail) munmap((char *)aligned + ARENA_BYTES, tail);
    arena_base = (char *)aligned;
#ifdef MADV_HUGEPAGE
    (void)madvise(arena_base, (size_t)ARENA_BYTES, MADV_HUGEPAGE);  /* a hint: 4 KiB pages work too */
#endif
    return 0;
}

/* The next region of the range, carved into free blocks of size class k; -1 when it is used up. */
static int arena_carve(int k) {
    if (arena_carved + ARENA_REGION_BYTES > ARENA_BYTES) return -1;
    char *region = arena_base + arena_carved;
    arena_carved += ARENA_REGION_BYTES;
    Py_ssize_t block = (Py_ssize_t)1 << (k + ARENA_BLOCK_SHIFT_MIN);
    for (Py_ssize_t at = ARENA_REGION_BYTES - block; at >= 0; at -= block) {
        *(char **)(region + at) = arena_free[k];
        arena_free[k] = region + at;
    }
    return 0;
}

static inline char *arena_pop(int k, Py_ssize_t *cap) {
    char *block = arena_free[k];
    arena_free[k] = *(char **)block;
    *cap = (Py_ssize_t)1 << (k + ARENA_BLOCK_SHIFT_MIN);
    return block;
}

/* A block of at least need bytes (need a power of two of 4 KiB to 2 MiB; *cap: its size), or NULL
 * when the arena cannot give one (the caller uses malloc). */
static char *arena_take(Py_ssize_t need, Py_ssize_t *cap) {
    if (arena_base == NULL && (arena_unavailable || arena_reserve() < 0)) return NULL;
    int k = 0;
    while (((Py_ssize_t)1 << (k + ARENA_BLOCK_SHIFT_MIN)) < need) k++;
    for (int j = k; j < ARENA_CLASSES && j <= k + ARENA_LARGER_TAKEN; j++)
        if (arena_free[j] != NULL) return arena_pop(j, cap);
    if (arena_carve(k) == 0) return arena_pop(k, cap);
    for (int j = k + ARENA_LARGER_TAKEN + 1; j < ARENA_CLASSES; j++)
        if (arena_free[j] != NULL) return arena_pop(j, cap);
    return NULL;
}

/* Gives a batch buffer back: an arena block to its free list, any other to malloc. */
static void buffer_free(char *buf, Py_ssize_t cap) {
    if (!arena_holds(buf)) {
        PyMem_Free(buf);
        return;
    }
    int k = 0;
    while (((Py_ssize_t)1 << (k + ARENA_BLOCK_SHIFT_MIN)) < cap) k++;
    *(char **)buf = arena_free[k];
    arena_free[k] = buf;
}

/* Moves a buffer of len bytes used (capacity *cap) to one of at least need bytes, a power of two
 * (*cap updated): an arena block when it can give one, else malloc's. 0, or -1 (no memory). */
static int buffer_grow(char **buf, Py_ssize_t len, Py_ssize_t *cap, Py_ssize_t need) {
    Py_ssize_t block_cap;
    char *grown = NULL;
    if (need >= ((Py_ssize_t)1 << ARENA_BLOCK_SHIFT_MIN) && need <= ARENA_REGION_BYTES)
        grown = arena_take(need, &block_cap);
    if (grown == NULL && !arena_holds(*buf)) {
        if ((grown = PyMem_Realloc(*buf, (size_t)need)) == NULL) return -1;
        *buf = grown;
        *cap = need;
        return 0;
    }
    if (grown == NULL) {
        if ((grown = PyMem_Malloc((size_t)need)) == NULL) return -1;
        block_cap = need;
    }
    if (len) memcpy(grown, *buf, (size_t)len);
    if (*buf != NULL) buffer_free(*buf, *cap);
    *buf = grown;
    *cap = block_cap;
    return 0;
}

#endif
