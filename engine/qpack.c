/*
 * qpack.c - the level-independent parts of the integer product path
 * (kernels/qdot.h): which types it covers, the packed weight layout and the
 * quantization of activations. Plain C: the bytes and values are the same
 * whatever level then multiplies them.
 */
#include <math.h>
#include <string.h>

#include "dtype.h"
#include "kernels/kernels.h"
#include "kernels/qdot.h"

const int8_t qk_iq4_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                  1,    13,   25,  38,  53,  69,  89,  113};

int qk_supported(int32_t dtype) {
    switch (dtype) {
    case CART_Q4_0: case CART_Q4_1: case CART_Q5_0: case CART_Q5_1: case CART_Q8_0: case CART_IQ4_NL:
    case CART_Q2_K: case CART_Q3_K: case CART_Q4_K: case CART_Q5_K: case CART_Q6_K: case CART_IQ4_XS:
        return 1;
    default:
        return 0;
    }
}

int32_t qk_act_kind_of(int32_t dtype) {
    if (dtype == CART_Q4_1 || dtype == CART_Q5_1) return QK_ACT_Q8_1;
    return qk_block_size(dtype) == 256 ? QK_ACT_Q8_K : QK_ACT_Q8_0;
}

int64_t qk_block_size(int32_t dtype) {
    switch (dtype) {
    case CART_Q2_K: case CART_Q3_K: case CART_Q4_K: case CART_Q5_K: case CART_Q6_K: case CART_IQ4_XS:
        return 256;
    default:
        return 32;
    }
}

int64_t qk_qbytes(int32_t dtype) {
    static const int per_unit[9] = {0, 0, 128, 192, 256, 320, 384, 0, 512};
    return qk_block_size(dtype) / 32 * per_unit[qk_field_bits(dtype)];
}

int64_t qk_sbytes(int32_t dtype) {
    switch (dtype) {
    case CART_Q4_1: case CART_Q5_1: return 64;
    case CART_Q4_K: case CART_Q5_K: return 64 + 256;
    case CART_Q6_K: case CART_Q3_K: return 32 + 256;
    case CART_Q2_K: return 64 + 256;
    case CART_IQ4_XS: return 32 + 128;
    default: return 32;
    }
}

uint64_t qk_group_bytes(int32_t dtype, int64_t cols) {
    const uint64_t nb = (uint64_t)(cols / qk_block_size(dtype));
    const uint64_t bytes = nb * (uint64_t)(qk_qbytes(dtype) + qk_sbytes(dtype));
    return (bytes + 63) & ~(uint64_t)63;
}

void qk_src_init(qk_src *s, int32_t dtype, const void *packed, int64_t rows, int64_t cols) {
    memset(s, 0, sizeof *s);
    s->data = packed;
    s->dtype = dtype;
    s->rows = rows;
    s->cols = cols;
    s->nb = cols / qk_block_size(dtype);
    s->groups = (rows + QK_ROWS - 1) / QK_ROWS;
    s->group_bytes = qk_group_bytes(dtype, cols);
    s->qbytes = qk_qbytes(dtype);
    s->sbytes = qk_sbytes(dtype);
}

/* ---- one block of one row: its fields and scales -------------------------- */

typedef struct fields {
    uint8_t u[256];  /* each element's stored field */
    uint16_t d, d2;  /* f16 bits: d, and dmin (K types) or m (q4_1, q5_1) */
    uint8_t sc[16];  /* per sub-block: the scale byte as the layout stores it */
    uint8_t mn[16];  /* q4_K q5_K: the min */
} fields;

static uint16_t load16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

/* q4_0 q4_1 q5_0 q5_1 iq4_nl: element l < 16 the low nibble of qs[l], 16 + l
 * the high; bit l of qh the fifth. */
static void fields_32(fields *f, int32_t dtype, const uint8_t *b) {
    const int five = dtype == CART_Q5_0 || dtype == CART_Q5_1;
    const int with_m = dtype == CART_Q4_1 || dtype == CART_Q5_1;
    f->d = load16(b);
    f->d2 = with_m ? load16(b + 2) : 0;
    const uint8_t *qs = b + 2 + 2 * with_m + 4 * five;
    uint32_t qh = 0;
    if (five) memcpy(&qh, qs - 4, 4);
    for (int l = 0; l < 16; l++) {
        f->u[l] = (uint8_t)((qs[l] & 15) | (((qh >> l) & 1) << 4));
        f->u[l + 16] = (uint8_t)((qs[l] >> 4) | (((qh >> (l + 16)) & 1) << 4));
    }
}

static void fields_q4_q5_K(fields *f, int32_t dtype, const uint8_t *b) {
    f->d = load16(b);
    f->d2 = load16(b + 2);
    for (int j = 0; j < 8; j++) {
        int sc, mn;
        cart_scale_min_k4(j, b + 4, &sc, &mn);
        f->sc[j] = (uint8_t)sc;
        f->mn[j] = (uint8_t)mn;
    }
    const uint8_t *qs = b + (dtype == CART_Q4_K ? 16 : 48), *qh = b + 16;
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            const int hi = dtype == CART_Q5_K ? qh[l] >> (2 * c) : 0;
            f->u[64 * c + l] = (uint8_t)((qs[32 * c + l] & 15) | (hi & 1) << 4);
            f->u[64 * c + 32 + l] = (uint8_t)((qs[32 * c + l] >> 4) | (hi & 2) << 3);
        }
}

static void fields_q6_K(fields *f, const uint8_t *b) {
    f->d = load16(b + 208);
    memcpy(f->sc, b + 192, 16);
    for (int h = 0; h < 2; h++)
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                const int ql = b[64 * h + 32 * (g & 1) + l] >> (g < 2 ? 0 : 4);
                const int qh = b[128 + 32 * h + l] >> (2 * g);
                f->u[128 * h + 32 * g + l] = (uint8_t)((ql & 15) | (qh & 3) << 4);
            }
}

static void fields_q3_K(fields *f, const uint8_t *b) {
    f->d = load16(b + 108);
    const uint8_t *s = b + 96;
    for (int k = 0; k < 16; k++) {
        const int low = k < 8 ? (s[k] & 15) : (s[k - 8] >> 4);
        const int high = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
        f->sc[k] = (uint8_t)(int8_t)((low | high << 4) - 32);
    }
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int m = 0; m < 32; m++) {
                const int low = (b[32 + 32 * h + m] >> (2 * j)) & 3;
                const int high = (b[m] >> (4 * h + j)) & 1; /* set: q = low, else low - 4 */
                f->u[128 * h + 32 * j + m] = (uint8_t)(low | high << 2);
            }
}

static void fields_q2_K(fields *f, const uint8_t *b) {
    f->d = load16(b + 80);
    f->d2 = load16(b + 82);
    memcpy(f->sc, b, 16);
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int m = 0; m < 32; m++) f->u[128 * h + 32 * j + m] = (b[16 + 32 * h + m] >> (2 * j)) & 3;
}

static void fields_iq4_xs(fields *f, const uint8_t *b) {
    f->d = load16(b);
    const uint16_t sh = load16(b + 2);
    for (int j = 0; j < 8; j++) {
        const int ls = ((b[4 + j / 2] >> (4 * (j % 2))) & 15) | (((sh >> (2 * j)) & 3) << 4);
        f->sc[j] = (uint8_t)(int8_t)(ls - 32);
        const uint8_t *qs = b + 8 + 16 * j;
        for (int l = 0; l < 16; l++) {
            f->u[32 * j + l] = qs[l] & 15;
            f->u[32 * j + 16 + l] = qs[l] >> 4;
        }
    }
}

static void read_fields(fields *f, int32_t dtype, const uint8_t *b) {
    memset(f, 0, sizeof *f);
    switch (dtype) {
    case CART_Q8_0:
        f->d = load16(b);
        memcpy(f->u, b + 2, 32);
        break;
    case CART_Q4_K: case CART_Q5_K: fields_q4_q5_K(f, dtype, b); break;
    case CART_Q6_K: fields_q6_K(f, b); break;
    case CART_Q3_K: fields_q3_K(f, b); break;
    case CART_Q2_K: fields_q2_K(f, b); break;
    case CART_IQ4_XS: fields_iq4_xs(f, b); break;
    default: fields_32(f, dtype, b); break;
    }
}

/* ---- packing ---------------------------------------------------------------- */

/* The field of element 4g + i (of unit `unit`) of row r, bits [lo, lo + n). */
static int field_of(const fields *f, int unit, int g, int i, int lo, int n) {
    return (f->u[32 * unit + 4 * g + i] >> lo) & ((1 << n) - 1);
}

/* The quant vectors of one block of a group from its 16 rows' fields. */
static void pack_quants(uint8_t *q, int32_t dtype, const fields *f) {
    const int bits = qk_field_bits(dtype), units = (int)(qk_block_size(dtype) / 32);
    uint8_t *extra = q + units * (bits == 8 ? 512 : bits == 2 || bits == 3 ? 128 : 256);
    for (int s = 0; s < units; s++)
        for (int k = 0; k < 64; k++) {
            const int r = k / 4, i = k % 4;
            const fields *fr = f + r;
            if (bits == 8) {
                for (int g = 0; g < 8; g++) q[512 * s + 64 * g + k] = fr->u[32 * s + 4 * g + i];
                continue;
            }
            if (bits >= 4) { /* N(p): low nibble QV(p), high QV(p + 4) */
                for (int p = 0; p < 4; p++)
                    q[256 * s + 64 * p + k] =
                        (uint8_t)(field_of(fr, s, p, i, 0, 4) | field_of(fr, s, p + 4, i, 0, 4) << 4);
            } else { /* L(h): 2-bit fields of QV(4h .. 4h + 3) */
                for (int h = 0; h < 2; h++) {
                    int v = 0;
                    for (int g = 0; g < 4; g++) v |= field_of(fr, s, 4 * h + g, i, 0, 2) << (2 * g);
                    q[128 * s + 64 * h + k] = (uint8_t)v;
                }
            }
            if (bits == 5 || bits == 3) { /* H: bit g the fifth (third) bit of QV(g) */
                int v = 0;
                for (int g = 0; g < 8; g++) v |= field_of(fr, s, g, i, bits == 5 ? 4 : 2, 1) << g;
                extra[64 * s + k] = (uint8_t)v;
            } else if (bits == 6) { /* H2(h): bits 4-5 of QV(4h .. 4h + 3) */
                for (int h = 0; h < 2; h++) {
                    int v = 0;
                    for (int g = 0; g < 4; g++) v |= field_of(fr, s, 4 * h + g, i, 4, 2) << (2 * g);
                    extra[128 * s + 64 * h + k] = (uint8_t)v;
                }
            }
        }
}

/* The scales of one block of a group, lane r from row r's fields. */
static void pack_scales(uint8_t *sd, int32_t dtype, const fields *f) {
    for (int r = 0; r < QK_ROWS; r++) memcpy(sd + 2 * r, &f[r].d, 2);
    const int subs = dtype == CART_Q6_K || dtype == CART_Q3_K || dtype == CART_Q2_K ? 16 : 8;
    switch (dtype) {
    case CART_Q4_1: case CART_Q5_1: case CART_Q4_K: case CART_Q5_K: case CART_Q2_K:
        for (int r = 0; r < QK_ROWS; r++) memcpy(sd + 32 + 2 * r, &f[r].d2, 2);
        break;
    default:
        break;
    }
    uint8_t *s = sd + (dtype == CART_Q6_K || dtype == CART_Q3_K || dtype == CART_IQ4_XS ? 32 : 64);
    if (!(qk_block_size(dtype) == 256)) return;
    for (int j = 0; j < subs; j++)
        for (int r = 0; r < QK_ROWS; r++) {
            s[16 * j + r] = f[r].sc[j];
            if (dtype == CART_Q4_K || dtype == CART_Q5_K) s[128 + 16 * j + r] = f[r].mn[j];
        }
}

void qk_pack_groups(uint8_t *dst, int32_t dtype, const uint8_t *rows_data, uint64_t row_bytes,
                    int64_t rows, int64_t cols, int64_t g0, int64_t g1) {
    cart_dtype_info info;
    cart_dtype_get_info(&info, dtype);
    const int64_t nb = cols / qk_block_size(dtype), qb = qk_qbytes(dtype), sb = qk_sbytes(dtype);
    const uint64_t gbytes = qk_group_bytes(dtype, cols);
    fields f[QK_ROWS];
    for (int64_t g = g0; g < g1; g++) {
        uint8_t *grp = dst + (uint64_t)(g - g0) * gbytes;
        memset(grp, 0, gbytes);
        for (int64_t b = 0; b < nb; b++) {
            for (int r = 0; r < QK_ROWS; r++) {
                const int64_t row = g * QK_ROWS + r;
                if (row < rows)
                    read_fields(&f[r], dtype, rows_data + (uint64_t)row * row_bytes + (uint64_t)(b * info.type_size));
                else memset(&f[r], 0, sizeof f[r]);
            }
            pack_quants(grp + b * qb, dtype, f);
            pack_scales(grp + nb * qb + b * sb, dtype, f);
        }
    }
}

/* ---- activations ------------------------------------------------------------- */

static size_t round64(size_t n) {
    return (n + 63) & ~(size_t)63;
}

size_t qk_act_bytes(int32_t kind, int64_t n, int64_t cols) {
    const size_t q = round64((size_t)(n * cols));
    const size_t nblk = (size_t)(n * (kind == QK_ACT_Q8_K ? cols / 256 : cols / 32));
    const size_t sums = (size_t)(n * (kind == QK_ACT_Q8_K ? cols / 16 : cols / 32));
    const size_t units = (size_t)(kind == QK_ACT_Q8_K ? n * (cols / 32) : 0);
    return q + round64(4 * nblk) + round64(4 * sums) + round64(kind == QK_ACT_Q8_1 ? 4 * nblk : 0) +
           round64(2 * units) + 64;
}

void qk_act_init(qk_act *a, void *buf, int32_t kind, int64_t n, int64_t cols) {
    memset(a, 0, sizeof *a);
    uint8_t *p = (uint8_t *)(((uintptr_t)buf + 63) & ~(uintptr_t)63);
    const size_t nblk = (size_t)(n * (kind == QK_ACT_Q8_K ? cols / 256 : cols / 32));
    const size_t sums = (size_t)(n * (kind == QK_ACT_Q8_K ? cols / 16 : cols / 32));
    a->kind = kind;
    a->n = n;
    a->cols = cols;
    a->q = (int8_t *)p;
    p += round64((size_t)(n * cols));
    a->d = (float *)p;
    p += round64(4 * nblk);
    a->s = (int32_t *)p;
    p += round64(4 * sums);
    a->sf = kind == QK_ACT_Q8_1 ? (float *)p : NULL;
    p += round64(kind == QK_ACT_Q8_1 ? 4 * nblk : 0);
    a->u = kind == QK_ACT_Q8_K ? (int16_t *)p : NULL;
}

/* q8_K's sums of 32 as int16 (a->u) for rows [i0, i1), from its sums of 16. */
void qk_unit_sums(qk_act *a, int64_t i0, int64_t i1) {
    if (a->kind != QK_ACT_Q8_K) return;
    const int64_t units = a->cols / 32;
    for (int64_t i = i0; i < i1; i++)
        for (int64_t j = 0; j < units; j++)
            a->u[i * units + j] = (int16_t)(a->s[i * 2 * units + 2 * j] + a->s[i * 2 * units + 2 * j + 1]);
}

/* Round to nearest, ties to even, of a float of magnitude at most 2^22:
 * GGML's nearest_int. NaN gives 0. */
static int rne(float v) {
    if (v != v) return 0;
    float t = v + 12582912.f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* max |x| over n, a NaN counting as the largest. */
static float absmax(const float *x, int n, int *at) {
    float amax = 0.0f;
    *at = 0;
    for (int i = 0; i < n; i++) {
        const float v = fabsf(x[i]);
        if (v > amax || (v != v && amax == amax)) {
            amax = v;
            *at = i;
        }
    }
    return amax;
}

static void quantize_32(const qk_act *a, const float *x, int64_t i) {
    const int64_t nb = a->cols / 32;
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + 32 * b;
        int at;
        const float amax = absmax(xb, 32, &at);
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int8_t *q = a->q + i * a->cols + 32 * b;
        int32_t sum = 0;
        for (int k = 0; k < 32; k++) {
            q[k] = (int8_t)rne(xb[k] * id);
            sum += q[k];
        }
        qk_act_put32(a, i, b, d, sum);
    }
}

void qk_act_put32(const qk_act *a, int64_t i, int64_t b, float d, int32_t sum) {
    const int64_t nb = a->cols / 32;
    a->d[i * nb + b] = cart_f16_to_f32(cart_f32_to_f16(d));
    a->s[i * nb + b] = sum;
    if (a->sf) a->sf[i * nb + b] = cart_f16_to_f32(cart_f32_to_f16((float)sum * d));
}

void qk_act_zero256(const qk_act *a, int64_t i, int64_t b) {
    memset(a->q + i * a->cols + 256 * b, 0, 256);
    memset(a->s + i * (a->cols / 16) + 16 * b, 0, 16 * sizeof *a->s);
    a->d[i * (a->cols / 256) + b] = 0.0f;
}

static void quantize_256(const qk_act *a, const float *x, int64_t i) {
    const int64_t nb = a->cols / 256;
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + 256 * b;
        int8_t *q = a->q + i * a->cols + 256 * b;
        int32_t *s = a->s + i * (a->cols / 16) + 16 * b;
        int at;
        const float amax = absmax(xb, 256, &at);
        if (amax == 0.0f) {
            qk_act_zero256(a, i, b);
            continue;
        }
        const float iscale = -127.0f / xb[at];
        for (int k = 0; k < 256; k++) {
            const int v = rne(iscale * xb[k]);
            q[k] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < 16; j++) {
            int32_t sum = 0;
            for (int k = 0; k < 16; k++) sum += q[16 * j + k];
            s[j] = sum;
        }
        a->d[i * nb + b] = 1.0f / iscale;
    }
}

void qk_quantize_rows_c(qk_act *a, const float *x, int64_t ldx, int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++) {
        if (a->kind == QK_ACT_Q8_K) quantize_256(a, x + i * ldx, i);
        else quantize_32(a, x + i * ldx, i);
    }
}
