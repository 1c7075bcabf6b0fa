/* Block-quantised matrix products for fak's `gguf` weight format.
 *
 * Weights stay in the GGUF file's own blocks of 32 (Q4_1: 4-bit codes with a
 * float16 scale and minimum; Q8_0: int8 codes with a float16 scale), so the
 * products use exactly the weights the float32 reference dequantises. The input
 * row is quantised in blocks of 32 to two int8 codes (~15 bits; llama.cpp keeps
 * one), and every block's integer dot product is exact; only the float sums of
 * the block results round. Each call is deterministic: the same
 * inputs give the same bytes, whatever the thread count (rows are split between
 * threads, and a row's sum is never split).
 *
 * Built on first use by fak.kernel.model.blockdot (cc -O3 -march=native -fopenmp), loaded
 * through ctypes: no Python or torch headers, no build-time dependency.
 */
#define _POSIX_C_SOURCE 200809L /* sched_yield under -std=c11 */
#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define QK 32

static inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000 | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

/* x (rows x n, n a multiple of 32) -> per block of 32: two int8 code vectors q1, q2 (stored
 * side by side, 64 bytes a block) with x ~ d * (256 q1 + q2): q1 the block at 8 bits
 * (d1 = absmax / 127) and q2 its remainder at 8 more; d = d1 / 256, s = the block's sum.
 * So an input carries ~15 bits, and a product's only rounding is that of its float sums. */
void fak_quantize_rows(const float *x, int64_t rows, int64_t n, float *d, float *s, int8_t *q) {
    const int64_t nb = n / QK;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = x + r * n + b * QK;
            float amax = 0.0f, sum = 0.0f;
            for (int i = 0; i < QK; i++) {
                amax = fmaxf(amax, fabsf(xb[i]));
                sum += xb[i];
            }
            const float d1 = amax / 127.0f;
            const float id = d1 != 0.0f ? 1.0f / d1 : 0.0f;
            int8_t *qb = q + (r * nb + b) * 2 * QK;
            for (int i = 0; i < QK; i++) {
                const float v = nearbyintf(xb[i] * id);
                const float rest = nearbyintf((xb[i] - v * d1) * id * 256.0f);
                qb[i] = (int8_t)v;
                qb[QK + i] = (int8_t)fminf(127.0f, fmaxf(-127.0f, rest));
            }
            d[r * nb + b] = d1 / 256.0f;
            s[r * nb + b] = sum;
        }
    }
}

#if defined(__AVX2__)
static inline float hsum256(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* sum over 32 lanes of u8 a * s8 b, as 8 int32 lanes */
static inline __m256i dot_u8s8(__m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b);
#elif defined(__AVXVNNI__) /* the VEX form: Alder Lake and later client cores without AVX-512 */
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), a, b);
#else
    const __m256i pairs = _mm256_maddubs_epi16(a, b); /* |u4 * s8| * 2 < 2^15: no saturation for Q4 */
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
#endif
}
#endif

#if defined(__AVX2__)
/* lane k of the result = the sum of the 8 lanes of p[k] */
static inline __m256i hsum8x8(const __m256i p[8]) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* 256 * (w . q1) + (w . q2) as 8 int32 lanes (|sum| < 2^24: exact) */
static inline __m256i two_dots(__m256i w_u8, __m256i q1, __m256i q2) {
    return _mm256_add_epi32(_mm256_slli_epi32(dot_u8s8(w_u8, q1), 8), dot_u8s8(w_u8, q2));
}

static inline __m256i q4_block(const uint8_t *wq, const int8_t *xq) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)wq);
    const __m256i w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0f));
    return two_dots(w, _mm256_loadu_si256((const __m256i *)xq), _mm256_loadu_si256((const __m256i *)(xq + QK)));
}

static inline __m256i q8_block(const int8_t *wq, const int8_t *xq) {
    const __m256i w = _mm256_loadu_si256((const __m256i *)wq);
    const __m256i q1 = _mm256_loadu_si256((const __m256i *)xq), q2 = _mm256_loadu_si256((const __m256i *)(xq + QK));
    /* |w| times the codes with w's sign: the same products, as u8 x s8 */
    return two_dots(_mm256_sign_epi8(w, w), _mm256_sign_epi8(q1, w), _mm256_sign_epi8(q2, w));
}
#endif

/* One row of Q4_1 weights against one quantised input row: blocks in groups of 8 (their
 * integer sums gathered into one vector, scaled by 8 scales at once), then one by one. */
static inline float row_q4_1(const uint8_t *wq, const uint16_t *wd, const uint16_t *wm, int64_t nb,
                             const float *xd, const float *xs, const int8_t *xq) {
    float sum = 0.0f;
    int64_t b = 0;
#if defined(__AVX2__) && defined(__F16C__)
    __m256 acc = _mm256_setzero_ps(), macc = _mm256_setzero_ps();
    for (; b + 8 <= nb; b += 8) {
        __m256i p[8];
        for (int j = 0; j < 8; j++) p[j] = q4_block(wq + (b + j) * 16, xq + (b + j) * 2 * QK);
        const __m256 scale = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wd + b))),
                                           _mm256_loadu_ps(xd + b));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hsum8x8(p)), scale, acc);
        macc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wm + b))), _mm256_loadu_ps(xs + b),
                               macc);
    }
    for (; b < nb; b++) {
        const float scale = half_to_float(wd[b]) * xd[b];
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q4_block(wq + b * 16, xq + b * 2 * QK)), _mm256_set1_ps(scale), acc);
        sum += half_to_float(wm[b]) * xs[b];
    }
    sum += hsum256(_mm256_add_ps(acc, macc));
#endif
    for (; b < nb; b++) {
        const int8_t *x1 = xq + b * 2 * QK, *x2 = x1 + QK;
        int dot = 0;
        for (int i = 0; i < 16; i++) {
            dot += (wq[b * 16 + i] & 0x0f) * (256 * x1[i] + x2[i]);
            dot += (wq[b * 16 + i] >> 4) * (256 * x1[16 + i] + x2[16 + i]);
        }
        sum += (float)dot * (half_to_float(wd[b]) * xd[b]) + half_to_float(wm[b]) * xs[b];
    }
    return sum;
}

/* One row of Q8_0 weights against one quantised input row. */
static inline float row_q8_0(const int8_t *wq, const uint16_t *wd, int64_t nb, const float *xd, const int8_t *xq) {
    float sum = 0.0f;
    int64_t b = 0;
#if defined(__AVX2__) && defined(__F16C__)
    __m256 acc = _mm256_setzero_ps();
    for (; b + 8 <= nb; b += 8) {
        __m256i p[8];
        for (int j = 0; j < 8; j++) p[j] = q8_block(wq + (b + j) * QK, xq + (b + j) * 2 * QK);
        const __m256 scale = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wd + b))),
                                           _mm256_loadu_ps(xd + b));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hsum8x8(p)), scale, acc);
    }
    for (; b < nb; b++) {
        const float scale = half_to_float(wd[b]) * xd[b];
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_block(wq + b * QK, xq + b * 2 * QK)), _mm256_set1_ps(scale), acc);
    }
    sum = hsum256(acc);
#endif
    for (; b < nb; b++) {
        const int8_t *x1 = xq + b * 2 * QK, *x2 = x1 + QK;
        int dot = 0;
        for (int i = 0; i < QK; i++) dot += wq[b * QK + i] * (256 * x1[i] + x2[i]);
        sum += (float)dot * (half_to_float(wd[b]) * xd[b]);
    }
    return sum;
}

/* A weight matrix in blocks. Kind 0 Q4_1 and kind 1 Q8_0 are split into arrays (q: the codes,
 * rows*nb*16 bytes or rows*nb*32 int8; d and m: rows*nb halves). Kind 2 (RAW) reads the file's
 * own blocks where they lie (a memory-mapped GGUF file): row r's blocks start at row[r] and
 * are of GGML type row_kind[r], so one matrix may fuse tensors of several types (Q4_K_M files
 * keep attn_q in Q4_K and attn_v in Q6_K) and take its rows in any order (llama.cpp's
 * permuted Q/K rows) without a copy. */
typedef struct {
    int64_t kind, rows, n;
    const void *q;
    const uint16_t *d, *m;
    const uint8_t *const *row; /* RAW: each row's first block */
    const uint8_t *row_kind;   /* RAW: each row's GGML type */
} fak_qmat;

#define KIND_RAW 2
#define QK_K 256
/* GGML type ids (ggml.h) of the block formats RAW reads */
enum { T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14 };

/* --- raw GGUF blocks, unpacked ------------------------------------------------------
 *
 * A row of any RAW type is first unpacked, per 32 values, to 32 codes (unsigned 0..63, or
 * signed int8 for Q8_0), two float scales (values 0-15 and 16-31: Q6_K's sub-blocks are 16
 * wide) and a float "min" that multiplies the block's input sum; `off`, one integer per row,
 * is subtracted from every unsigned code (Q4_0: 8, Q5_0: 16, Q6_K: 32). So the weight is
 * exactly w = sc * (u - off) + mn, as ggml dequantises it, and a product's block integers
 * sum (u - off) * (256 q1 + q2) exactly. Every product of a RAW row, one input row or many,
 * is this unpacking followed by the same float sequence (raw_group, raw_tail): a row's
 * bytes do not depend on the call. */

typedef struct {
    uint8_t *u;      /* n codes */
    float *lo, *hi;  /* n / 32 scales: values 0-15 and 16-31 of each block of 32 */
    float *mn;       /* n / 32 mins */
    int off;         /* subtracted from every unsigned code; -1: signed codes (Q8_0) */
    int halves;      /* lo and hi differ (Q6_K) */
    int mins;        /* some mn is not zero (Q4_1, Q5_1, Q4_K, Q5_K) */
} fak_unpacked;

static inline void k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* bytes per block of a RAW type (0 for a type RAW does not read) */
int64_t fak_block_bytes(int type) {
    switch (type) {
    case T_Q4_0: return 18;
    case T_Q4_1: return 20;
    case T_Q5_0: return 22;
    case T_Q5_1: return 24;
    case T_Q8_0: return 34;
    case T_Q4_K: return 144;
    case T_Q5_K: return 176;
    case T_Q6_K: return 210;
    default: return 0;
    }
}

static inline int64_t block_values(int type) { return type >= T_Q4_K ? QK_K : QK; }
static inline float half_at(const uint8_t *p) { return half_to_float((uint16_t)(p[0] | p[1] << 8)); }

/* 16 bytes of two 4-bit codes each -> 32 codes: low nibbles first, then high (ggml's order) */
static inline void nibbles16(const uint8_t *qs, uint8_t *u) {
#if defined(__AVX2__)
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs), low = _mm_set1_epi8(0x0f);
    _mm_storeu_si128((__m128i *)u, _mm_and_si128(raw, low));
    _mm_storeu_si128((__m128i *)(u + 16), _mm_and_si128(_mm_srli_epi16(raw, 4), low));
#else
    for (int j = 0; j < 16; j++) {
        u[j] = qs[j] & 0xF;
        u[j + 16] = qs[j] >> 4;
    }
#endif
}

/* 32 codes = the low (hi_nibble 0) or high nibbles of 32 bytes, with bits `shift`..`shift +
 * bits - 1` of 32 more bytes (qh, NULL for none) as bits 4 and up */
static inline void codes32(const uint8_t *ql, int hi_nibble, const uint8_t *qh, int shift, int bits, uint8_t *u) {
#if defined(__AVX2__)
    const __m256i raw = _mm256_loadu_si256((const __m256i *)ql), low = _mm256_set1_epi8(0x0f);
    __m256i c = _mm256_and_si256(hi_nibble ? _mm256_srli_epi16(raw, 4) : raw, low);
    if (qh) {
        const __m256i h = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)qh), shift),
                                           _mm256_set1_epi8((char)((1 << bits) - 1)));
        c = _mm256_or_si256(c, _mm256_slli_epi16(h, 4)); /* h <= 3: its bits stay in their byte */
    }
    _mm256_storeu_si256((__m256i *)u, c);
#else
    for (int l = 0; l < 32; l++) {
        uint8_t v = hi_nibble ? ql[l] >> 4 : ql[l] & 0xF;
        if (qh) v |= (uint8_t)(((qh[l] >> shift) & ((1 << bits) - 1)) << 4);
        u[l] = v;
    }
#endif
}

static inline __attribute__((always_inline)) void unpack_block(int type, const uint8_t *x, int64_t b, fak_unpacked *o);

/* Unpack one row of n values into o (its arrays sized for n). */
static void unpack_row(int type, const uint8_t *src, int64_t n, fak_unpacked *o) {
    const int64_t nblk = n / block_values(type), bytes = fak_block_bytes(type);
    o->off = type == T_Q4_0 ? 8 : type == T_Q5_0 ? 16 : type == T_Q6_K ? 32 : type == T_Q8_0 ? -1 : 0;
    o->halves = type == T_Q6_K;
    o->mins = type == T_Q4_1 || type == T_Q5_1 || type == T_Q4_K || type == T_Q5_K;
    switch (type) { /* one loop per type: each compiles to straight code */
    case T_Q4_0: for (int64_t b = 0; b < nblk; b++) unpack_block(T_Q4_0, src + b * bytes, b, o); break;
    case T_Q4_1: for (int64_t b = 0; b < nblk; b++) unpack_block(T_Q4_1, src + b * bytes, b, o); break;
    case T_Q5_0: for (int64_t b = 0; b < nblk; b++) unpack_block(T_Q5_0, src + b * bytes, b, o); break;
    case T_Q5_1: for (int64_t b = 0; b < nblk; b++) unpack_block(T_Q5_1, src + b * bytes, b, o); break;
    case T_Q8_0: for (int64_t b = 0; b < nblk; b++) unpack_block(T_Q8_0, src + b * bytes, b, o); break;
    case T_Q4_K: for (int64_t b = 0; b < nblk; b++) unpack_block(T_Q4_K, src + b * bytes, b, o); break;
    case T_Q5_K: for (int64_t b = 0; b < nblk; b++) unpack_block(T_Q5_K, src + b * bytes, b, o); break;
    case T_Q6_K: for (int64_t b = 0; b < nblk; b++) unpack_block(T_Q6_K, src + b * bytes, b, o); break;
    default: break;
    }
}

/* Block b (at x) of a row of `type` into o. */
static inline __attribute__((always_inline)) void unpack_block(int type, const uint8_t *x, int64_t b, fak_unpacked *o) {
        switch (type) {
        case T_Q4_0:
        case T_Q4_1: {
            const int one = type == T_Q4_1;
            nibbles16(x + 2 + 2 * one, o->u + b * QK);
            o->lo[b] = o->hi[b] = half_at(x);
            o->mn[b] = one ? half_at(x + 2) : 0.0f;
            break;
        }
        case T_Q5_0:
        case T_Q5_1: {
            const int one = type == T_Q5_1;
            uint32_t qh;
            memcpy(&qh, x + 2 + 2 * one, 4);
            uint8_t *u = o->u + b * QK;
            nibbles16(x + 6 + 2 * one, u);
            for (int j = 0; j < 16; j++) {
                u[j] |= (uint8_t)(((qh >> j) & 1) << 4);
                u[j + 16] |= (uint8_t)(((qh >> (j + 16)) & 1) << 4);
            }
            o->lo[b] = o->hi[b] = half_at(x);
            o->mn[b] = one ? half_at(x + 2) : 0.0f;
            break;
        }
        case T_Q8_0:
            memcpy(o->u + b * QK, x + 2, QK);
            o->lo[b] = o->hi[b] = half_at(x);
            o->mn[b] = 0.0f;
            break;
        case T_Q4_K:
        case T_Q5_K: {
            const int five = type == T_Q5_K;
            const float d = half_at(x), dmin = half_at(x + 2);
            const uint8_t *scales = x + 4, *qh = five ? x + 16 : NULL, *ql = x + 16 + 32 * five;
            for (int s = 0; s < 8; s++) { /* sub-block s: low (even s) or high nibbles of ql[32 (s/2)..] */
                uint8_t sc, m;
                k4_scale_min(s, scales, &sc, &m);
                const int64_t blk = b * 8 + s;
                codes32(ql + 32 * (s / 2), s & 1, qh, s, 1, o->u + blk * QK);
                o->lo[blk] = o->hi[blk] = d * (float)sc;
                o->mn[blk] = -(dmin * (float)m);
            }
            break;
        }
        case T_Q6_K: {
            const float d = half_at(x + 208);
            const int8_t *scales = (const int8_t *)(x + 192);
            for (int g = 0; g < 2; g++) /* 128 values: sub-blocks of 32 k = 0..3 */
                for (int k = 0; k < 4; k++) {
                    const int64_t blk = b * 8 + g * 4 + k;
                    codes32(x + 64 * g + 32 * (k & 1), k >= 2, x + 128 + 32 * g, 2 * k, 2, o->u + blk * QK);
                    o->lo[blk] = d * (float)scales[8 * g + 2 * k];
                    o->hi[blk] = d * (float)scales[8 * g + 2 * k + 1];
                    o->mn[blk] = 0.0f;
                }
            break;
        }
        default: break;
        }
}

#if defined(__AVX2__) && defined(__F16C__)
/* block b's 8 int32 lanes (lane k: values 4k..4k+3) of sum (u - off) * (256 q1 + q2), exact */
static inline __m256i block_lanes(const fak_unpacked *w, int64_t b, const int8_t *xq) {
    const __m256i c = _mm256_loadu_si256((const __m256i *)(w->u + b * QK));
    const __m256i q1 = _mm256_loadu_si256((const __m256i *)(xq + b * 2 * QK));
    const __m256i q2 = _mm256_loadu_si256((const __m256i *)(xq + b * 2 * QK + QK));
    if (w->off < 0) /* signed codes: |c| times the inputs with c's sign */
        return two_dots(_mm256_sign_epi8(c, c), _mm256_sign_epi8(q1, c), _mm256_sign_epi8(q2, c));
    const __m256i lanes = two_dots(c, q1, q2);
    if (!w->off) return lanes;
    return _mm256_sub_epi32(lanes, _mm256_mullo_epi32(_mm256_set1_epi32(w->off), two_dots(_mm256_set1_epi8(1), q1, q2)));
}

/* The float side of 8 blocks: each block's integers (L) summed per half (values 0-15, 16-31),
 * one float multiply-add per 8 blocks (two where the halves' scales differ), the mins times
 * the input sums in their own accumulator. Every RAW product runs this for every 8 blocks,
 * whichever way it formed L and the scales (the same integers and floats), so a row's
 * bytes are the same in every path. */
static inline void group_float(__m256i l, __m256i h, __m256 lo, __m256 hi, __m256 mn, int halves, int mins,
                               const float *xd, const float *xs, __m256 *acc, __m256 *macc);

static inline void group_reduce(const __m256i L[8], __m256 lo, __m256 hi, __m256 mn, int halves, int mins,
                                const float *xd, const float *xs, __m256 *acc, __m256 *macc) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(L[0], L[1]), _mm256_hadd_epi32(L[2], L[3]));
    const __m256i c = _mm256_hadd_epi32(_mm256_hadd_epi32(L[4], L[5]), _mm256_hadd_epi32(L[6], L[7]));
    const __m256i l = _mm256_permute2x128_si256(a, c, 0x20), h = _mm256_permute2x128_si256(a, c, 0x31);
    group_float(l, h, lo, hi, mn, halves, mins, xd, xs, acc, macc);
}

/* group_reduce's float side, from the 8 blocks' integer sums per half: lane j of l (h) is
 * block j's sum over values 0-15 (16-31). Where a caller forms l and h (the prefill's int16
 * products), the floats are these same operations: the same bytes. */
static inline void group_float(__m256i l, __m256i h, __m256 lo, __m256 hi, __m256 mn, int halves, int mins,
                               const float *xd, const float *xs, __m256 *acc, __m256 *macc) {
    const __m256 xdv = _mm256_loadu_ps(xd);
    if (halves) {
        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l), _mm256_mul_ps(lo, xdv), *acc);
        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), _mm256_mul_ps(hi, xdv), *acc);
    } else {
        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(l, h)), _mm256_mul_ps(lo, xdv), *acc);
    }
    if (mins) *macc = _mm256_fmadd_ps(mn, _mm256_loadu_ps(xs), *macc);
}

/* Blocks b..b+7 of an unpacked row into the accumulators. */
static inline void raw_group(const fak_unpacked *w, int64_t b, const float *xd, const float *xs, const int8_t *xq,
                             __m256 *acc, __m256 *macc) {
    __m256i L[8];
    for (int j = 0; j < 8; j++) L[j] = block_lanes(w, b + j, xq);
    group_reduce(L, _mm256_loadu_ps(w->lo + b), _mm256_loadu_ps(w->hi + b), _mm256_loadu_ps(w->mn + b), w->halves,
                 w->mins, xd + b, xs + b, acc, macc);
}

/* the float16 at p, p + stride, ..., p + 7 stride as 8 floats */
static inline __m256 halves8(const uint8_t *p, int64_t stride) {
    uint16_t h[8];
    for (int j = 0; j < 8; j++) memcpy(&h[j], p + j * stride, 2);
    return _mm256_cvtph_ps(_mm_setr_epi16((short)h[0], (short)h[1], (short)h[2], (short)h[3], (short)h[4], (short)h[5],
                                          (short)h[6], (short)h[7]));
}

/* Blocks 8g..8g+7 of a row read straight from the file's bytes (no unpacked copy), for the
 * types most weights have; the same integers and scales as unpack_row + raw_group, so the
 * same bytes. Returns 0 for a type it does not read (the caller unpacks). */
static inline int direct_group(int type, const uint8_t *row, int64_t g, const float *xd, const float *xs,
                               const int8_t *xq, __m256 *acc, __m256 *macc) {
    __m256i L[8];
    const int64_t b = 8 * g;
    const __m256 zero = _mm256_setzero_ps();
    const __m256i low = _mm256_set1_epi8(0x0f);
#define XQ1(j) _mm256_loadu_si256((const __m256i *)(xq + (b + (j)) * 2 * QK))
#define XQ2(j) _mm256_loadu_si256((const __m256i *)(xq + (b + (j)) * 2 * QK + QK))
    switch (type) {
    case T_Q4_K: {
        const uint8_t *x = row + g * 144, *scales = x + 4, *ql = x + 16;
        /* the 8 6-bit scales and mins (k4_scale_min's, as llama.cpp unpacks them by words) */
        uint32_t u[3];
        memcpy(u, scales, 12);
        const uint32_t m1 = 0x3f3f3f3f, m2 = 0x0f0f0f0f, m3 = 0x03030303;
        const __m128i sm = _mm_set_epi32((int)(((u[2] >> 4) & m2) | (((u[1] >> 6) & m3) << 4)), (int)(u[1] & m1),
                                         (int)((u[2] & m2) | (((u[0] >> 6) & m3) << 4)), (int)(u[0] & m1));
        const __m256 lo = _mm256_mul_ps(_mm256_set1_ps(half_at(x)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm)));
        const __m256 mn = _mm256_mul_ps(_mm256_set1_ps(-half_at(x + 2)),
                                        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8))));
        for (int p = 0; p < 4; p++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(ql + 32 * p));
            L[2 * p] = two_dots(_mm256_and_si256(raw, low), XQ1(2 * p), XQ2(2 * p));
            L[2 * p + 1] = two_dots(_mm256_and_si256(_mm256_srli_epi16(raw, 4), low), XQ1(2 * p + 1), XQ2(2 * p + 1));
        }
        group_reduce(L, lo, lo, mn, 0, 1, xd + b, xs + b, acc, macc);
        return 1;
    }
    case T_Q6_K: {
        const uint8_t *x = row + g * 210;
        const int8_t *scales = (const int8_t *)(x + 192);
        const __m256 d = _mm256_set1_ps(half_at(x + 208));
        const __m256i ones = _mm256_set1_epi8(1), three = _mm256_set1_epi8(3), off = _mm256_set1_epi32(32);
        const __m128i sc = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)scales),
                                            _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
        const __m256 lo = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
        const __m256 hi = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))));
        for (int h = 0; h < 2; h++) {
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(x + 128 + 32 * h));
            for (int k = 0; k < 4; k++) {
                const int j = 4 * h + k;
                const __m256i raw = _mm256_loadu_si256((const __m256i *)(x + 64 * h + 32 * (k & 1)));
                const __m256i nib = _mm256_and_si256(k >= 2 ? _mm256_srli_epi16(raw, 4) : raw, low);
                const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), three);
                const __m256i c = _mm256_or_si256(nib, _mm256_slli_epi16(hb, 4));
                const __m256i q1 = XQ1(j), q2 = XQ2(j);
                L[j] = _mm256_sub_epi32(two_dots(c, q1, q2), _mm256_mullo_epi32(off, two_dots(ones, q1, q2)));
            }
        }
        group_reduce(L, lo, hi, zero, 1, 0, xd + b, xs + b, acc, macc);
        return 1;
    }
    case T_Q8_0: {
        const uint8_t *x = row + b * 34;
        for (int j = 0; j < 8; j++) {
            const __m256i c = _mm256_loadu_si256((const __m256i *)(x + j * 34 + 2));
            L[j] = two_dots(_mm256_sign_epi8(c, c), _mm256_sign_epi8(XQ1(j), c), _mm256_sign_epi8(XQ2(j), c));
        }
        const __m256 lo = halves8(x, 34);
        group_reduce(L, lo, lo, zero, 0, 0, xd + b, xs + b, acc, macc);
        return 1;
    }
    case T_Q4_1: {
        const uint8_t *x = row + b * 20;
        for (int j = 0; j < 8; j++) {
            const __m128i raw = _mm_loadu_si128((const __m128i *)(x + j * 20 + 4));
            const __m256i c = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), low);
            L[j] = two_dots(c, XQ1(j), XQ2(j));
        }
        const __m256 lo = halves8(x, 20), mn = halves8(x + 2, 20);
        group_reduce(L, lo, lo, mn, 0, 1, xd + b, xs + b, acc, macc);
        return 1;
    }
    default: return 0;
    }
#undef XQ1
#undef XQ2
}

static inline int direct_type(int type) { return type == T_Q4_K || type == T_Q6_K || type == T_Q8_0 || type == T_Q4_1; }

/* Blocks from..nb-1 (fewer than 8) one by one; returns their mins' sum. */
static inline float raw_tail(const fak_unpacked *w, int64_t from, int64_t nb, const float *xd, const float *xs,
                             const int8_t *xq, __m256 *acc) {
    float tail = 0.0f;
    for (int64_t b = from; b < nb; b++) {
        const __m256 s = _mm256_set_m128(_mm_set1_ps(w->hi[b] * xd[b]), _mm_set1_ps(w->lo[b] * xd[b]));
        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block_lanes(w, b, xq)), s, *acc);
        tail += w->mn[b] * xs[b];
    }
    return tail;
}
#endif

/* w . x for an unpacked row against one quantised input row (blocks of 32, ~15-bit inputs). */
static inline float raw_dot(const fak_unpacked *w, int64_t nb, const float *xd, const float *xs, const int8_t *xq) {
#if defined(__AVX2__) && defined(__F16C__)
    __m256 acc = _mm256_setzero_ps(), macc = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) raw_group(w, b, xd, xs, xq, &acc, &macc);
    const float tail = raw_tail(w, b, nb, xd, xs, xq, &acc);
    return hsum256(_mm256_add_ps(acc, macc)) + tail;
#else
    float sum = 0.0f, msum = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const int8_t *x1 = xq + b * 2 * QK, *x2 = x1 + QK;
        for (int h = 0; h < 2; h++) {
            int dot = 0;
            for (int i = 16 * h; i < 16 * h + 16; i++) {
                const int c = w->off < 0 ? (int)(int8_t)w->u[b * QK + i] : (int)w->u[b * QK + i] - w->off;
                dot += c * (256 * x1[i] + x2[i]);
            }
            sum += (float)dot * ((h ? w->hi[b] : w->lo[b]) * xd[b]);
        }
        msum += w->mn[b] * xs[b];
    }
    return sum + msum;
#endif
}

/* The scratch of one unpacked row of n values, on the caller's stack. */
#define RAW_ROW(name, n)                                                                                   \
    uint8_t name##_u[(n)];                                                                                 \
    float name##_lo[(n) / QK + 1], name##_hi[(n) / QK + 1], name##_mn[(n) / QK + 1];                       \
    fak_unpacked name = {name##_u, name##_lo, name##_hi, name##_mn, 0, 0, 0}

static inline void unpack_qmat_row(const fak_qmat *w, int64_t r, fak_unpacked *o) {
    unpack_row(w->row_kind[r], w->row[r], w->n, o);
}

/* Rows ids[t] of a RAW matrix dequantised to floats: w = sc * (u - off) + mn, ggml's formula. */
void fak_dequant_rows(const fak_qmat *w, const int64_t *ids, int64_t count, float *out) {
    const int64_t n = w->n;
    for (int64_t t = 0; t < count; t++) {
        RAW_ROW(row, n);
        unpack_qmat_row(w, ids[t], &row);
        float *y = out + t * n;
        for (int64_t i = 0; i < n; i++) {
            const int c = row.off < 0 ? (int)(int8_t)row.u[i] : (int)row.u[i] - row.off;
            y[i] = ((i % QK) < 16 ? row.lo[i / QK] : row.hi[i / QK]) * (float)c + row.mn[i / QK];
        }
    }
}

#define RAW_TR 4

static inline float qmat_row(const fak_qmat *w, int64_t r, const float *xd, const float *xs, const int8_t *xq) {
    const int64_t nb = w->n / QK;
    if (w->kind == KIND_RAW) {
#if defined(__AVX2__) && defined(__F16C__)
        if (nb % 8 == 0 && direct_type(w->row_kind[r])) { /* the file's bytes read once, no copy */
            __m256 acc = _mm256_setzero_ps(), macc = _mm256_setzero_ps();
            for (int64_t g = 0; g < nb / 8; g++) direct_group(w->row_kind[r], w->row[r], g, xd, xs, xq, &acc, &macc);
            return hsum256(_mm256_add_ps(acc, macc)) + 0.0f; /* raw_dot's sum and its empty tail */
        }
#endif
        RAW_ROW(row, w->n);
        unpack_qmat_row(w, r, &row);
        return raw_dot(&row, nb, xd, xs, xq);
    }
    if (w->kind == 0)
        return row_q4_1((const uint8_t *)w->q + r * nb * 16, w->d + r * nb, w->m + r * nb, nb, xd, xs, xq);
    return row_q8_0((const int8_t *)w->q + r * nb * QK, w->d + r * nb, nb, xd, xq);
}

/* Rows r0..r0+RAW_TR-1 (fewer at the end) of a matrix against a few quantised input rows
 * (a batched decode step's): each weight row read straight from the file (qmat_row), as a
 * decode step reads it. The prefill's tiles (prefill_tile) give these same bytes. */
static void raw_tile(const fak_qmat *w, int64_t r0, int64_t m, const float *xd, const float *xs, const int8_t *xq,
                     int64_t xd_stride, int64_t xq_stride, float *y, int64_t ldy) {
    const int nr = w->rows - r0 < RAW_TR ? (int)(w->rows - r0) : RAW_TR;
    for (int i = 0; i < nr; i++)
        for (int64_t t = 0; t < m; t++)
            y[t * ldy + r0 + i] = qmat_row(w, r0 + i, xd + t * xd_stride, xs + t * xd_stride, xq + t * xq_stride);
}

/* --- one decode step --------------------------------------------------------------- */

typedef struct {
    const float *attn_norm, *mlp_norm;
    fak_qmat qkv, o, gate_up, down;
    const float *qkv_bias;       /* Qwen2: (heads + 2 kv_heads) * head_dim biases, or NULL */
    const float *q_norm, *k_norm; /* Qwen3: head_dim RMSNorm weights over each q and k head, or NULL */
} fak_layer;

typedef struct {
    int64_t layers, dim, heads, kv_heads, head_dim, ffn, vocab;
    float eps, scale;
    const float *embed, *norm; /* embed NULL: each token's row is dequantised from embed_q */
    fak_qmat head;
    const fak_layer *layer;
    fak_qmat embed_q;
} fak_model;

/* token's embedding row into x: the float table's row, or its blocks dequantised */
static void embed_row(const fak_model *m, int64_t token, float *x) {
    if (m->embed)
        memcpy(x, m->embed + token * m->dim, (size_t)m->dim * sizeof(float));
    else
        fak_dequant_rows(&m->embed_q, &token, 1, x);
}

/* The cache: three float32 tensors (layers, capacity, kv_heads, head_dim), token-major. */
typedef struct {
    float *k, *kraw, *v;
    int64_t capacity;
    const uint8_t *keep; /* the rows 0..row this step attends to (a sliding window), or NULL for all */
} fak_cache;

/* Scratch for one step (sizes in elements): x: dim; h: max(dim, ffn, heads * head_dim); qkv: (heads + 2 kv_heads) * head_dim;
 * att: heads * head_dim; gu: 2 * ffn; xq: 2 * h's; xd, xs: h's / 32;
 * scores: heads * (row + 1). */
typedef struct {
    float *x, *h, *qkv, *att, *gu, *xd, *xs, *scores;
    int8_t *xq;
} fak_scratch;

/* a . b over n floats, in a fixed order (8 lanes, then their sum) */
static inline float dot_f32(const float *a, const float *b, int64_t n) {
    int64_t j = 0;
    float sum = 0.0f;
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    for (; j + 8 <= n; j += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), acc);
    sum = hsum256(acc);
#endif
    for (; j < n; j++) sum += a[j] * b[j];
    return sum;
}

static void rms_norm(const float *x, const float *w, int64_t n, float eps, float *out) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * inv * w[i];
}

/* out = x * cos + roll(x, half) * sin_signed, one head of hd values */
static void rope(const float *x, const float *cos, const float *sin_signed, int64_t hd, float *out) {
    const int64_t half = hd / 2;
    for (int64_t j = 0; j < hd; j++) out[j] = x[j] * cos[j] + x[(j + half) % hd] * sin_signed[j];
}

/* The q/k/v product's own steps after its matrix product, in place on one row (heads + 2
 * kv_heads heads of hd): the biases (Qwen2), then an RMSNorm over each q and k head (Qwen3). */
static void qkv_finish(const fak_layer *lw, float *qkv, int64_t H, int64_t KV, int64_t hd, float eps) {
    if (lw->qkv_bias)
        for (int64_t j = 0; j < (H + 2 * KV) * hd; j++) qkv[j] += lw->qkv_bias[j];
    if (lw->q_norm && lw->k_norm) {
        for (int64_t h = 0; h < H; h++) rms_norm(qkv + h * hd, lw->q_norm, hd, eps, qkv + h * hd);
        for (int64_t g = 0; g < KV; g++) rms_norm(qkv + (H + g) * hd, lw->k_norm, hd, eps, qkv + (H + g) * hd);
    }
}

/* One query head against a session's cache rows 0..L-1: RoPE on the query, scores, softmax,
 * the weighted sum of values. The one-session step and the batched step both call this, so
 * a head's output is the same bytes in both. `kv` is the head's group offset in a row. */
static inline void attend_head(const float *query, const float *cos, const float *sin_signed, const float *K,
                               const float *V, const uint8_t *keep, int64_t L, int64_t kv_row, int64_t kv,
                               int64_t hd, float scale, float *sc, float *out) {
    float q[256]; /* head_dim <= 256, checked by the caller */
    rope(query, cos, sin_signed, hd, q);
    float mx = -INFINITY;
    for (int64_t t = 0; t < L; t++) {
        sc[t] = keep && !keep[t] ? -INFINITY : dot_f32(q, K + t * kv_row + kv, hd) * scale; /* exp: exactly 0 */
        mx = fmaxf(mx, sc[t]);
    }
    float total = 0.0f;
    for (int64_t t = 0; t < L; t++) {
        sc[t] = expf(sc[t] - mx);
        total += sc[t];
    }
    for (int64_t j = 0; j < hd; j++) out[j] = 0.0f;
    for (int64_t t = 0; t < L; t++) {
        const float p = sc[t] / total, *vt = V + t * kv_row + kv;
        for (int64_t j = 0; j < hd; j++) out[j] += p * vt[j];
    }
}

/* rows of w over already quantised input, split between the team's threads (inside a parallel
 * region); no barrier at the end: the caller's team_barrier follows */
static void team_matvec(const fak_qmat *w, const float *xd, const float *xs, const int8_t *xq, float *y) {
#pragma omp for schedule(static) nowait
    for (int64_t r = 0; r < w->rows; r++) y[r] = qmat_row(w, r, xd, xs, xq);
}

/* The decode step's own barrier (a spinning sense-reversal barrier), instead of OpenMP's.
 * A step crosses ~11 barriers per layer. libgomp spins at its barriers only while no more
 * threads hold OpenMP teams than there are CPUs; every thread that ever ran a parallel region
 * keeps its team (the API server's worker threads, the thread that loaded the model), and past
 * that count each barrier sleeps and wakes through a futex: decoding through the API ran at
 * half the in-process speed. Spinning here is bounded: after a short spin the waiter yields. */
typedef struct {
    atomic_int arrived;
    atomic_int sense;
} team_bar;

static void team_barrier(team_bar *b, int nthreads, int *local_sense) {
    const int sense = !*local_sense;
    *local_sense = sense;
    if (nthreads == 1) return;
    if (atomic_fetch_add_explicit(&b->arrived, 1, memory_order_acq_rel) == nthreads - 1) {
        atomic_store_explicit(&b->arrived, 0, memory_order_relaxed);
        atomic_store_explicit(&b->sense, sense, memory_order_release);
        return;
    }
    for (unsigned spins = 0; atomic_load_explicit(&b->sense, memory_order_acquire) != sense; spins++) {
        if (spins < 4096) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        } else {
            sched_yield();
        }
    }
}

/* Run token `token` at cache row `row` (its room reserved by the caller) and write its logits. */
void fak_decode_step(const fak_model *m, int64_t token, int64_t row, const float *cos, const float *sin_signed,
                     const fak_cache *c, const fak_scratch *s, float *logits, int nthreads) {
    const int64_t D = m->dim, H = m->heads, KV = m->kv_heads, hd = m->head_dim, F = m->ffn;
    const int64_t groups = H / KV, L = row + 1, kv_row = KV * hd, layer_stride = c->capacity * kv_row;
    embed_row(m, token, s->x);
    team_bar bar = {0, 0};
#pragma omp parallel num_threads(nthreads)
    {
        const int team = omp_get_num_threads(), first = omp_get_thread_num() == 0;
        int sense = 0;
        for (int64_t i = 0; i < m->layers; i++) {
            const fak_layer *lw = &m->layer[i];
            float *K = c->k + i * layer_stride, *KR = c->kraw + i * layer_stride, *V = c->v + i * layer_stride;
            if (first) {
                rms_norm(s->x, lw->attn_norm, D, m->eps, s->h);
                fak_quantize_rows(s->h, 1, D, s->xd, s->xs, s->xq);
            }
            team_barrier(&bar, team, &sense);
            team_matvec(&lw->qkv, s->xd, s->xs, s->xq, s->qkv);
            team_barrier(&bar, team, &sense);
            if (first) {
                qkv_finish(lw, s->qkv, H, KV, hd, m->eps);
                const float *k = s->qkv + H * hd, *v = k + kv_row;
                memcpy(KR + row * kv_row, k, (size_t)kv_row * sizeof(float));
                memcpy(V + row * kv_row, v, (size_t)kv_row * sizeof(float));
                for (int64_t g = 0; g < KV; g++) rope(k + g * hd, cos, sin_signed, hd, K + row * kv_row + g * hd);
            }
            team_barrier(&bar, team, &sense);
#pragma omp for schedule(static) nowait
            for (int64_t h = 0; h < H; h++) {
                attend_head(s->qkv + h * hd, cos, sin_signed, K, V, c->keep, L, kv_row, (h / groups) * hd, hd, m->scale,
                            s->scores + h * L, s->att + h * hd);
            }
            team_barrier(&bar, team, &sense);
            if (first) fak_quantize_rows(s->att, 1, H * hd, s->xd, s->xs, s->xq);
            team_barrier(&bar, team, &sense);
            team_matvec(&lw->o, s->xd, s->xs, s->xq, s->h);
            team_barrier(&bar, team, &sense);
            if (first) {
                for (int64_t j = 0; j < D; j++) s->x[j] += s->h[j];
                rms_norm(s->x, lw->mlp_norm, D, m->eps, s->h);
                fak_quantize_rows(s->h, 1, D, s->xd, s->xs, s->xq);
            }
            team_barrier(&bar, team, &sense);
            team_matvec(&lw->gate_up, s->xd, s->xs, s->xq, s->gu);
            team_barrier(&bar, team, &sense);
            if (first) {
                for (int64_t j = 0; j < F; j++) {
                    const float g = s->gu[j];
                    s->h[j] = g / (1.0f + expf(-g)) * s->gu[F + j];
                }
                fak_quantize_rows(s->h, 1, F, s->xd, s->xs, s->xq);
            }
            team_barrier(&bar, team, &sense);
            team_matvec(&lw->down, s->xd, s->xs, s->xq, s->h);
            team_barrier(&bar, team, &sense);
            if (first)
                for (int64_t j = 0; j < D; j++) s->x[j] += s->h[j];
            team_barrier(&bar, team, &sense);
        }
        if (first) {
            rms_norm(s->x, m->norm, D, m->eps, s->h);
            fak_quantize_rows(s->h, 1, D, s->xd, s->xs, s->xq);
        }
        team_barrier(&bar, team, &sense);
        team_matvec(&m->head, s->xd, s->xs, s->xq, logits);
    }
}

/* --- one decode step of several sessions at once ----------------------------------------- */

/* Scratch for a batch of `b` rows: every buffer of fak_scratch, `b` times over (row t's at
 * t * its size), and `scores` with `scores_stride` floats per row (heads * (its row + 1)). */
typedef struct {
    float *x, *h, *qkv, *att, *gu, *xd, *xs, *scores;
    int8_t *xq;
    int64_t scores_stride;
    int16_t *x16; /* each input row's codes as one int16 per value, 256 q1 + q2 (exact) */
} fak_batch_scratch;

/* A row quantised for the batch: fak_quantize_rows' codes and scales, and its codes again as
 * one int16 per value, x16 = 256 q1 + q2 (|x16| <= 32639: exact), for team_matmul16. */
static void quantize_row16(const float *x, int64_t n, float *xd, float *xs, int8_t *xq, int16_t *x16) {
    fak_quantize_rows(x, 1, n, xd, xs, xq);
    for (int64_t blk = 0; blk < n / QK; blk++)
        for (int j = 0; j < QK; j++)
            x16[blk * QK + j] = (int16_t)(256 * xq[blk * 2 * QK + j] + xq[blk * 2 * QK + QK + j]);
}

/* Quantised input rows: row t's block scales and sums at t * d_stride, its int16 codes
 * (256 q1 + q2) at t * x16_stride, its int8 codes at t * xq_stride. */
typedef struct {
    const float *xd, *xs;
    const int8_t *xq;
    const int16_t *x16;
    int64_t d_stride, xq_stride, x16_stride;
} fak_inputs;

#define PF_ROWS 8     /* weight rows in a tile: one per lane of a vector */
#define PF_TOKENS 4   /* input rows run together against a tile (their sums in registers) */
#define PF_CHUNK 64   /* input rows whose codes stay in cache while a tile of rows runs over them */

/* weight rows r0..r0+nr-1 (nr <= PF_ROWS) against input rows t0..t1-1 (the prefill tiles, below) */
static void prefill_tile(const fak_qmat *w, int64_t r0, int nr, int64_t t0, int64_t t1, const fak_inputs *in,
                         float *y, int64_t ldy);

/* y[t] = W x[t] for t < b (row stride ldy), over inputs quantised per row (row t's scales at
 * t * xd_stride, its codes at t * xq_stride, its int16 codes at t * x16_stride); rows of W
 * split between the team's threads. Each output is the bytes qmat_row computes for its own
 * input row alone (team_matvec, fak_decode_step): a few input rows run qmat_row itself (each
 * weight row read straight from the file), more the prefill's tiles (a tile of weight rows
 * unpacked once and read against every input row), which form the same block integers and
 * run the same float operations in the same order. */
static void team_matmul16(const fak_qmat *w, int64_t b, const float *xd, const float *xs, const int8_t *xq,
                          const int16_t *x16, int64_t xd_stride, int64_t xq_stride, int64_t x16_stride, float *y,
                          int64_t ldy) {
    /* A tile unpacks its rows before use: for SmolLM2's split Q4_1/Q8_0 that is cheap and a
     * batch of 16 rows runs 1.15x faster in tiles; a RAW (K-quant) row's unpacking costs more
     * than reading it straight for each of up to 32 rows (1.5B-shaped Q4_K_M, 16 rows: 1.86 s
     * a step in tiles, 1.14 s straight), so RAW batches read straight, as a decode step does. */
    if (b >= PF_TOKENS && w->kind != KIND_RAW) {
        const fak_inputs in = {xd, xs, xq, x16, xd_stride, xq_stride, x16_stride};
#pragma omp for schedule(static) nowait
        for (int64_t r0 = 0; r0 < w->rows; r0 += PF_ROWS)
            prefill_tile(w, r0, w->rows - r0 < PF_ROWS ? (int)(w->rows - r0) : PF_ROWS, 0, b, &in, y, ldy);
        return;
    }
#pragma omp for schedule(static) nowait
    for (int64_t r0 = 0; r0 < w->rows; r0 += RAW_TR) raw_tile(w, r0, b, xd, xs, xq, xd_stride, xq_stride, y, ldy);
}

/* Run `b` sessions' next tokens in one pass over the weights: row t runs tokens[t] at row
 * rows[t] of its own cache caches[t] (room reserved by the caller), with its own RoPE tables
 * (cos and sin_signed: b x head_dim), and writes its logits at logits + t * vocab.
 *
 * Batch invariance: every value a row computes is computed by the same function, on the
 * same inputs, in the same order as fak_decode_step computes it for that row alone (norms,
 * quantisation, each product's sums, RoPE, attention over its own cache rows, residuals);
 * only the loops around them differ. So a row's KV and logits are the same bytes whatever
 * else is in the batch, and the same as a step of its own. No row reads another's cache. */
void fak_decode_batch(const fak_model *m, int64_t b, const int64_t *tokens, const int64_t *rows, const float *cos,
                      const float *sin_signed, const fak_cache *caches, const fak_batch_scratch *s, float *logits,
                      int nthreads) {
    const int64_t D = m->dim, H = m->heads, KV = m->kv_heads, hd = m->head_dim, F = m->ffn;
    const int64_t groups = H / KV, kv_row = KV * hd, qkv_n = (H + 2 * KV) * hd;
    const int64_t widest = D > F ? (D > H * hd ? D : H * hd) : (F > H * hd ? F : H * hd);
    const int64_t hn = widest, nbw = widest / QK + 1, xqn = 2 * widest;
    for (int64_t t = 0; t < b; t++) embed_row(m, tokens[t], s->x + t * D);
    team_bar bar = {0, 0};
#pragma omp parallel num_threads(nthreads)
    {
        const int team = omp_get_num_threads();
        int sense = 0;
        for (int64_t i = 0; i < m->layers; i++) {
            const fak_layer *lw = &m->layer[i];
#pragma omp for schedule(static) nowait
            for (int64_t t = 0; t < b; t++) {
                rms_norm(s->x + t * D, lw->attn_norm, D, m->eps, s->h + t * hn);
                quantize_row16(s->h + t * hn, D, s->xd + t * nbw, s->xs + t * nbw, s->xq + t * xqn, s->x16 + t * widest);
            }
            team_barrier(&bar, team, &sense);
            team_matmul16(&lw->qkv, b, s->xd, s->xs, s->xq, s->x16, nbw, xqn, widest, s->qkv, qkv_n);
            team_barrier(&bar, team, &sense);
#pragma omp for schedule(static) nowait
            for (int64_t t = 0; t < b; t++) {
                const int64_t layer_stride = caches[t].capacity * kv_row, row = rows[t];
                float *K = caches[t].k + i * layer_stride, *KR = caches[t].kraw + i * layer_stride,
                      *V = caches[t].v + i * layer_stride;
                qkv_finish(lw, s->qkv + t * qkv_n, H, KV, hd, m->eps);
                const float *k = s->qkv + t * qkv_n + H * hd, *v = k + kv_row;
                memcpy(KR + row * kv_row, k, (size_t)kv_row * sizeof(float));
                memcpy(V + row * kv_row, v, (size_t)kv_row * sizeof(float));
                for (int64_t g = 0; g < KV; g++)
                    rope(k + g * hd, cos + t * hd, sin_signed + t * hd, hd, K + row * kv_row + g * hd);
            }
            team_barrier(&bar, team, &sense);
#pragma omp for schedule(static) nowait
            for (int64_t th = 0; th < b * H; th++) {
                const int64_t t = th / H, h = th % H, L = rows[t] + 1;
                const int64_t layer_stride = caches[t].capacity * kv_row;
                attend_head(s->qkv + t * qkv_n + h * hd, cos + t * hd, sin_signed + t * hd, caches[t].k + i * layer_stride,
                            caches[t].v + i * layer_stride, caches[t].keep, L, kv_row, (h / groups) * hd, hd, m->scale,
                            s->scores + t * s->scores_stride + h * L, s->att + t * H * hd + h * hd);
            }
            team_barrier(&bar, team, &sense);
#pragma omp for schedule(static) nowait
            for (int64_t t = 0; t < b; t++)
                quantize_row16(s->att + t * H * hd, H * hd, s->xd + t * nbw, s->xs + t * nbw, s->xq + t * xqn, s->x16 + t * widest);
            team_barrier(&bar, team, &sense);
            team_matmul16(&lw->o, b, s->xd, s->xs, s->xq, s->x16, nbw, xqn, widest, s->h, hn);
            team_barrier(&bar, team, &sense);
#pragma omp for schedule(static) nowait
            for (int64_t t = 0; t < b; t++) {
                float *x = s->x + t * D, *h = s->h + t * hn;
                for (int64_t j = 0; j < D; j++) x[j] += h[j];
                rms_norm(x, lw->mlp_norm, D, m->eps, h);
                quantize_row16(h, D, s->xd + t * nbw, s->xs + t * nbw, s->xq + t * xqn, s->x16 + t * widest);
            }
            team_barrier(&bar, team, &sense);
            team_matmul16(&lw->gate_up, b, s->xd, s->xs, s->xq, s->x16, nbw, xqn, widest, s->gu, 2 * F);
            team_barrier(&bar, team, &sense);
#pragma omp for schedule(static) nowait
            for (int64_t t = 0; t < b; t++) {
                const float *gu = s->gu + t * 2 * F;
                float *h = s->h + t * hn;
                for (int64_t j = 0; j < F; j++) {
                    const float g = gu[j];
                    h[j] = g / (1.0f + expf(-g)) * gu[F + j];
                }
                quantize_row16(h, F, s->xd + t * nbw, s->xs + t * nbw, s->xq + t * xqn, s->x16 + t * widest);
            }
            team_barrier(&bar, team, &sense);
            team_matmul16(&lw->down, b, s->xd, s->xs, s->xq, s->x16, nbw, xqn, widest, s->h, hn);
            team_barrier(&bar, team, &sense);
#pragma omp for schedule(static) nowait
            for (int64_t t = 0; t < b; t++) {
                float *x = s->x + t * D;
                const float *h = s->h + t * hn;
                for (int64_t j = 0; j < D; j++) x[j] += h[j];
            }
            team_barrier(&bar, team, &sense);
        }
#pragma omp for schedule(static) nowait
        for (int64_t t = 0; t < b; t++) {
            rms_norm(s->x + t * D, m->norm, D, m->eps, s->h + t * hn);
            quantize_row16(s->h + t * hn, D, s->xd + t * nbw, s->xs + t * nbw, s->xq + t * xqn, s->x16 + t * widest);
        }
        team_barrier(&bar, team, &sense);
        team_matmul16(&m->head, b, s->xd, s->xs, s->xq, s->x16, nbw, xqn, widest, logits, m->vocab);
    }
}

/* --- prefill: many input rows against a matrix -------------------------------------------
 *
 * A prefill call multiplies T input rows by every weight row: bound by arithmetic, not by
 * reading the weights. Each weight row is unpacked once per chunk of input rows to one int16
 * code per value (u - off, or Q8_0's signed code) with its blocks' float scales and mins;
 * each input row is quantised as a decode step quantises it (fak_quantize_rows) and its codes
 * kept as int16 too (256 q1 + q2). A block's integers are then two vpmaddwd per (weight row,
 * input row): the same integers block_lanes and q4_block/q8_block form (integer sums are
 * exact however they are formed), and every float operation after them is the one-row
 * product's (group_float, the tail's lanes, the final sums). So an output is the bytes the
 * decode step's product computes for its input row alone, whatever else is in the call. */

typedef struct {
    int16_t *c;           /* n codes */
    float *lo, *hi, *mn;  /* n / 32 each */
    int halves, mins;
    int q8_split;         /* kind 1 (split Q8_0): row_q8_0's final sum, without the mins' accumulator */
} fak_row16;

/* weight row r of w into o (arrays sized for w->n) */
static void unpack_prefill_row(const fak_qmat *w, int64_t r, fak_row16 *o, uint8_t *u_scratch) {
    const int64_t n = w->n, nb = n / QK;
    o->q8_split = 0;
    if (w->kind == KIND_RAW) {
        fak_unpacked raw = {u_scratch, o->lo, o->hi, o->mn, 0, 0, 0};
        unpack_qmat_row(w, r, &raw);
        o->halves = raw.halves;
        o->mins = raw.mins;
        if (raw.off < 0)
            for (int64_t i = 0; i < n; i++) o->c[i] = (int16_t)(int8_t)raw.u[i];
        else
            for (int64_t i = 0; i < n; i++) o->c[i] = (int16_t)((int)raw.u[i] - raw.off);
        return;
    }
    o->halves = 0;
    o->mins = w->kind == 0;
    o->q8_split = w->kind == 1;
    for (int64_t b = 0; b < nb; b++) {
        o->lo[b] = o->hi[b] = half_to_float(w->d[r * nb + b]);
        o->mn[b] = w->kind == 0 ? half_to_float(w->m[r * nb + b]) : 0.0f;
        int16_t *c = o->c + b * QK;
        if (w->kind == 0) {
            const uint8_t *q = (const uint8_t *)w->q + (r * nb + b) * 16;
            for (int i = 0; i < 16; i++) {
                c[i] = (int16_t)(q[i] & 0x0f);
                c[16 + i] = (int16_t)(q[i] >> 4);
            }
        } else {
            const int8_t *q = (const int8_t *)w->q + (r * nb + b) * QK;
            for (int i = 0; i < QK; i++) c[i] = q[i];
        }
    }
}


#if defined(__AVX2__) && defined(__F16C__)
/* A tile of PF_ROWS weight rows laid out across vector lanes: lane r of a vector is row r.
 * pairs[(b * 16 + p) * 8 + r] holds row r's codes 2p and 2p+1 of block b (two int16), so
 * one vpmaddwd against an input's pair broadcast gives 8 rows' partial sums at once: no
 * horizontal sums. The scales are transposed the same way (lo[b * 8 + r]). */
typedef struct {
    int32_t *pairs;
    float *lo, *hi, *mn;
    __m256i halves, mins; /* per lane: all ones where that row's type has them */
    __m256i q8_split;     /* per lane: all ones for a split Q8_0 row (row_q8_0's sums) */
    int any_halves;
} fak_tile16;

/* The float side of one block for 8 rows and one input row: group_float's operations for
 * each row, in the lane of its row instead of the lane of its block (the same operations
 * on the same values, so the same bytes); acc and macc are the accumulators of lane j of
 * every row's group_float (j = the block's place in its group of 8). */
static inline void tile_block_float(const fak_tile16 *w, int64_t b, __m256i l, __m256i h, float xd, float xs,
                                    __m256 *acc, __m256 *macc) {
    const __m256 xdv = _mm256_set1_ps(xd);
    const __m256 lo = _mm256_loadu_ps(w->lo + b * 8);
    const __m256 whole = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(l, h)), _mm256_mul_ps(lo, xdv), *acc);
    if (w->any_halves) {
        const __m256 first = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l), _mm256_mul_ps(lo, xdv), *acc);
        const __m256 split = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), _mm256_mul_ps(_mm256_loadu_ps(w->hi + b * 8), xdv), first);
        *acc = _mm256_blendv_ps(whole, split, _mm256_castsi256_ps(w->halves));
    } else {
        *acc = whole;
    }
    const __m256 m = _mm256_fmadd_ps(_mm256_loadu_ps(w->mn + b * 8), _mm256_set1_ps(xs), *macc);
    *macc = _mm256_blendv_ps(*macc, m, _mm256_castsi256_ps(w->mins));
}

/* acc + the sums of adjacent int16 products of a and b, per int32 lane (exact: no lane can
 * overflow for block codes); one instruction with VNNI (vpdpwssd), two without */
static inline __m256i madd_acc(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpwssd_epi32(acc, a, b);
#elif defined(__AVXVNNI__)
    return _mm256_dpwssd_avx_epi32(acc, a, b);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

/* A tile against input rows t..t+NT-1 (NT a constant where it is inlined: the sums stay in
 * registers): every whole group's blocks (tile_block_float), then the tail blocks (fewer than
 * 8, one by one as raw_tail, row_q4_1 and row_q8_0 run them: lane k of a block is its values
 * 4k..4k+3, scaled by lo for k < 4 and hi above), then each row's final sum (hsum256 of
 * acc + macc, plus the tail's mins; row_q8_0's hsum256 of acc alone for split Q8_0 rows),
 * all in the lane of its row: the one-row product's operations in the same order. */
static inline __attribute__((always_inline)) void tile_times(const fak_tile16 *w, int64_t n, const int NT,
                                                               const fak_inputs *in, int64_t t, float *y, int64_t ldy,
                                                               int64_t r0, int nr) {
    const int64_t nb = n / QK, whole = nb / 8 * 8;
    const int16_t *x16 = in->x16;
    const float *xd = in->xd, *xs = in->xs;
    const int64_t ds = in->d_stride, cs = in->x16_stride;
    __m256 acc[PF_TOKENS][8], macc[PF_TOKENS][8];
    for (int k = 0; k < NT; k++)
        for (int j = 0; j < 8; j++) acc[k][j] = macc[k][j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < whole; b++) {
        __m256i l[PF_TOKENS], h[PF_TOKENS];
        for (int k = 0; k < NT; k++) l[k] = h[k] = _mm256_setzero_si256();
        const __m256i *wp = (const __m256i *)(w->pairs + b * 16 * 8);
        for (int p = 0; p < 8; p++) {
            const __m256i wl = _mm256_loadu_si256(wp + p), wh = _mm256_loadu_si256(wp + 8 + p);
            for (int k = 0; k < NT; k++) {
                const int32_t *xp = (const int32_t *)(x16 + (t + k) * cs + b * QK);
                l[k] = madd_acc(l[k], wl, _mm256_set1_epi32(xp[p]));
                h[k] = madd_acc(h[k], wh, _mm256_set1_epi32(xp[8 + p]));
            }
        }
        for (int k = 0; k < NT; k++)
            tile_block_float(w, b, l[k], h[k], xd[(t + k) * ds + b], xs[(t + k) * ds + b], &acc[k][b % 8], &macc[k][b % 8]);
    }
    __m256 tail[PF_TOKENS];
    for (int k = 0; k < NT; k++) tail[k] = _mm256_setzero_ps();
    for (int64_t b = whole; b < nb; b++) {
        const __m256i *wp = (const __m256i *)(w->pairs + b * 16 * 8);
        const __m256 lo = _mm256_loadu_ps(w->lo + b * 8), hi = _mm256_loadu_ps(w->hi + b * 8);
        const __m256 mn = _mm256_loadu_ps(w->mn + b * 8);
        for (int k = 0; k < NT; k++) {
            const int32_t *xp = (const int32_t *)(x16 + (t + k) * cs + b * QK);
            const __m256 xdv = _mm256_set1_ps(xd[(t + k) * ds + b]);
            const __m256 slo = _mm256_mul_ps(lo, xdv), shi = _mm256_mul_ps(hi, xdv);
            for (int j = 0; j < 8; j++) { /* lane j: values 4j..4j+3, the pairs 2j and 2j+1 */
                const __m256i sum = madd_acc(_mm256_madd_epi16(_mm256_loadu_si256(wp + 2 * j), _mm256_set1_epi32(xp[2 * j])),
                                             _mm256_loadu_si256(wp + 2 * j + 1), _mm256_set1_epi32(xp[2 * j + 1]));
                acc[k][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), j < 4 ? slo : shi, acc[k][j]);
            }
            const __m256 m = _mm256_add_ps(tail[k], _mm256_mul_ps(mn, _mm256_set1_ps(xs[(t + k) * ds + b])));
            tail[k] = _mm256_blendv_ps(m, tail[k], _mm256_castsi256_ps(w->q8_split));
        }
    }
    for (int k = 0; k < NT; k++) {
        __m256 v[8];
        for (int j = 0; j < 8; j++) v[j] = _mm256_add_ps(acc[k][j], macc[k][j]);
        /* hsum256's order: ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)) */
        const __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(v[0], v[4]), _mm256_add_ps(v[2], v[6])),
                                         _mm256_add_ps(_mm256_add_ps(v[1], v[5]), _mm256_add_ps(v[3], v[7])));
        const __m256 *a = acc[k];
        const __m256 q8 = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6])),
                                        _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7])));
        const __m256 out = _mm256_blendv_ps(_mm256_add_ps(sum, tail[k]), q8, _mm256_castsi256_ps(w->q8_split));
        float *dst = y + (t + k) * ldy + r0;
        if (nr == PF_ROWS) {
            _mm256_storeu_ps(dst, out);
        } else {
            float lanes[8];
            _mm256_storeu_ps(lanes, out);
            memcpy(dst, lanes, (size_t)nr * sizeof(float));
        }
    }
}
#endif

/* Weight rows r0..r0+nr-1 (nr <= PF_ROWS) against input rows t0..t1-1. */
static void prefill_tile(const fak_qmat *w, int64_t r0, int nr, int64_t t0, int64_t t1, const fak_inputs *in,
                         float *y, int64_t ldy) {
    const int64_t n = w->n, nb = n / QK;
#if defined(__AVX2__) && defined(__F16C__)
    int16_t c[PF_ROWS][n];
    float lo[PF_ROWS][nb + 1], hi[PF_ROWS][nb + 1], mn[PF_ROWS][nb + 1];
    uint8_t u[n];
    fak_row16 rows[PF_ROWS];
    int32_t pairs[n / 2 * PF_ROWS];
    float tlo[nb * 8 + 8], thi[nb * 8 + 8], tmn[nb * 8 + 8];
    int32_t halves[8] = {0}, mins[8] = {0}, q8[8] = {0};
    int any_halves = 0;
    for (int i = 0; i < PF_ROWS; i++) {
        rows[i] = (fak_row16){c[i], lo[i], hi[i], mn[i], 0, 0, 0};
        if (i < nr) {
            unpack_prefill_row(w, r0 + i, &rows[i], u);
        } else { /* a missing row: zeros, never stored */
            memset(c[i], 0, (size_t)n * sizeof(int16_t));
            for (int64_t b = 0; b < nb; b++) lo[i][b] = hi[i][b] = mn[i][b] = 0.0f;
        }
        halves[i] = rows[i].halves ? -1 : 0;
        mins[i] = rows[i].mins ? -1 : 0;
        q8[i] = rows[i].q8_split ? -1 : 0;
        any_halves |= rows[i].halves;
        const int32_t *cp = (const int32_t *)c[i];
        for (int64_t q = 0; q < n / 2; q++) pairs[q * 8 + i] = cp[q];
        for (int64_t b = 0; b < nb; b++) {
            tlo[b * 8 + i] = lo[i][b];
            thi[b * 8 + i] = hi[i][b];
            tmn[b * 8 + i] = mn[i][b];
        }
    }
    const fak_tile16 tile = {pairs, tlo, thi, tmn, _mm256_loadu_si256((const __m256i *)halves),
                             _mm256_loadu_si256((const __m256i *)mins), _mm256_loadu_si256((const __m256i *)q8),
                             any_halves};
    int64_t t = t0;
    for (; t + PF_TOKENS <= t1; t += PF_TOKENS) tile_times(&tile, n, PF_TOKENS, in, t, y, ldy, r0, nr);
    for (; t < t1; t++) tile_times(&tile, n, 1, in, t, y, ldy, r0, nr);
#else
    (void)nb;
    for (int i = 0; i < nr; i++)
        for (int64_t t = t0; t < t1; t++)
            y[t * ldy + r0 + i] = qmat_row(w, r0 + i, in->xd + t * in->d_stride, in->xs + t * in->d_stride,
                                           in->xq + t * in->xq_stride);
#endif
}

/* y (m x rows, row stride ldy) = x (m x n) @ W^T, x quantised per row in blocks of 32.
 * xd, xs: m * n/32 floats of scratch; xq: 2 * m * n bytes; x16: m * n int16. A few input
 * rows (fewer than PF_TOKENS) run the decode step's own product (qmat_row: the file's bytes
 * read straight, nothing unpacked); more run the prefill tiles. Every output is the bytes
 * qmat_row computes for its input row alone, whichever way: batch-invariant. */
void fak_matmul(const fak_qmat *w, const float *x, int64_t m, float *y, int64_t ldy, float *xd, float *xs,
                int8_t *xq, int16_t *x16, int nthreads) {
    const int64_t n = w->n, nb = n / QK;
    if (m < PF_TOKENS) {
        fak_quantize_rows(x, m, n, xd, xs, xq);
#pragma omp parallel for num_threads(nthreads) schedule(static)
        for (int64_t r = 0; r < w->rows; r++)
            for (int64_t t = 0; t < m; t++) y[t * ldy + r] = qmat_row(w, r, xd + t * nb, xs + t * nb, xq + t * 2 * n);
        return;
    }
#pragma omp parallel num_threads(nthreads)
    {
#pragma omp for schedule(static)
        for (int64_t t = 0; t < m; t++) {
            fak_quantize_rows(x + t * n, 1, n, xd + t * nb, xs + t * nb, xq + t * 2 * n);
            const int8_t *q = xq + t * 2 * n;
            for (int64_t b = 0; b < nb; b++)
                for (int j = 0; j < QK; j++)
                    x16[t * n + b * QK + j] = (int16_t)(256 * q[b * 2 * QK + j] + q[b * 2 * QK + QK + j]);
        }
        const fak_inputs in = {xd, xs, xq, x16, nb, 2 * n, n};
        for (int64_t t0 = 0; t0 < m; t0 += PF_CHUNK) {
            const int64_t t1 = t0 + PF_CHUNK < m ? t0 + PF_CHUNK : m;
#pragma omp for schedule(static)
            for (int64_t r0 = 0; r0 < w->rows; r0 += PF_ROWS) {
                const int nr = w->rows - r0 < PF_ROWS ? (int)(w->rows - r0) : PF_ROWS;
                prefill_tile(w, r0, nr, t0, t1, &in, y, ldy);
            }
        }
    }
}
