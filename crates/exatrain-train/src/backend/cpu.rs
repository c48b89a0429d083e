//! The CPU backend: buffers are `Vec`s, views are slices, and every method is the kernel of
//! [`crate::kernels`] with the same name.

use std::marker::PhantomData;
use std::ops::Range;

use super::Backend;
use crate::flash::{self, KeyValues};
use crate::kernels as k;
use crate::model::parts;
use crate::optim::AdamWConfig;
use crate::Real;

/// The host as a device, in `R` (f32 to train, f64 to check gradients).
pub struct Cpu<R>(PhantomData<R>);

impl<R> Default for Cpu<R> {
    fn default() -> Self {
        Cpu(PhantomData)
    }
}

impl<R> Clone for Cpu<R> {
    fn clone(&self) -> Self {
        Cpu(PhantomData)
    }
}

impl<R: Real> Backend for Cpu<R> {
    type R = R;
    type Buf = Vec<R>;
    type Ref<'a> = &'a [R];
    type Mut<'a> = &'a mut [R];

    fn upload(&self, host: Vec<R>) -> Vec<R> {
        host
    }
    fn download(&self, buf: &Vec<R>) -> Vec<R> {
        buf.clone()
    }
    fn len(buf: &Vec<R>) -> usize {
        buf.len()
    }
    fn view<'a>(buf: &'a Vec<R>, r: &Range<usize>) -> &'a [R] {
        &buf[r.clone()]
    }
    fn parts<'a, const K: usize>(buf: &'a mut Vec<R>, ranges: [&Range<usize>; K]) -> [&'a mut [R]; K] {
        parts(buf, ranges)
    }
    fn read<'a>(m: &'a &mut [R]) -> &'a [R] {
        m
    }
    fn reborrow<'a>(m: &'a mut &mut [R]) -> &'a mut [R] {
        m
    }

    fn sub<'a>(r: &'a [R], range: &Range<usize>) -> &'a [R]
    where
        Self: 'a,
    {
        &r[range.clone()]
    }
    fn sub_mut<'a>(m: &'a mut &mut [R], range: &Range<usize>) -> &'a mut [R] {
        &mut m[range.clone()]
    }

    fn zero(&self, buf: &mut Vec<R>, r: &Range<usize>) {
        buf[r.clone()].iter_mut().for_each(|x| *x = R::zero());
    }
    fn copy(&self, dst: &mut [R], src: &[R]) {
        dst.copy_from_slice(src);
    }
    fn with_host<T>(&self, r: &[R], f: impl FnOnce(&[R]) -> T) -> T {
        f(r)
    }
    fn with_host_mut<T>(&self, m: &mut [R], f: impl FnOnce(&mut [R]) -> T) -> T {
        f(m)
    }

    fn sum_squares(&self, x: &[R]) -> f64 {
        x.iter().map(|g| g.to_f64().unwrap_or(0.0).powi(2)).sum()
    }
    fn scale(&self, x: &mut [R], s: R) {
        x.iter_mut().for_each(|g| *g = *g * s);
    }
    fn adamw(
        &self,
        params: &mut [R],
        grads: &[R],
        m: &mut [R],
        v: &mut [R],
        c: &AdamWConfig,
        lr: f64,
        wd: f64,
        step: u64,
    ) {
        crate::optim::adamw_update(params, grads, m, v, c, lr, wd, step)
    }

    fn encoder_forward(
        &self,
        out: &mut [R],
        tokens: &[u32],
        wte: &[R],
        lo: usize,
        wpe: Option<&[R]>,
        t: usize,
        c: usize,
    ) {
        k::encoder_forward(out, tokens, wte, lo, wpe, t, c)
    }
    fn encoder_backward(
        &self,
        dwte: &mut [R],
        lo: usize,
        dwpe: Option<&mut [R]>,
        dout: &[R],
        tokens: &[u32],
        t: usize,
        c: usize,
    ) {
        k::encoder_backward(dwte, lo, dwpe, dout, tokens, t, c)
    }
    fn layernorm_forward(&self, out: &mut [R], mean: &mut [R], rstd: &mut [R], inp: &[R], w: &[R], b: &[R], c: usize) {
        k::layernorm_forward(out, mean, rstd, inp, w, b, c)
    }
    fn layernorm_backward(
        &self,
        dinp: &mut [R],
        dw: &mut [R],
        db: &mut [R],
        dout: &[R],
        inp: &[R],
        w: &[R],
        mean: &[R],
        rstd: &[R],
        c: usize,
    ) {
        k::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, c)
    }
    fn matmul_forward(&self, out: &mut [R], inp: &[R], w: &[R], bias: Option<&[R]>, c: usize, oc: usize) {
        k::matmul_forward(out, inp, w, bias, c, oc)
    }
    fn matmul_backward(
        &self,
        dinp: &mut [R],
        dw: &mut [R],
        dbias: Option<&mut [R]>,
        dout: &[R],
        inp: &[R],
        w: &[R],
        c: usize,
        oc: usize,
    ) {
        k::matmul_backward(dinp, dw, dbias, dout, inp, w, c, oc)
    }
    fn attention_forward(&self, out: &mut [R], att: &mut [R], qkv: &[R], b: usize, t: usize, c: usize, nh: usize) {
        k::attention_forward(out, att, qkv, b, t, c, nh)
    }
    fn attention_backward(
        &self,
        dqkv: &mut [R],
        dout: &[R],
        qkv: &[R],
        att: &[R],
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    ) {
        k::attention_backward(dqkv, dout, qkv, att, b, t, c, nh)
    }
    fn flash_attention_forward(
        &self,
        out: &mut [R],
        lse: &mut [R],
        qkv: &[R],
        kv: Option<&[R]>,
        at: &KeyValues,
        b: usize,
        c: usize,
        nh: usize,
    ) {
        flash::flash_attention_forward(out, lse, qkv, kv.unwrap_or(qkv), at, b, c, nh)
    }
    fn flash_attention_backward(
        &self,
        dqkv: &mut [R],
        dkv: Option<&mut [R]>,
        dout: &[R],
        out: &[R],
        lse: &[R],
        qkv: &[R],
        kv: Option<&[R]>,
        at: &KeyValues,
        b: usize,
        c: usize,
        nh: usize,
    ) {
        flash::flash_attention_backward(dqkv, dkv, dout, out, lse, qkv, kv.unwrap_or(qkv), at, b, c, nh)
    }
    fn gelu_forward(&self, out: &mut [R], inp: &[R]) {
        k::gelu_forward(out, inp)
    }
    fn gelu_backward(&self, dinp: &mut [R], inp: &[R], dout: &[R]) {
        k::gelu_backward(dinp, inp, dout)
    }
    fn residual_forward(&self, out: &mut [R], a: &[R], b: &[R]) {
        k::residual_forward(out, a, b)
    }
    fn residual_backward(&self, da: &mut [R], db: &mut [R], dout: &[R]) {
        k::residual_backward(da, db, dout)
    }
    fn crossentropy_max(&self, maxes: &mut [R], logits: &[R], valid: usize, vl: usize) {
        k::crossentropy_max(maxes, logits, valid, vl)
    }
    fn crossentropy_exp(
        &self,
        probs: &mut [R],
        stats: &mut [R],
        logits: &[R],
        maxes: &[R],
        targets: &[u32],
        lo: usize,
        valid: usize,
        vl: usize,
    ) {
        k::crossentropy_exp(probs, stats, logits, maxes, targets, lo, valid, vl)
    }
    fn crossentropy_normalize(&self, probs: &mut [R], losses: &mut [R], stats: &[R], vl: usize) {
        k::crossentropy_normalize(probs, losses, stats, vl)
    }
    fn crossentropy_backward(
        &self,
        dlogits: &mut [R],
        probs: &[R],
        targets: &[u32],
        lo: usize,
        dloss: R,
        valid: usize,
        vl: usize,
    ) {
        k::crossentropy_backward(dlogits, probs, targets, lo, dloss, valid, vl)
    }
}
