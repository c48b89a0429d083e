// layernorm.cu — mirrors kernels::layernorm_forward / layernorm_backward. One warp per row.

// out[N,C] = (inp − mean)·rstd·w + b; mean[N], rstd[N] kept for backward (fp32).
extern "C" __global__ void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp,
                                             const floatX* w, const floatX* b, int n_rows, int c) {
    int row = blockIdx.x * (blockDim.x / EXA_WARP) + threadIdx.x / EXA_WARP;
    int lane = threadIdx.x % EXA_WARP;
    if (row >= n_rows) return;
    const floatX* x = inp + (long)row * c;
    float s = 0.0f;
    for (int j = lane; j < c; j += EXA_WARP) s += ldx(x[j]);
    float mu = warp_sum(s) / c;
    float v = 0.0f;
    for (int j = lane; j < c; j += EXA_WARP) {
        float d = ldx(x[j]) - mu;
        v += d * d;
    }
    float rs = rsqrtf(warp_sum(v) / c + 1e-5f);
    floatX* o = out + (long)row * c;
    for (int j = lane; j < c; j += EXA_WARP) o[j] = stx((ldx(x[j]) - mu) * rs * ldx(w[j]) + ldx(b[j]));
    if (lane == 0) {
        mean[row] = mu;
        rstd[row] = rs;
    }
}

// dinp += ∂L/∂inp per row. Warp g (over the whole grid) takes rows [g·R, (g+1)·R) in order and
// writes its partial Σ dout·norm and Σ dout per channel to partial[g, 2C]; they are summed in
// warp order by layernorm_backward_params: no atomics, deterministic at any launch shape.
extern "C" __global__ void layernorm_backward(floatX* dinp, float* partial, const floatX* dout, const floatX* inp,
                                              const floatX* w, const float* mean, const float* rstd, int n_rows,
                                              int rows_per_warp, int c) {
    int g = blockIdx.x * (blockDim.x / EXA_WARP) + threadIdx.x / EXA_WARP;
    int lane = threadIdx.x % EXA_WARP;
    int lo = g * rows_per_warp;
    if (lo >= n_rows) return;
    float* acc = partial + (long)g * 2 * c;
    for (int j = lane; j < 2 * c; j += EXA_WARP) acc[j] = 0.0f;
    int hi = min(lo + rows_per_warp, n_rows);
    for (int row = lo; row < hi; row++) {
        const floatX* x = inp + (long)row * c;
        const floatX* d = dout + (long)row * c;
        float mu = mean[row], rs = rstd[row];
        float dm = 0.0f, dnm = 0.0f;
        for (int j = lane; j < c; j += EXA_WARP) {
            float norm = (ldx(x[j]) - mu) * rs, dn = ldx(d[j]) * ldx(w[j]);
            dm += dn;
            dnm += dn * norm;
        }
        dm = warp_sum(dm) / c;
        dnm = warp_sum(dnm) / c;
        floatX* di = dinp + (long)row * c;
        for (int j = lane; j < c; j += EXA_WARP) {
            float norm = (ldx(x[j]) - mu) * rs, dy = ldx(d[j]), dn = dy * ldx(w[j]);
            acc[j] += dy * norm;  // each lane owns its channels: no race
            acc[c + j] += dy;
            di[j] = stx(ldx(di[j]) + (dn - dm - norm * dnm) * rs);
        }
    }
}

// dw[j] += Σ_g partial[g, j]; db[j] += Σ_g partial[g, C + j], warps in order.
extern "C" __global__ void layernorm_backward_params(float* dw, float* db, const float* partial, int groups, int c) {
    EXA_FOR(j, c) {
        float sw = 0.0f, sb = 0.0f;
        for (int k = 0; k < groups; k++) {
            sw += partial[(long)k * 2 * c + j];
            sb += partial[(long)k * 2 * c + c + j];
        }
        dw[j] += sw;
        db[j] += sb;
    }
}
