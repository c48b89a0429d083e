//! Writes the fixed tiny model used by the Hugging Face round-trip test as an HF folder.
//! `cargo run -p exatrain-train --example hf_fixture_model -- DIR`, then
//! `python3 scripts/hf_fixture.py DIR crates/exatrain-train/tests/fixtures/hf_tiny.json`.

fn main() {
    let dir = std::env::args().nth(1).expect("usage: hf_fixture_model DIR");
    let (shape, params) = exatrain_train::hf::fixture_model();
    exatrain_train::hf::export(&shape, &params, None, std::path::Path::new(&dir)).unwrap();
    println!("wrote {dir}");
}
