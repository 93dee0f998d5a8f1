// Butterflies and their lazy bounds (caramel.backends.cuda.ntt). Needs LAZY: 1 when every prime of the ring is
// below 2^28 (ring_lazy), so that 16q <= 2^32; else the butterflies reduce every stage.

// The constants of prime pi that the butterflies read from the prime table pt: q, 2q, 4q and 8q (4q serves the lazy
// inverse butterflies alone, 8q both lazy directions).
#define PRIME_CONSTANTS(pt, pi) \
    const u32 q = prime_q(pt, pi), two_q = __ldg(pt + 8 * (pi) + 1), four_q = __ldg(pt + 8 * (pi) + 7), \
              eight_q = __ldg(pt + 8 * (pi) + 6); \
    (void)four_q; (void)eight_q

// x - c if x >= c, else x (0 < c < 2^32): min(x, x - c) as unsigned (x - c wraps above x when x < c);
// two instructions (add, min) where the compare-and-select form takes three.
__device__ __forceinline__ u32 csub(u32 x, u32 c) { return min(x, x - c); }

// Forward Cooley-Tukey butterfly, Harvey lazy (not LAZY): x, y in [0, 4q) -> [0, 4q); t = y * w in [0, 2q).
__device__ __forceinline__ void ct_bfly(u32& x, u32& y, u32 t, u32 two_q) {
    x = csub(x, two_q);
    y = x + two_q - t;
    x = x + t;
}

// LAZY forward butterfly (q < 2^28, so 16q <= 2^32): values of a pass stay below 16q. The first
// stage of a pass (RED) brings x from [0, 16q) to [0, 8q); each stage adds at most 2q (t < 2q):
// after the 4 stages of a pass, x, y < 8q + 4 * 2q = 16q. Inputs < 16q, outputs < 16q.
template <bool RED>
__device__ __forceinline__ void ct_bfly_lazy(u32& x, u32& y, u32 t, u32 two_q, u32 eight_q) {
    if (RED) x = csub(x, eight_q);  // 8q from the prime table: one fused add-and-min (4 two_q took a multiply-add)
    y = x + two_q - t;
    x = x + t;
}

// Inverse (Gentleman-Sande) butterfly at stage dd of a pass (RADIX_LOG or fewer stages; the pair k, k + 2^dd):
// x <- x + y and y <- x - y + c, the difference that the caller multiplies by the twiddle (a Shoup product: below 2q).
// Not LAZY: values below 2q, the sum reduced every stage (c = 2q). LAZY (q < 2^28, so 16q < 2^32): the bound of
// every value, in multiples of q, is known at compile time (inv_bound; k and dd are constants once unrolled): a pass's
// inputs are below INV_IN q; after stage j, position k holds a Shoup product (below 2q) if bit j of k is set, else the
// sum of two values with the stage's input bound b (below 2b q). Before a stage whose sum could pass 16q, its inputs
// are brought below 8q (a conditional subtraction of 8q each); c is the inputs' bound times q, so that the difference
// is positive and below 16q. gs_pass_end brings a pass's outputs below INV_IN q for the next pass (the INTT's last
// pass skips it: the product by N^-1 takes any input below 2^32). A pass of 4 stages and 16 values then reduces 12
// times (2 before its third stage, 6 at its end) instead of 32.
#define INV_IN 4
// That bound before stage dd (< 5): from the last stage j < dd whose product position k holds (the highest set bit of
// k's low dd bits), 2 doubled at each later stage, or with none INV_IN doubled at each stage; at most 16 (the inputs
// of a stage with bound 16 are brought to 8 first). A closed form, so that the compiler folds it.
__host__ __device__ constexpr int inv_bound(int k, int dd) {
    const int low = k & ((1 << dd) - 1);
    const int last = low >= 8 ? 3 : low >= 4 ? 2 : low >= 2 ? 1 : 0;  // the highest set bit of low (low > 0)
    const int b = low == 0 ? INV_IN << dd : 2 << (dd - 1 - last);
    return b > 16 ? 16 : b;
}
__device__ __forceinline__ void gs_sum_diff(u32& x, u32& y, int k, int dd, u32 two_q, u32 four_q, u32 eight_q) {
    if (!LAZY) {
        const u32 sum = csub(x + y, two_q);
        y = x + two_q - y;
        x = sum;
        return;
    }
    const int b = inv_bound(k, dd);
    if (b > 8) {
        x = csub(x, eight_q);
        y = csub(y, eight_q);
    }
    const u32 c = b <= 2 ? two_q : b == 4 ? four_q : eight_q;
    const u32 sum = x + y;
    y = x + c - y;
    x = sum;
}
__device__ __forceinline__ u32 gs_pass_end(u32 x, int k, int stages, u32 four_q, u32 eight_q) {
    if (LAZY && inv_bound(k, stages) > 8) x = csub(x, eight_q);
    if (LAZY && inv_bound(k, stages) > 4) x = csub(x, four_q);
    return x;
}

// Forward output -> canonical. Not LAZY: x in [0, 4q), two conditional subtractions. LAZY: x in [0, 16q), a 32-bit
// Barrett step with m32 = floor(2^32 / q) (prime_m32): k = floor(x m32 / 2^32) is
// floor(x / q) or one less (x < 2^32), so x - k q lies in [0, 2q); one conditional subtraction. Three instructions
// where the four subtractions (8q, 4q, 2q, q) took about six.
__device__ __forceinline__ u32 fwd_final(u32 x, u32 q, u32 two_q, u32 m32) {
    if (LAZY) {
        u32 r;  // x + k (-q) as one multiply-add (written plainly, the compiler negates k first: an extra instruction)
        asm("mad.lo.u32 %0, %1, %2, %3;" : "=r"(r) : "r"(__umulhi(x, m32)), "r"(0u - q), "r"(x));
        return csub(r, q);
    }
    return csub(csub(x, two_q), q);
}
