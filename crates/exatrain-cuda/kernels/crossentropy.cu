// crossentropy.cu — mirrors kernels::crossentropy_{max,exp,normalize,backward}: Megatron's
// vocabulary-parallel cross-entropy in three steps with a reduction over the tensor-parallel
// group between each. This rank holds logits[N, Vl] for vocabulary ids lo..lo+Vl, of which the
// first `valid` are real. One block per row; statistics and losses in fp32.

// Step 1: maxes[n] = the row max over the valid columns.
extern "C" __global__ void crossentropy_max(float* maxes, const floatX* logits, int valid, int vl) {
    __shared__ float sh[EXA_WARP];
    long n = blockIdx.x;
    const floatX* row = logits + n * vl;
    float mx = EXA_NEG_INF;
    for (int j = threadIdx.x; j < valid; j += blockDim.x) mx = fmaxf(mx, ldx(row[j]));
    mx = block_max(mx, sh);
    if (threadIdx.x == 0) maxes[n] = mx;
}

// Step 2, given the global max: probs = exp(logit − max) (padding 0); stats[n] = Σ_j probs and
// stats[N + n] = logit[target] − max if the target is in this shard, else 0.
extern "C" __global__ void crossentropy_exp(floatX* probs, float* stats, const floatX* logits, const float* maxes,
                                            const int* targets, int lo, int valid, int vl, int n_rows) {
    __shared__ float sh[EXA_WARP];
    long n = blockIdx.x;
    const floatX* row = logits + n * vl;
    floatX* p = probs + n * vl;
    float mx = maxes[n], s = 0.0f;
    for (int j = threadIdx.x; j < vl; j += blockDim.x) {
        float e = j < valid ? expf(ldx(row[j]) - mx) : 0.0f;
        p[j] = stx(e);
        s += e;
    }
    s = block_sum(s, sh);
    if (threadIdx.x == 0) {
        stats[n] = s;
        int tg = targets[n] - lo;
        stats[n_rows + n] = (tg >= 0 && tg < valid) ? ldx(row[tg]) - mx : 0.0f;
    }
}

// Step 3, given the global stats: probs /= Σ; losses[n] = ln Σ − (logit[target] − max).
extern "C" __global__ void crossentropy_normalize(floatX* probs, float* losses, const float* stats, int vl,
                                                  int n_rows) {
    long n = blockIdx.x;
    float inv = 1.0f / stats[n];
    floatX* p = probs + n * vl;
    for (int j = threadIdx.x; j < vl; j += blockDim.x) p[j] = stx(ldx(p[j]) * inv);
    if (threadIdx.x == 0) losses[n] = logf(stats[n]) - stats[n_rows + n];
}

// dlogits += dloss·(probs − onehot(target)) over the valid columns.
extern "C" __global__ void crossentropy_backward(floatX* dlogits, const floatX* probs, const int* targets, int lo,
                                                 float dloss, int valid, int vl) {
    long n = blockIdx.x;
    int tg = targets[n] - lo;
    floatX* d = dlogits + n * vl;
    const floatX* p = probs + n * vl;
    for (int j = threadIdx.x; j < valid; j += blockDim.x) {
        float ind = j == tg ? 1.0f : 0.0f;
        d[j] = stx(ldx(d[j]) + (ldx(p[j]) - ind) * dloss);
    }
}

// The mean loss: out[0] = Σ_n losses[n] / N, summed in row order by one thread (N is small
// next to the logits; deterministic).
extern "C" __global__ void mean_loss(float* out, const float* losses, int n_rows) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    float s = 0.0f;
    for (int n = 0; n < n_rows; n++) s += losses[n];
    out[0] = s / n_rows;
}
