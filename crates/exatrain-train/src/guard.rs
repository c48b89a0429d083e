//! The divergence guard both engines run each step, before the optimizer update: a non-finite
//! loss or gradient norm, or a loss above `factor` × the lowest loss so far, stops the run. The
//! parameters that gave the bad loss are those after the previous step, so checkpoints from that
//! step on are taken back (`checkpoint::retract`): the one `latest` names still trains.

/// The lowest loss so far and how far above it a loss may go.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Guard {
    /// Stop when the loss exceeds `factor` × the lowest loss so far (0: only NaN/inf stop).
    pub factor: f64,
    /// The lowest training loss seen (kept in checkpoints, so a resumed run keeps its reference).
    pub min_loss: Option<f64>,
}

/// Why a step was refused.
#[derive(Debug, Clone, PartialEq)]
pub struct Diverged {
    /// 1-based step whose loss or gradient was bad.
    pub step: u64,
    pub why: String,
}

impl Guard {
    pub fn new(factor: f64, min_loss: Option<f64>) -> Guard {
        Guard { factor, min_loss }
    }

    /// Check step `step` (1-based) before its update; on success remember its loss.
    pub fn check(&mut self, step: u64, loss: f64, grad_norm: f64) -> Result<(), Diverged> {
        let why = if !loss.is_finite() {
            Some(format!("loss is {loss}"))
        } else if !grad_norm.is_finite() {
            Some(format!("gradient norm is {grad_norm}"))
        } else {
            match self.min_loss {
                Some(min) if self.factor > 0.0 && loss > self.factor * min => Some(format!(
                    "loss {loss:.4} is above --divergence-factor {} × the lowest loss so far {min:.4}",
                    self.factor
                )),
                _ => None,
            }
        };
        if let Some(why) = why {
            return Err(Diverged { step, why });
        }
        self.min_loss = Some(self.min_loss.map_or(loss, |m| m.min(loss)));
        Ok(())
    }
}

impl Diverged {
    /// The user's message, naming the checkpoint that is still good.
    pub fn message(&self, last_good: Option<&std::path::Path>) -> String {
        format!(
            "{} at step {}: stopping (the update was not applied); the last good checkpoint is {} (later ones were renamed *.diverged); lower --lr, or raise or disable (0) --divergence-factor",
            self.why,
            self.step,
            last_good.map_or("(none: no checkpoint before the divergence)".into(), |p| p.display().to_string())
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_on_nan_inf_and_a_loss_far_above_the_minimum() {
        let mut g = Guard::new(3.0, None);
        assert!(g.check(1, 8.0, 1.0).is_ok());
        assert!(g.check(2, 4.0, 1.0).is_ok());
        assert!(g.check(3, 11.9, 1.0).is_ok());
        assert_eq!(g.check(4, 12.1, 1.0).unwrap_err().step, 4);
        assert!(g.check(5, f64::NAN, 1.0).unwrap_err().why.contains("NaN"));
        assert!(g
            .check(6, 4.0, f64::INFINITY)
            .unwrap_err()
            .why
            .contains("gradient norm"));
        assert_eq!(g.min_loss, Some(4.0));
        let mut off = Guard::new(0.0, Some(1.0));
        assert!(off.check(1, 1e15, 1.0).is_ok());
        assert!(off.check(2, f64::INFINITY, 1.0).is_err());
    }
}
