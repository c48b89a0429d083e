// encoder.cu — mirrors kernels::encoder_forward / encoder_backward.
// N = B·T rows of C channels; wte holds vocabulary rows lo..lo+rows (a vocabulary-parallel
// shard: tokens outside it contribute 0); wpe may be null (added by one tensor-parallel rank).

// out[N,C] = wte[tokens[n] − lo] + wpe[n % T]
extern "C" __global__ void encoder_forward(floatX* out, const int* tokens, const floatX* wte, int lo, int rows,
                                           const floatX* wpe, int n_rows, int t, int c) {
    EXA_FOR(i, (long)n_rows * c) {
        int n = (int)(i / c), j = (int)(i % c);
        int tok = tokens[n] - lo;
        float x = (tok >= 0 && tok < rows) ? ldx(wte[(long)tok * c + j]) : 0.0f;
        if (wpe) x += ldx(wpe[(long)(n % t) * c + j]);
        out[i] = stx(x);
    }
}

// dwte[u] += Σ dout[n] over the positions n of token u, in increasing n: the host groups the
// positions by token (`uniq[k]` the k-th distinct token in the shard, its positions
// `pos[off[k]..off[k+1]]` ascending), one block per token, so no two threads add into one row
// and the sum order is the CPU's: deterministic without atomics.
extern "C" __global__ void encoder_backward_wte(float* dwte, const floatX* dout, const int* uniq, const int* off,
                                                const int* pos, int lo, int c) {
    int k = blockIdx.x;
    long row = (long)(uniq[k] - lo) * c;
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
        float acc = dwte[row + j];
        for (int p = off[k]; p < off[k + 1]; p++) acc += ldx(dout[(long)pos[p] * c + j]);
        dwte[row + j] = acc;
    }
}

// dwpe[t', j] += Σ_b dout[b·T + t', j], in increasing b.
extern "C" __global__ void encoder_backward_wpe(float* dwpe, const floatX* dout, int b, int t, int c) {
    EXA_FOR(i, (long)t * c) {
        float acc = dwpe[i];
        for (int bi = 0; bi < b; bi++) acc += ldx(dout[(long)bi * t * c + i]);
        dwpe[i] = acc;
    }
}
