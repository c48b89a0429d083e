// attention.cu — the causal softmax of kernels::attention_forward / attention_backward. The two
// products around it (scale·Q·Kᵀ into att, att·V into the output; and their backward) are
// strided batched GEMMs in the GEMM library, as on the CPU. att is [NH, Tq, Tk] (per sequence,
// or [B, NH, T, T] whole); one warp per row: row r of a head is the query at global position
// i = r mod Tq + offset (offset: the position of the first query; 0 in self-attention, a
// context-parallel chunk's start under context parallelism, whose keys are the sequence's in
// global order): columns j ≤ i are the softmax, j > i are 0.

// In place: att[row] = softmax(att[row, 0..=i]) (the scale is the GEMM's alpha), 0 past i.
extern "C" __global__ void softmax_causal_forward(floatX* att, long rows, int tq, int tk, int offset) {
    long row = (long)blockIdx.x * (blockDim.x / EXA_WARP) + threadIdx.x / EXA_WARP;
    int lane = threadIdx.x % EXA_WARP;
    if (row >= rows) return;
    int i = (int)(row % tq) + offset;
    floatX* a = att + row * tk;
    float mx = EXA_NEG_INF;
    for (int j = lane; j <= i; j += EXA_WARP) mx = fmaxf(mx, ldx(a[j]));
    mx = warp_max(mx);
    float s = 0.0f;
    for (int j = lane; j <= i; j += EXA_WARP) s += expf(ldx(a[j]) - mx);
    float inv = 1.0f / warp_sum(s);
    for (int j = lane; j < tk; j += EXA_WARP) a[j] = stx(j <= i ? expf(ldx(a[j]) - mx) * inv : 0.0f);
}

// In place: datt[row] = att ⊙ (datt − Σ_j att_j·datt_j) over j ≤ i (the gradient at the scaled
// scores; the GEMMs that follow apply the scale), 0 past i.
extern "C" __global__ void softmax_causal_backward(floatX* datt, const floatX* att, long rows, int tq, int tk,
                                                   int offset) {
    long row = (long)blockIdx.x * (blockDim.x / EXA_WARP) + threadIdx.x / EXA_WARP;
    int lane = threadIdx.x % EXA_WARP;
    if (row >= rows) return;
    int i = (int)(row % tq) + offset;
    floatX* d = datt + row * tk;
    const floatX* a = att + row * tk;
    float s = 0.0f;
    for (int j = lane; j <= i; j += EXA_WARP) s += ldx(a[j]) * ldx(d[j]);
    s = warp_sum(s);
    for (int j = lane; j < tk; j += EXA_WARP) d[j] = stx(j <= i ? ldx(a[j]) * (ldx(d[j]) - s) : 0.0f);
}
