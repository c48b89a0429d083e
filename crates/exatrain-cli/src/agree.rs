#![cfg_attr(not(feature = "mpi"), allow(dead_code))]
//! Ranks agree or stop: before an MPI job does any work, rank 0 broadcasts a digest of each
//! resolved setting; every rank compares it with its own, and one all-reduce tells every rank
//! which settings differ, so all of them stop with the same message naming them (instead of a
//! different `--steps` hanging, a different `--tp` crashing, a different `--lr` diverging).

use exatrain_parallel::comm::Communicator;
use exatrain_spec::SpecError;

/// A 64-bit FNV-1a digest of `s`, as four 16-bit pieces (each exact in an f32).
fn digest(s: &str) -> [f32; 4] {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    [0, 16, 32, 48].map(|k| ((h >> k) & 0xffff) as f32)
}

/// Check that every rank of `world` resolved the same `settings` (flag, value), in the same
/// order; otherwise every rank returns the error naming the settings that differ.
pub fn agree(world: &dyn Communicator, settings: &[(String, String)]) -> Result<(), SpecError> {
    let comm = |e: exatrain_parallel::comm::CommError| SpecError::new(e.0);
    // the count first, so a rank with another list cannot misread the digests
    let mut n = [settings.len() as f32];
    world.broadcast(&mut n, 0).map_err(comm)?;
    let mut differs = [f32::from(n[0] as usize != settings.len())];
    world.all_reduce(&mut differs).map_err(comm)?;
    if differs[0] > 0.0 {
        return Err(SpecError::new(
            "the ranks resolved different settings (different exatrain versions?); start every rank with the same command",
        ));
    }
    let mine: Vec<f32> = settings.iter().flat_map(|(k, v)| digest(&format!("{k}={v}"))).collect();
    let mut root = mine.clone();
    world.broadcast(&mut root, 0).map_err(comm)?;
    let mut bad: Vec<f32> = mine
        .chunks(4)
        .zip(root.chunks(4))
        .map(|(a, b)| f32::from(a != b))
        .collect();
    world.all_reduce(&mut bad).map_err(comm)?;
    let names: Vec<String> = settings
        .iter()
        .zip(&bad)
        .filter(|(_, b)| **b > 0.0)
        .map(|((k, v), _)| {
            if world.rank() != 0 && root_differs(&mine, &root, k, settings) {
                format!("{k} (rank {} has {v})", world.rank())
            } else {
                k.clone()
            }
        })
        .collect();
    if names.is_empty() {
        return Ok(());
    }
    Err(SpecError::new(format!(
        "the ranks of this job were started with different settings: {}; start every rank with the same flags",
        names.join(", ")
    )))
}

/// Whether this rank's `key` differs from rank 0's.
fn root_differs(mine: &[f32], root: &[f32], key: &str, settings: &[(String, String)]) -> bool {
    settings
        .iter()
        .position(|(k, _)| k == key)
        .is_some_and(|i| mine[4 * i..4 * i + 4] != root[4 * i..4 * i + 4])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(settings: Vec<Vec<(String, String)>>) -> Vec<Result<(), SpecError>> {
        let comms = exatrain_parallel::comm::in_process(settings.len(), std::time::Duration::from_secs(10));
        std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .into_iter()
                .zip(&settings)
                .map(|(c, st)| s.spawn(move || agree(&c, st)))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    fn set(steps: &str, lr: &str) -> Vec<(String, String)> {
        vec![("--steps".into(), steps.into()), ("--lr".into(), lr.into())]
    }

    #[test]
    fn equal_settings_pass_and_a_different_one_stops_every_rank_naming_it() {
        assert!(run(vec![set("3", "0.001"); 3]).iter().all(|r| r.is_ok()));
        let r = run(vec![set("3", "0.001"), set("4", "0.001"), set("3", "0.001")]);
        for (i, x) in r.iter().enumerate() {
            let e = &x.as_ref().unwrap_err().0;
            assert!(e.contains("--steps") && !e.contains("--lr"), "rank {i}: {e}");
        }
        assert!(r[1].as_ref().unwrap_err().0.contains("rank 1 has 4"));
        let r = run(vec![set("3", "0.001"), vec![("--steps".into(), "3".into())]]);
        assert!(r.iter().all(|x| x.is_err()));
    }
}
