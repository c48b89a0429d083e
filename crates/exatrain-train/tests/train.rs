//! The trainer end to end on small shapes: HF round trip against a PyTorch fixture, resume
//! bit-identical, corrupt checkpoints rejected, bad data rejected, NaN stops the run, and
//! validation loss falls below the unigram entropy.

use std::path::PathBuf;

use exatrain_spec::ModelFile;
use exatrain_train::checkpoint;
use exatrain_train::data;
use exatrain_train::hf;
use exatrain_train::model::Gpt;
use exatrain_train::train::{TrainConfig, Trainer};

const CORPUS: &str = include_str!("../../../data/corpus/devils-dictionary.txt");

/// A fresh folder, removed with everything in it when the test ends.
fn tmp(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("exatrain-train-{name}-"))
        .tempdir()
        .expect("a folder under the system's temp dir")
}

fn spec(vocab: u32, seq: u32) -> exatrain_spec::ModelSpec {
    ModelFile {
        name: Some("t".into()),
        layers: Some(2),
        hidden: Some(32),
        heads: Some(2),
        seq_len: Some(seq),
        vocab: Some(vocab),
        padded_vocab: Some(vocab),
        ..Default::default()
    }
    .resolve("t")
    .unwrap()
}

/// A small dataset from the first `bytes` of the bundled corpus.
fn dataset(dir: &std::path::Path, bytes: usize, vocab: u32) -> PathBuf {
    let src = dir.join("corpus.txt");
    let cut = CORPUS
        .char_indices()
        .take_while(|(i, _)| *i < bytes)
        .last()
        .map_or(0, |(i, _)| i);
    std::fs::write(&src, &CORPUS[..cut]).unwrap();
    let d = dir.join("data");
    data::prepare(&src, vocab, &d).unwrap();
    d
}

fn cfg(steps: u64) -> TrainConfig {
    TrainConfig {
        steps,
        micro_batch: 4,
        global_batch: 8,
        warmup: 2,
        eval_every: 0,
        ckpt_every: 0,
        eval_batches: 2,
        sample_tokens: 0,
        ..Default::default()
    }
}

#[test]
fn hf_export_gives_the_logits_transformers_computes() {
    let fixture: serde_json::Value = serde_json::from_str(include_str!("fixtures/hf_tiny.json")).unwrap();
    let (shape, params) = hf::fixture_model();
    let scratch = tmp("hf");
    let dir = scratch.path();
    hf::export(&shape, &params, None, dir).unwrap();
    // the very file transformers loaded when the fixture was made
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let sha = {
        use std::fmt::Write;
        let digest = sha256(&bytes);
        digest.iter().fold(String::new(), |mut s, b| {
            write!(s, "{b:02x}").unwrap();
            s
        })
    };
    assert_eq!(
        sha,
        fixture["safetensors_sha256"].as_str().unwrap(),
        "export changed: regenerate the fixture (scripts/hf_fixture.py)"
    );
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["n_layer"], 2);
    assert_eq!(config["activation_function"], "gelu_new");
    let mut m = Gpt::<f32>::new(shape, 0);
    m.params = params;
    let tokens = hf::fixture_tokens();
    m.forward(&tokens, &[0; 24], 2, 12).unwrap();
    let want: Vec<f64> = fixture["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(want.len(), 24 * 50);
    let mut worst: f64 = 0.0;
    for n in 0..24 {
        for v in 0..50 {
            let ours = m.logits()[n * shape.padded_vocab + v] as f64;
            worst = worst.max((ours - want[n * 50 + v]).abs());
        }
    }
    assert!(worst < 1e-4, "max |logit difference| {worst}");
}

/// SHA-256 (FIPS 180-4), for checking the fixture's file without another dependency.
fn sha256(data: &[u8]) -> [u8; 32] {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
        0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
        0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
        0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
        0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
        0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
        0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
    ];
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for chunk in msg.chunks(64) {
        let mut w = [0u32; 64];
        for i in 0..16 {
            w[i] = u32::from_be_bytes([chunk[4 * i], chunk[4 * i + 1], chunk[4 * i + 2], chunk[4 * i + 3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16].wrapping_add(s0).wrapping_add(w[i - 7]).wrapping_add(s1);
        }
        let mut v = h;
        for i in 0..64 {
            let s1 = v[4].rotate_right(6) ^ v[4].rotate_right(11) ^ v[4].rotate_right(25);
            let ch = (v[4] & v[5]) ^ (!v[4] & v[6]);
            let t1 = v[7]
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = v[0].rotate_right(2) ^ v[0].rotate_right(13) ^ v[0].rotate_right(22);
            let maj = (v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]);
            let t2 = s0.wrapping_add(maj);
            v = [
                t1.wrapping_add(t2),
                v[0],
                v[1],
                v[2],
                v[3].wrapping_add(t1),
                v[4],
                v[5],
                v[6],
            ];
        }
        for i in 0..8 {
            h[i] = h[i].wrapping_add(v[i]);
        }
    }
    let mut out = [0u8; 32];
    for i in 0..8 {
        out[4 * i..4 * i + 4].copy_from_slice(&h[i].to_be_bytes());
    }
    out
}

#[test]
fn resume_continues_bit_identically() {
    let scratch = tmp("resume");
    let dir = scratch.path();
    let d = dataset(dir, 30_000, 300);
    let run = |out: &str, steps: u64, ckpt_every: u64| {
        let mut t = Trainer::new(
            spec(300, 32),
            TrainConfig {
                ckpt_every,
                ..cfg(steps)
            },
            &d,
            &dir.join(out),
        )
        .unwrap();
        (0..steps).map(|_| t.train_step().unwrap().loss).collect::<Vec<f64>>()
    };
    let full = run("full", 6, 0);
    let first = run("cut", 3, 3);
    assert_eq!(&first[..], &full[..3]);
    // resume keeps the run's own total: the cut run is complete
    let e = Trainer::resume(&dir.join("cut"), None).err().unwrap();
    assert!(e.0.contains("already completed 3 steps"), "{e}");
    let mut t = Trainer::resume(
        &dir.join("cut"),
        Some(TrainConfig {
            ckpt_every: 3,
            ..cfg(6)
        }),
    )
    .unwrap();
    assert_eq!(t.step, 3);
    let rest: Vec<f64> = (0..3).map(|_| t.train_step().unwrap().loss).collect();
    for (a, b) in rest.iter().zip(&full[3..]) {
        assert_eq!(
            a.to_bits(),
            b.to_bits(),
            "resumed {rest:?} vs uninterrupted {:?}",
            &full[3..]
        );
    }
}

#[test]
fn corrupt_or_mismatched_checkpoints_are_rejected_whole() {
    let scratch = tmp("corrupt");
    let dir = scratch.path();
    let d = dataset(dir, 20_000, 300);
    let mut t = Trainer::new(spec(300, 32), cfg(1), &d, &dir.join("run")).unwrap();
    t.train_step().unwrap();
    let ck = checkpoint::resolve(&dir.join("run")).unwrap();
    assert!(checkpoint::load(&ck, true).is_ok());
    let model = ck.join("model.safetensors");
    let bytes = std::fs::read(&model).unwrap();
    std::fs::write(&model, &bytes[..bytes.len() / 2]).unwrap();
    let e = checkpoint::load(&ck, true).err().unwrap();
    assert!(e.0.contains("corrupt checkpoint"), "{e}");
    std::fs::write(&model, &bytes).unwrap();
    // a state that claims another model: sizes do not match
    let sp = ck.join("state.json");
    let text = std::fs::read_to_string(&sp)
        .unwrap()
        .replace("\"hidden\": 32", "\"hidden\": 64")
        .replace("\"head_dim\": 16", "\"head_dim\": 32");
    std::fs::write(&sp, text).unwrap();
    let e = checkpoint::load(&ck, true).err().unwrap();
    assert!(
        e.0.contains("corrupt checkpoint") && e.0.contains("does the model match"),
        "{e}"
    );
    assert!(checkpoint::resolve(dir).is_err(), "a folder with no checkpoint");
}

#[test]
fn bad_data_is_a_clear_error() {
    let scratch = tmp("bad");
    let dir = scratch.path();
    let empty = dir.join("empty.txt");
    std::fs::write(&empty, "  \n").unwrap();
    assert!(data::prepare(&empty, 300, &dir.join("d1"))
        .err()
        .unwrap()
        .0
        .contains("empty"));
    let small = dir.join("small.txt");
    std::fs::write(&small, "The quick brown fox jumps over the lazy dog. ".repeat(3)).unwrap();
    data::prepare(&small, 300, &dir.join("d2")).unwrap();
    let e = Trainer::new(spec(300, 32), cfg(1), &dir.join("d2"), &dir.join("run"))
        .err()
        .unwrap();
    assert!(e.0.contains("fewer than one sequence"), "{e}");
    let d = dataset(dir, 20_000, 300);
    let e = Trainer::new(spec(100, 32), cfg(1), &d, &dir.join("run")).err().unwrap();
    assert!(e.0.contains("tokens but model t has vocab 100"), "{e}");
    let e = Trainer::new(
        spec(300, 32),
        TrainConfig {
            global_batch: 6,
            ..cfg(1)
        },
        &d,
        &dir.join("run"),
    )
    .err()
    .unwrap();
    assert!(
        e.0.contains("--global-batch 6 is not divisible by --micro-batch 4"),
        "{e}"
    );
    assert!(data::Dataset::open(&dir.join("nothing"), 32)
        .err()
        .unwrap()
        .0
        .contains("no data.json"));
}

#[test]
fn nan_loss_stops_with_the_step_and_keeps_the_last_checkpoint() {
    let scratch = tmp("nan");
    let dir = scratch.path();
    let d = dataset(dir, 20_000, 300);
    let run = dir.join("run");
    let mut t = Trainer::new(
        spec(300, 32),
        TrainConfig {
            ckpt_every: 1,
            keep_last: 2,
            ..cfg(8)
        },
        &d,
        &run,
    )
    .unwrap();
    for _ in 0..3 {
        t.train_step().unwrap();
    }
    // --keep-last 2 pruned the first checkpoint
    let steps: Vec<u64> = checkpoint::list(&run).iter().map(|c| c.0).collect();
    assert_eq!(steps, vec![2, 3]);
    t.model.params[5] = f32::NAN;
    let e = t.train_step().err().unwrap();
    // the parameters after step 3 gave step 4's loss: their checkpoint is taken back
    assert!(e.0.contains("at step 4") && e.0.contains("ckpt-000002"), "{e}");
    assert_eq!(checkpoint::resolve(&run).unwrap(), run.join("ckpt-000002"));
    assert!(run.join("ckpt-000003.diverged").is_dir() && !run.join("ckpt-000003").exists());
    let (_, params, _) = checkpoint::load(&checkpoint::resolve(&run).unwrap(), true).unwrap();
    assert!(params.iter().all(|x| x.is_finite()), "the good checkpoint is intact");
}

#[test]
fn a_loss_far_above_its_minimum_stops_before_the_update() {
    let scratch = tmp("diverge");
    let dir = scratch.path();
    let d = dataset(dir, 20_000, 300);
    let mut t = Trainer::new(spec(300, 32), cfg(8), &d, &dir.join("run")).unwrap();
    t.train_step().unwrap();
    // weights blown up by 1e3: logits of ~1e5, a loss far above 3 × the first
    for x in t.model.params.iter_mut() {
        *x *= 1e3;
    }
    let before = t.model.params.clone();
    let e = t.train_step().err().unwrap();
    assert!(e.0.contains("divergence-factor") && e.0.contains("at step 2"), "{e}");
    assert_eq!(t.model.params, before, "no update after a refused step");
}

#[test]
fn validation_loss_falls_below_the_unigram_entropy() {
    let scratch = tmp("learn");
    let dir = scratch.path();
    let d = dataset(dir, 60_000, 400);
    let mut t = Trainer::new(
        spec(400, 32),
        TrainConfig {
            lr: 3e-3,
            warmup: 5,
            eval_batches: 4,
            ..cfg(150)
        },
        &d,
        &dir.join("run"),
    )
    .unwrap();
    let start = t.eval().unwrap();
    let mut last = None;
    for _ in 0..150 {
        last = t.train_step().unwrap().val_loss.or(last);
    }
    let val = last.expect("evaluated at the last step");
    let unigram = t.data.meta.unigram_entropy;
    assert!(
        start > unigram,
        "an untrained model is worse than unigram: {start} vs {unigram}"
    );
    assert!(
        val < unigram - 0.3,
        "val {val} vs unigram entropy {unigram} (start {start})"
    );
}
