//! Why the study's recommended layout differs from what a given software stack runs: the best
//! layout under that stack's restrictions (a framework, its ZeRO stages, flash attention or not)
//! beside the recommendation, the step-time terms of both and their difference, and the
//! features the recommendation uses that the stack lacks — what the user would need to get it.

use exatrain_spec::{Framework, ModelSpec};
use serde::Serialize;

use crate::Point;

/// A software stack to compare with: what it runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stack {
    pub framework: Option<Framework>,
    /// The ZeRO stages it runs.
    pub zero: Vec<u8>,
    pub flash_attention: bool,
    /// It trains the blocks' linear layers in FP8 (`ParallelConfig::fp8`).
    pub fp8: bool,
}

impl Stack {
    /// Every layout: any framework, every ZeRO stage, flash attention or not.
    pub fn any() -> Stack {
        Stack {
            framework: None,
            zero: vec![0, 1, 2, 3],
            flash_attention: true,
            fp8: false,
        }
    }

    /// "megatron-deepspeed, ZeRO 0/1, no flash attention"
    pub fn describe(&self) -> String {
        let zero: Vec<String> = self.zero.iter().map(u8::to_string).collect();
        format!(
            "{}, ZeRO {}, {}",
            self.framework.map_or("any framework".to_string(), |f| f.to_string()),
            zero.join("/"),
            if self.flash_attention {
                "flash attention"
            } else {
                "no flash attention"
            }
        ) + if self.fp8 { ", FP8 linears" } else { "" }
    }
}

/// One step-time term of both layouts, seconds.
#[derive(Debug, Clone, Serialize)]
pub struct Term {
    pub name: &'static str,
    pub recommended_s: f64,
    pub stack_s: f64,
}

/// The recommendation against the stack's best layout.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    pub stack: Stack,
    /// The stack's best layout (None: none of its layouts fits, `why` says so).
    pub stack_best: Option<Point>,
    pub why: Option<String>,
    /// compute, tp_comm, pp_comm, cp_comm, dp_comm, bubble, optimizer, step.
    pub terms: Vec<Term>,
    /// What the recommended layout uses that the stack does not run, one phrase each.
    pub needs: Vec<String>,
    /// recommended tokens/s ÷ the stack's (1 when they are the same layout).
    pub speedup: Option<f64>,
}

/// The terms of two plans side by side.
fn terms(rec: &Point, other: &Point) -> Vec<Term> {
    let (a, b) = (&rec.plan.time_s, &other.plan.time_s);
    vec![
        Term {
            name: "compute",
            recommended_s: a.compute,
            stack_s: b.compute,
        },
        Term {
            name: "tp_comm",
            recommended_s: a.tp_comm,
            stack_s: b.tp_comm,
        },
        Term {
            name: "pp_comm",
            recommended_s: a.pp_comm,
            stack_s: b.pp_comm,
        },
        Term {
            name: "cp_comm",
            recommended_s: a.cp_comm,
            stack_s: b.cp_comm,
        },
        Term {
            name: "dp_comm",
            recommended_s: a.dp_comm,
            stack_s: b.dp_comm,
        },
        Term {
            name: "bubble",
            recommended_s: a.bubble,
            stack_s: b.bubble,
        },
        Term {
            name: "optimizer",
            recommended_s: a.optimizer,
            stack_s: b.optimizer,
        },
        Term {
            name: "step",
            recommended_s: rec.plan.step_time_s,
            stack_s: other.plan.step_time_s,
        },
    ]
}

/// What `rec` uses that `stack` does not run. `priced_as`: the framework whose kernel efficiency
/// the recommendation was priced with (the cluster's `[stack]`), when it names one.
pub fn needs(m: &ModelSpec, rec: &Point, stack: &Stack, priced_as: Option<Framework>) -> Vec<String> {
    let c = &rec.config;
    let mut out = Vec::new();
    if !stack.zero.contains(&c.zero) {
        let what = match c.zero {
            3 => "ZeRO-3 / FSDP: parameters, gradients and optimizer state sharded, weights gathered per layer",
            2 => "ZeRO-2: gradients and optimizer state sharded",
            1 => "ZeRO-1 (a distributed optimizer)",
            _ => "plain data parallelism (ZeRO 0)",
        };
        let runs: Vec<String> = stack.zero.iter().map(u8::to_string).collect();
        out.push(format!("{what} (the stack runs ZeRO {})", runs.join("/")));
    }
    if c.flash_attention && !stack.flash_attention {
        out.push("flash attention (no s×s score tensor: less memory, less traffic)".into());
    }
    if c.fp8 && !stack.fp8 {
        out.push("FP8 linear layers (Transformer Engine; the stack trains them in bf16)".into());
    }
    if let Some(f) = stack.framework {
        // what else the framework cannot run, the FP8 already named above set aside
        let c = &exatrain_spec::ParallelConfig {
            fp8: c.fp8 && stack.fp8,
            ..*c
        };
        if let Err(why) = f.can_run(m, c) {
            out.push(format!("{why} (not run by {f})"));
        }
        // the stack's own gradient-accumulation passes, which the pricing framework does not have
        // at the recommendation's own ZeRO stage where the stack runs it, else at the stack's
        // stage that costs most (the layout would have to run at one of them)
        let own = |z: u8| f.grad_accum_bytes_per_param(&exatrain_spec::ParallelConfig { zero: z, ..*c });
        let bytes = if stack.zero.contains(&c.zero) {
            own(c.zero)
        } else {
            stack.zero.iter().map(|&z| own(z)).fold(0.0, f64::max)
        };
        if let Some(g) = priced_as.filter(|g| bytes > g.grad_accum_bytes_per_param(c)) {
            out.push(format!(
                "{g}'s gradient accumulation, without separate passes ({f}'s optimizer moves {bytes} bytes per parameter after each microbatch's backward)"
            ));
        }
        // the backward TP collectives hidden under the GEMMs, which the framework does not do
        // for this layout (Megatron-DeepSpeed only with sequence parallelism, torchtitan never)
        if let Some(g) =
            priced_as.filter(|g| c.tp > 1 && !c.overlap_tp && g.overlaps_tp_backward(c) && !f.overlaps_tp_backward(c))
        {
            out.push(format!(
                "{g}'s asynchronous TP communication (backward collectives under the column-parallel GEMMs; {f} blocks on them in this layout)"
            ));
        }
        if let Some(g) = priced_as.filter(|g| g.compute_efficiency() > f.compute_efficiency()) {
            out.push(format!(
                "{g}'s kernel efficiency ({f} reaches {:.1} % of it on the published runs)",
                100.0 * f.compute_efficiency() / g.compute_efficiency()
            ));
        }
    }
    out
}

/// Compare the recommended point with the stack's best for the same GPUs and batch.
pub fn explain(
    m: &ModelSpec,
    rec: &Point,
    stack: &Stack,
    priced_as: Option<Framework>,
    stack_best: Result<Point, String>,
) -> Explanation {
    match stack_best {
        Ok(b) => Explanation {
            stack: stack.clone(),
            terms: terms(rec, &b),
            needs: needs(m, rec, stack, priced_as),
            speedup: Some(rec.plan.tokens_per_s / b.plan.tokens_per_s),
            stack_best: Some(b),
            why: None,
        },
        Err(why) => Explanation {
            stack: stack.clone(),
            stack_best: None,
            why: Some(why),
            terms: Vec::new(),
            needs: needs(m, rec, stack, priced_as),
            speedup: None,
        },
    }
}

/// One paragraph: the stack's layout, how the step differs term by term, what is needed.
pub fn sentence(e: &Explanation) -> String {
    let Some(b) = &e.stack_best else {
        return format!(
            "{}: no layout ({}); the recommendation needs {}",
            e.stack.describe(),
            e.why.as_deref().unwrap_or("none fits"),
            if e.needs.is_empty() {
                "nothing more".into()
            } else {
                e.needs.join("; ")
            }
        );
    };
    if e.needs.is_empty() {
        return format!("{}: runs the recommended layout itself", e.stack.describe());
    }
    let step = b.plan.step_time_s;
    let moved: Vec<String> = e
        .terms
        .iter()
        .filter(|t| t.name != "step" && (t.recommended_s - t.stack_s).abs() >= 0.005 * step)
        .map(|t| format!("{} {:+.2} s", t.name, t.recommended_s - t.stack_s))
        .collect();
    format!(
        "{}: best {} at {:.1} % MFU; the recommendation is {:.2}× faster per step ({}), and needs {}",
        e.stack.describe(),
        crate::report::layout(b),
        100.0 * b.plan.mfu,
        e.speedup.unwrap_or(1.0),
        if moved.is_empty() {
            "no term moves".to_string()
        } else {
            moved.join(", ")
        },
        e.needs.join("; ")
    )
}
