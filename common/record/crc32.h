/* CRC-32 as zlib computes it (reflected polynomial 0xEDB88320), for the C parts of gms.
 *
 * Slicing-by-8 (~0.4 ns per byte), and carry-less multiplication folding on x86-64 with PCLMULQDQ
 * (~0.1 ns per byte). Each extension that includes this calls crc32_init() once at import.
 */
#ifndef GMS_CRC32_H
#define GMS_CRC32_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint32_t crc_table[8][256];

static void init_crc_tables(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = crc_table[0][i];
        for (int t = 1; t < 8; t++) {
            c = crc_table[0][c & 0xff] ^ (c >> 8);
            crc_table[t][i] = c;
        }
    }
}

/* Slicing-by-8 over the raw register (no pre/post inversion). */
static uint32_t crc32_table_update(uint32_t c, const uint8_t *p, size_t n) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (n >= 8) {
        uint32_t one, two;
        memcpy(&one, p, 4);
        memcpy(&two, p + 4, 4);
        one ^= c;
        c = crc_table[7][one & 0xff] ^ crc_table[6][(one >> 8) & 0xff] ^ crc_table[5][(one >> 16) & 0xff]
            ^ crc_table[4][one >> 24] ^ crc_table[3][two & 0xff] ^ crc_table[2][(two >> 8) & 0xff]
            ^ crc_table[1][(two >> 16) & 0xff] ^ crc_table[0][two >> 24];
        p += 8;
        n -= 8;
    }
#endif
    while (n--) c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_CLMUL_KERNEL 1

/* Folding with carry-less multiplication (Intel's "Fast CRC Computation for Generic Polynomials
 * Using PCLMULQDQ"; the constants are Linux's crc32-pclmul ones for the reflected polynomial):
 * ~0.1 ns per byte. Takes and returns the raw register; n >= 64 and a multiple of 16. */
__attribute__((target("pclmul,sse2")))
static uint32_t crc32_clmul_blocks(uint32_t crc, const uint8_t *p, size_t n) {
    const __m128i k1k2 = _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL);
    const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124LL);
    const __m128i poly_mu = _mm_set_epi64x(0x1f7011641LL, 0x1db710641LL);
    const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
    __m128i x1 = _mm_loadu_si128((const __m128i *)p), x2 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 32)), x4 = _mm_loadu_si128((const __m128i *)(p + 48));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    p += 64;
    n -= 64;
#define FOLD(x, k, next) \
    _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next)
    for (; n >= 64; p += 64, n -= 64) {
        x1 = FOLD(x1, k1k2, _mm_loadu_si128((const __m128i *)p));
        x2 = FOLD(x2, k1k2, _mm_loadu_si128((const __m128i *)(p + 16)));
        x3 = FOLD(x3, k1k2, _mm_loadu_si128((const __m128i *)(p + 32)));
        x4 = FOLD(x4, k1k2, _mm_loadu_si128((const __m128i *)(p + 48)));
    }
    x1 = FOLD(x1, k3k4, x2);
    x1 = FOLD(x1, k3k4, x3);
    x1 = FOLD(x1, k3k4, x4);
    for (; n >= 16; p += 16, n -= 16) x1 = FOLD(x1, k3k4, _mm_loadu_si128((const __m128i *)p));
#undef FOLD
    /* 128 -> 64 bits, then 64 -> 32, then Barrett reduction. */
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(k3k4, x1, 0x01), _mm_srli_si128(x1, 8));
    x2 = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k5, 0x00);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 4), x2);
    x2 = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), poly_mu, 0x10);
    x2 = _mm_clmulepi64_si128(_mm_and_si128(x2, mask32), poly_mu, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_cvtsi128_si32(_mm_srli_si128(x1, 4));
}

static int have_clmul;
#endif

/* zlib's crc32(data, value): the CRC of data continued from value (0: a fresh CRC). */
static uint32_t crc32_continue(uint32_t value, const uint8_t *p, size_t n) {
    uint32_t c = ~value;
#ifdef HAVE_CLMUL_KERNEL
    if (have_clmul && n >= 64) {
        size_t blocks = n & ~(size_t)15;
        c = crc32_clmul_blocks(c, p, blocks);
        p += blocks;
        n -= blocks;
    }
#endif
    return ~crc32_table_update(c, p, n);
}

static inline uint32_t crc32_of(const uint8_t *p, size_t n) {
    return crc32_continue(0, p, n);
}

/* Fills the tables and picks the kernel; GMS_CRC_KERNEL=table forces the portable one (tests). */
static void crc32_init(void) {
    init_crc_tables();
#ifdef HAVE_CLMUL_KERNEL
    __builtin_cpu_init();
    const char *kernel = getenv("GMS_CRC_KERNEL");
    have_clmul = __builtin_cpu_supports("pclmul") && (kernel == NULL || strcmp(kernel, "table") != 0);
#endif
}

/* "clmul" or "table": the kernel crc32_init picked. */
static inline const char *crc32_kernel(void) {
#ifdef HAVE_CLMUL_KERNEL
    return have_clmul ? "clmul" : "table";
#else
    return "table";
#endif
}

#endif
