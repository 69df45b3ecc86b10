/*
 * grammar_lex.c - the lexical steps of the grammar (grammar_internal.h): JSON numbers
 * within bounds, kept exactly in 128-bit fixed point, and JSON strings
 * counted by code points.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"
#include "internal.h"

/* ---- numbers ------------------------------------------------------------ */

static i128 pow10_i(int k) {
    i128 r = 1;
    while (k-- > 0) r *= 10;
    return r;
}

/* The largest magnitude a number of this kind can be written with. */
i128 cart_gr_max_magnitude(int integer) {
    return integer ? GR_SCALE - 1 : GR_SCALE * GR_SCALE - 1;
}

/* floor and ceil of num * 2^sh. */
static void dyadic(i128 num, int sh, i128 *fl, i128 *ce) {
    if (sh >= 0) {
        *fl = *ce = num * ((i128)1 << sh);
        return;
    }
    int k = -sh;
    if (k > 120) {
        *fl = num > 0 ? 0 : num < 0 ? -1 : 0;
        *ce = num > 0 ? 1 : 0;
        return;
    }
    i128 mag = num < 0 ? -num : num;
    i128 q = mag >> k, r = mag & (((i128)1 << k) - 1);
    if (num >= 0) {
        *fl = q;
        *ce = q + (r != 0);
    } else {
        *fl = -(q + (r != 0));
        *ce = -q;
    }
}

/* x = mant * 2^exp with mant an integer of at most 53 bits. */
static void split_double(double x, int64_t *mant, int *exp) {
    int e;
    double f = frexp(x, &e);
    *mant = (int64_t)ldexp(f, 53);
    *exp = e - 53;
}

/* floor and ceil of (a + b) / 2 * 10^16, exactly, for adjacent doubles a,
 * b of magnitude below 1e17. */
static void scaled_midpoint(double a, double b, i128 *fl, i128 *ce) {
    int64_t ma, mb;
    int ea, eb;
    split_double(a, &ma, &ea);
    split_double(b, &mb, &eb);
    i128 sum;
    int e;
    if (ma == 0) {
        sum = mb, e = eb;
    } else if (mb == 0) {
        sum = ma, e = ea;
    } else {
        e = ea < eb ? ea : eb;
        sum = (i128)ma * ((i128)1 << (ea - e)) + (i128)mb * ((i128)1 << (eb - e));
    }
    /* 10^16 = 5^16 * 2^16 */
    dyadic(sum * (i128)152587890625LL, e - 1 + 16, fl, ce);
}

static int even_significand(double b) {
    uint64_t bits;
    memcpy(&bits, &b, sizeof bits);
    return (bits & 1) == 0;
}

/* The least X (in units of 10^-16) whose double, as a JSON parser rounds
 * it, is >= b. */
i128 cart_gr_scaled_min_incl(double b) {
    if (b >= 1e17) return GR_SCALE * GR_SCALE;
    if (b <= -1e17) return -GR_SCALE * GR_SCALE;
    i128 fl, ce;
    scaled_midpoint(nextafter(b, -INFINITY), b, &fl, &ce);
    if (fl == ce) return even_significand(b) ? fl : fl + 1; /* a tie rounds to the even neighbour */
    return ce;
}

/* The greatest X whose double is <= b. */
i128 cart_gr_scaled_max_incl(double b) {
    if (b >= 1e17) return GR_SCALE * GR_SCALE;
    if (b <= -1e17) return -GR_SCALE * GR_SCALE;
    i128 fl, ce;
    scaled_midpoint(b, nextafter(b, INFINITY), &fl, &ce);
    if (fl == ce) return even_significand(b) ? fl : fl - 1;
    return fl;
}

i128 cart_gr_floor_div(i128 a, i128 d) {
    i128 q = a / d;
    if ((a % d != 0) && (a < 0)) q--;
    return q;
}

i128 cart_gr_ceil_div(i128 a, i128 d) {
    i128 q = a / d;
    if ((a % d != 0) && (a > 0)) q++;
    return q;
}

/* Number frame state, packed in a frame's `a`:
 *   bit 0       negative
 *   bits 1-3    phase
 *   bits 4-8    integer digits
 *   bits 9-13   fraction digits
 *   bits 14-15  exponent digits
 *   bit 16      the integer part is a leading 0 (no more integer digits)
 * v0 holds the integer digits' value, v1 the fraction digits'. */
enum { N_START, N_MINUS, N_INT, N_DOT, N_FRAC, N_EXP, N_EXP_SIGN, N_EXP_DIGITS };

#define N_NEG(a) ((a) & 1u)
#define N_PHASE(a) (((a) >> 1) & 7u)
#define N_NINT(a) (((a) >> 4) & 31u)
#define N_NFRAC(a) (((a) >> 9) & 31u)
#define N_NEXP(a) (((a) >> 14) & 3u)
#define N_ZERO(a) (((a) >> 16) & 1u)
#define N_PACK(neg, phase, nint, nfrac, nexp, zero) \
    ((uint32_t)(neg) | (uint32_t)(phase) << 1 | (uint32_t)(nint) << 4 | (uint32_t)(nfrac) << 9 | \
     (uint32_t)(nexp) << 14 | (uint32_t)(zero) << 16)

/* Whether some completion of the number so far lies within the bounds. */
static int number_feasible(const num_spec *s, uint32_t a, int64_t I, int64_t F) {
    if (!s->bounded) return 1;
    i128 unit = s->integer ? 1 : GR_SCALE;
    i128 L, H; /* the magnitudes allowed for this sign */
    if (!N_NEG(a)) {
        L = s->lo > 0 ? s->lo : 0;
        H = s->hi;
    } else {
        L = s->hi < 0 ? -s->hi : 0;
        H = -s->lo;
    }
    if (H < L || H < 0) return 0;
    i128 maxm = cart_gr_max_magnitude(s->integer);
    switch (N_PHASE(a)) {
    case N_START:
    case N_MINUS:
        return L <= maxm;
    case N_INT: {
        if (N_ZERO(a)) return s->integer ? L == 0 : L <= unit - 1;
        int n = (int)N_NINT(a);
        i128 p = 1;
        for (int j = 0; j + n <= NUM_DIGITS; j++, p *= 10) {
            i128 lo = (i128)I * p * unit, hi = ((i128)I + 1) * p * unit - 1;
            if (lo <= H && hi >= L) return 1;
        }
        return 0;
    }
    case N_DOT:
    case N_FRAC: {
        int k = (int)N_NFRAC(a);
        i128 step = pow10_i(NUM_DIGITS - k);
        i128 lo = (i128)I * GR_SCALE + (i128)F * step, hi = lo + step - 1;
        return lo <= H && hi >= L;
    }
    default:
        return 1; /* exponents only when unbounded */
    }
}

/* Whether the number so far is a complete number within the bounds. */
int cart_gr_number_complete(const num_spec *s, uint32_t a, int64_t I, int64_t F) {
    uint32_t ph = N_PHASE(a);
    if (ph != N_INT && ph != N_FRAC && ph != N_EXP_DIGITS) return 0;
    if (!s->bounded) return 1;
    i128 v = s->integer ? (i128)I : (i128)I * GR_SCALE + (i128)F * pow10_i(NUM_DIGITS - (int)N_NFRAC(a));
    if (N_NEG(a)) v = -v;
    return v >= s->lo && v <= s->hi;
}

/* One byte of a number: 1 and the new state, or 0. */
int cart_gr_number_step(const num_spec *s, uint32_t a, int64_t I, int64_t F, uint8_t c, uint32_t *na,
                       int64_t *nI, int64_t *nF) {
    uint32_t neg = N_NEG(a), ph = N_PHASE(a), ni = N_NINT(a), nf = N_NFRAC(a), ne = N_NEXP(a),
             zero = N_ZERO(a);
    int digit = c >= '0' && c <= '9';
    *nI = I;
    *nF = F;
    switch (ph) {
    case N_START:
        if (c == '-') {
            *na = N_PACK(1, N_MINUS, 0, 0, 0, 0);
            break;
        }
        /* fall through */
    case N_MINUS:
        if (!digit) return 0;
        *nI = c - '0';
        *na = N_PACK(neg, N_INT, 1, 0, 0, c == '0');
        break;
    case N_INT:
        if (digit) {
            if (zero || ni >= NUM_DIGITS) return 0;
            *nI = I * 10 + (c - '0');
            *na = N_PACK(neg, N_INT, ni + 1, 0, 0, 0);
        } else if (c == '.' && !s->integer) {
            *na = N_PACK(neg, N_DOT, ni, 0, 0, zero);
        } else if ((c == 'e' || c == 'E') && !s->bounded && !s->integer) {
            *na = N_PACK(neg, N_EXP, ni, 0, 0, zero);
        } else {
            return 0;
        }
        break;
    case N_DOT:
    case N_FRAC:
        if (digit) {
            if (nf >= NUM_DIGITS) return 0;
            *nF = F * 10 + (c - '0');
            *na = N_PACK(neg, N_FRAC, ni, nf + 1, 0, zero);
        } else if (ph == N_FRAC && (c == 'e' || c == 'E') && !s->bounded) {
            *na = N_PACK(neg, N_EXP, ni, nf, 0, zero);
        } else {
            return 0;
        }
        break;
    case N_EXP:
        if (c == '+' || c == '-') {
            *na = N_PACK(neg, N_EXP_SIGN, ni, nf, 0, zero);
            break;
        }
        /* fall through */
    case N_EXP_SIGN:
        if (!digit) return 0;
        *na = N_PACK(neg, N_EXP_DIGITS, ni, nf, 1, zero);
        break;
    case N_EXP_DIGITS:
        if (!digit || ne >= 2) return 0;
        *na = N_PACK(neg, N_EXP_DIGITS, ni, nf, ne + 1, zero);
        break;
    default:
        return 0;
    }
    return number_feasible(s, *na, *nI, *nF);
}

/* Whether some byte can continue the number (within its bounds). */
int cart_gr_number_open(const num_spec *s, uint32_t a, int64_t I, int64_t F) {
    static const char next[] = "0123456789.eE-+";
    for (const char *c = next; *c; c++) {
        uint32_t na;
        int64_t nI, nF;
        if (cart_gr_number_step(s, a, I, F, (uint8_t)*c, &na, &nI, &nF)) return 1;
    }
    return 0;
}

/* ---- strings ------------------------------------------------------------ */

/* UTF-8 decoding state: bits 0-1 continuation bytes still expected, bits
 * 2-4 the allowed range of the next one. 0 is a character boundary. */
enum { U_ANY, U_A0_BF, U_80_9F, U_90_BF, U_80_8F };

/* One byte of UTF-8 from state *st: 1 and the new state (*started = 1 when
 * the byte begins a character), or 0 when the byte is ill-formed here. */
int cart_gr_utf8_step(uint32_t *st, uint8_t c, int *started) {
    uint32_t need = *st & 3u, range = *st >> 2;
    *started = 0;
    if (need) {
        static const uint8_t lo[] = {0x80, 0xA0, 0x80, 0x90, 0x80}, hi[] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
        if (c < lo[range] || c > hi[range]) return 0;
        *st = need - 1;
        return 1;
    }
    *started = 1;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) *st = 1;
    else if (c == 0xE0) *st = 2 | U_A0_BF << 2;
    else if (c == 0xED) *st = 2 | U_80_9F << 2;
    else if (c >= 0xE1 && c <= 0xEF) *st = 2;
    else if (c == 0xF0) *st = 3 | U_90_BF << 2;
    else if (c == 0xF4) *st = 3 | U_80_8F << 2;
    else if (c >= 0xF1 && c <= 0xF3) *st = 3;
    else return 0;
    return 1;
}


int cart_gr_is_hex(uint8_t c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* One byte of a JSON string: STR_MORE with the new (a, b), STR_CLOSED at
 * the closing quote, or STR_DEAD. */
int cart_gr_string_step(const str_spec *s, uint32_t a, uint32_t b, uint8_t c, uint32_t *na, uint32_t *nb) {
    *na = a;
    if (S_PHASE(b) == 0) {
        if (c != '"') return STR_DEAD;
        *nb = S_BOUNDARY;
        return STR_MORE;
    }
    uint32_t esc = S_ESC(b);
    if (esc == 1) {
        if (c == 'u') {
            *nb = S_PACK(2, 0, 0, 1);
            return STR_MORE;
        }
        if (!strchr("\"\\/bfnrt", c) || c == 0) return STR_DEAD;
        *nb = S_BOUNDARY;
        return STR_MORE;
    }
    if (esc >= 2) {
        if (!cart_gr_is_hex(c)) return STR_DEAD;
        uint32_t dhi = S_DHI(b);
        if (esc == 2) dhi = c == 'd' || c == 'D';
        else if (esc == 3 && dhi && c > '7') return STR_DEAD; /* D800-DFFF: surrogates */
        *nb = esc == 5 ? S_BOUNDARY : S_PACK(esc + 1, dhi, 0, 1);
        return STR_MORE;
    }
    uint32_t u = S_UTF(b);
    if (u == 0) {
        if (c == '"') {
            if (a < s->min) return STR_DEAD;
            return STR_CLOSED;
        }
        if (c < 0x20) return STR_DEAD;
        if (a >= s->max) return STR_DEAD;
        if (c == '\\') {
            *na = a + 1;
            *nb = S_PACK(1, 0, 0, 1);
            return STR_MORE;
        }
    }
    int started;
    if (!cart_gr_utf8_step(&u, c, &started)) return STR_DEAD;
    *na = a + (uint32_t)started;
    *nb = S_PACK(0, 0, u, 1);
    return STR_MORE;
}
