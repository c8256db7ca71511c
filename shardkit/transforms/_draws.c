/* RandomResizedCropFlip's draws from a sample's seed, in C: the same numbers Python computes for
 * RandomResizedCropFlip.sample_params(height, width, random.Random(seed)), bit for bit. A worker
 * draws for every image it reads; in Python, seeding the Mersenne Twister, the draws and the
 * crop arithmetic cost it about as much as reading the sample (docs/performance.md).
 *
 * random_resized_crop_flip(height, width, seed, scale_lo, scale_hi, ratio_lo, ratio_hi, flip_p)
 *     -> (top, left, h, w, flip)
 *   seed: an int in [0, 2**64). OverflowError for another seed, and where a box side would be
 *   infinite, nan or 2**62 or more (absurd scales or ratios): the caller then draws in Python.
 *
 * What it reproduces (CPython's Modules/_randommodule.c and Lib/random.py, unchanged since 3.2
 * in these parts):
 * - random.Random(seed) with an int seed: init_by_array over the seed's 32-bit words, least
 *   significant first (one word for a seed below 2**32), after init_genrand(19650218);
 * - random(): two 32-bit outputs a, b -> ((a >> 5) * 2**26 + (b >> 6)) / 2**53;
 * - uniform(a, b) = a + (b - a) * random();
 * - randint(0, n - 1) = _randbelow_with_getrandbits(n): k = n.bit_length(), r = output >> (32 - k)
 *   until r < n;
 * - round(x) of a float: to the nearest integer, halves to even;
 * - math.log, math.exp, math.sqrt: the C library's, as Python's math module calls them.
 * The twist that refreshes the generator's 624 words runs word by word as they are needed (the
 * words come out the same): a crop needs a few dozen of them, not 624.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define N 624
#define M 397
#define MATRIX_A 0x9908b0dfU
#define UPPER_MASK 0x80000000U
#define LOWER_MASK 0x7fffffffU

static uint32_t genrand_start[N]; /* init_genrand(19650218): where every init_by_array begins */

typedef struct {
    uint32_t mt[N];
    int index; /* the next word to hand out */
    int ready; /* words of the current block already twisted */
} Twister;

static void seed_by_array(Twister *t, const uint32_t *key, int key_length) {
    /* CPython's init_by_array, with the word just written carried in a register (the compiler
       otherwise reloads it from memory in the second loop: a store-to-load forward on the chain of
       1,247 dependent steps) and key[j] + j added off that chain */
    uint32_t *mt = t->mt;
    memcpy(mt, genrand_start, sizeof genrand_start);
    /* key_length is 1 or 2: the key is a 64-bit seed (random_resized_crop_flip below) */
    uint32_t add[2] = {key[0], key_length > 1 ? key[1] + 1U : 0U};
    uint32_t prev = mt[0];
    int i = 1, j = 0;
    for (int k = N > key_length ? N : key_length; k; k--) {
        prev = (mt[i] ^ ((prev ^ (prev >> 30)) * 1664525U)) + add[j];
        mt[i] = prev;
        i++;
        j++;
        if (i >= N) {
            mt[0] = prev;
            i = 1;
        }
        if (j >= key_length)
            j = 0;
    }
    for (int k = N - 1; k; k--) {
        prev = (mt[i] ^ ((prev ^ (prev >> 30)) * 1566083941U)) - (uint32_t)i;
        mt[i] = prev;
        i++;
        if (i >= N) {
            mt[0] = prev;
            i = 1;
        }
    }
    mt[0] = 0x80000000U;
    t->index = N; /* as CPython leaves it: the first output twists */
    t->ready = N;
}

/* Word kk of the next block, twisted in place: the step CPython's whole-block loop takes for kk. */
static void twist_one(uint32_t *mt, int kk) {
    static const uint32_t mag01[2] = {0x0U, MATRIX_A};
    uint32_t y;
    if (kk < N - M) {
        y = (mt[kk] & UPPER_MASK) | (mt[kk + 1] & LOWER_MASK);
        mt[kk] = mt[kk + M] ^ (y >> 1) ^ mag01[y & 0x1U];
    } else if (kk < N - 1) {
        y = (mt[kk] & UPPER_MASK) | (mt[kk + 1] & LOWER_MASK);
        mt[kk] = mt[kk + (M - N)] ^ (y >> 1) ^ mag01[y & 0x1U];
    } else {
        y = (mt[N - 1] & UPPER_MASK) | (mt[0] & LOWER_MASK);
        mt[N - 1] = mt[M - 1] ^ (y >> 1) ^ mag01[y & 0x1U];
    }
}

static uint32_t next_word(Twister *t) {
    if (t->index >= N) { /* a new block: its words are twisted as they are reached */
        t->index = 0;
        t->ready = 0;
    }
    /* the loop twists words in order, each from words after it not yet twisted or before it
       already twisted, so twisting up to the word handed out is exact */
    while (t->ready <= t->index)
        twist_one(t->mt, t->ready++);
    uint32_t y = t->mt[t->index++];
    y ^= (y >> 11);
    y ^= (y << 7) & 0x9d2c5680U;
    y ^= (y << 15) & 0xefc60000U;
    y ^= (y >> 18);
    return y;
}

static double random_double(Twister *t) {
    uint32_t a = next_word(t) >> 5, b = next_word(t) >> 6;
    return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}

static double uniform(Twister *t, double a, double b) { return a + (b - a) * random_double(t); }

/* A uniform int in [0, n), n >= 1, as _randbelow_with_getrandbits draws it (n < 2**32). */
static int64_t below(Twister *t, uint32_t n) {
    int k = 0;
    for (uint32_t v = n; v; v >>= 1)
        k++;
    uint32_t r = next_word(t) >> (32 - k);
    while (r >= n)
        r = next_word(t) >> (32 - k);
    return r;
}

/* Python's round() of a float to an int: the nearest, halves to even. Where that int would not
 * fit (inf, nan, or 2**62 and beyond: only absurd scales or ratios give such boxes), *out_of_range
 * is set and the caller leaves the whole draw to Python, which raises or computes as it does. */
static int64_t round_half_even(double x, int *out_of_range) {
    double rounded = round(x);
    if (fabs(x - rounded) == 0.5)
        rounded = 2.0 * round(x / 2.0);
    if (!(fabs(rounded) < 4611686018427387904.0)) { /* 2**62; also false for nan */
        *out_of_range = 1;
        return 0;
    }
    return (int64_t)rounded;
}

static int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

static PyObject *random_resized_crop_flip(PyObject *self, PyObject *args) {
    long long height, width;
    PyObject *seed_obj;
    double scale_lo, scale_hi, ratio_lo, ratio_hi, flip_p;
    if (!PyArg_ParseTuple(args, "LLOddddd", &height, &width, &seed_obj, &scale_lo, &scale_hi, &ratio_lo, &ratio_hi,
                          &flip_p))
        return NULL;
    if (height <= 0 || width <= 0 || height > UINT32_MAX - 1 || width > UINT32_MAX - 1) {
        PyErr_SetString(PyExc_ValueError, "height and width must be in [1, 2**32 - 1)");
        return NULL;
    }
    unsigned long long seed = PyLong_AsUnsignedLongLong(seed_obj); /* OverflowError below 0 or at 2**64 */
    if (seed == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    Twister t;
    seed_by_array(&t, key, seed >> 32 ? 2 : 1);

    double area = (double)height * (double)width; /* float(height * width): each side exact, one rounding */
    int out_of_range = 0;
    double log_lo = log(ratio_lo), log_hi = log(ratio_hi);
    int64_t top = -1, left = -1, h = 0, w = 0;
    for (int attempt = 0; attempt < 10; attempt++) {
        double target_area = area * uniform(&t, scale_lo, scale_hi);
        double aspect = exp(uniform(&t, log_lo, log_hi));
        w = round_half_even(sqrt(target_area * aspect), &out_of_range);
        h = round_half_even(sqrt(target_area / aspect), &out_of_range);
        if (0 < w && w <= width && 0 < h && h <= height) {
            top = below(&t, (uint32_t)(height - h + 1));
            left = below(&t, (uint32_t)(width - w + 1));
            break;
        }
    }
    if (top < 0) { /* a centre crop clamped to the ratio */
        double in_ratio = (double)width / (double)height;
        double lo = ratio_lo < ratio_hi ? ratio_lo : ratio_hi, hi = ratio_lo < ratio_hi ? ratio_hi : ratio_lo;
        if (in_ratio < lo) {
            w = width;
            h = round_half_even((double)width / lo, &out_of_range);
        } else if (in_ratio > hi) {
            h = height;
            w = round_half_even((double)height * hi, &out_of_range);
        } else {
            h = height;
            w = width;
        }
        top = floor_div(height - h, 2);
        left = floor_div(width - w, 2);
    }
    if (out_of_range) {
        PyErr_SetString(PyExc_OverflowError, "a box side out of range: drawn in Python");
        return NULL;
    }
    int flip = random_double(&t) < flip_p;
    return Py_BuildValue("(LLLLO)", (long long)top, (long long)left, (long long)h, (long long)w,
                         flip ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"random_resized_crop_flip", random_resized_crop_flip, METH_VARARGS,
     "random_resized_crop_flip(height, width, seed, scale_lo, scale_hi, ratio_lo, ratio_hi, flip_p) -> "
     "(top, left, h, w, flip) (see module)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_draws",
                                    "RandomResizedCropFlip's draws from a seed, as Python's random.Random draws them.",
                                    -1, methods};

PyMODINIT_FUNC PyInit__draws(void) {
    genrand_start[0] = 19650218U;
    for (int i = 1; i < N; i++)
        genrand_start[i] = 1812433253U * (genrand_start[i - 1] ^ (genrand_start[i - 1] >> 30)) + (uint32_t)i;
    return PyModule_Create(&module);
}
