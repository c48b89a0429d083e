//! Extremely randomized trees (Geurts et al. 2006) as a regression surrogate with uncertainty:
//! the mean of the trees' predictions, and their spread as the standard deviation — the surrogate
//! DeepHyper's CBO uses by default. Small and exact enough for the ≤ few hundred observations a
//! search over real runs makes; no crate offers this with per-tree predictions at a small cost.

#[derive(Debug, Clone)]
enum Node {
    Leaf(f64),
    Split {
        feature: usize,
        threshold: f64,
        left: usize,
        right: usize,
    },
}

#[derive(Debug, Clone)]
struct Tree {
    nodes: Vec<Node>,
}

impl Tree {
    fn predict(&self, x: &[f64]) -> f64 {
        let mut i = 0;
        loop {
            match self.nodes[i] {
                Node::Leaf(v) => return v,
                Node::Split {
                    feature,
                    threshold,
                    left,
                    right,
                } => {
                    i = if x[feature] <= threshold { left } else { right };
                }
            }
        }
    }
}

/// An ensemble of extra-trees.
#[derive(Debug, Clone)]
pub struct Forest {
    trees: Vec<Tree>,
}

fn mean(ys: &[f64]) -> f64 {
    ys.iter().sum::<f64>() / ys.len() as f64
}

fn sse(ys: impl Iterator<Item = f64> + Clone) -> f64 {
    let (n, s) = ys.clone().fold((0.0, 0.0), |(n, s), y| (n + 1.0, s + y));
    if n == 0.0 {
        return 0.0;
    }
    let m = s / n;
    ys.map(|y| (y - m) * (y - m)).sum()
}

fn build(
    x: &[Vec<f64>],
    y: &[f64],
    idx: &mut [usize],
    min_leaf: usize,
    rng: &mut fastrand::Rng,
    nodes: &mut Vec<Node>,
) -> usize {
    let here = nodes.len();
    let ys: Vec<f64> = idx.iter().map(|&i| y[i]).collect();
    nodes.push(Node::Leaf(mean(&ys)));
    if idx.len() < 2 * min_leaf || sse(ys.iter().copied()) <= 1e-12 {
        return here;
    }
    let dims = x[0].len();
    let mut best: Option<(f64, usize, f64)> = None;
    for feature in 0..dims {
        let (lo, hi) = idx.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &i| {
            (lo.min(x[i][feature]), hi.max(x[i][feature]))
        });
        if hi <= lo {
            continue;
        }
        let threshold = lo + rng.f64() * (hi - lo);
        let left = idx.iter().filter(|&&i| x[i][feature] <= threshold).map(|&i| y[i]);
        let right = idx.iter().filter(|&&i| x[i][feature] > threshold).map(|&i| y[i]);
        let (nl, nr) = (left.clone().count(), right.clone().count());
        if nl < min_leaf || nr < min_leaf {
            continue;
        }
        let score = sse(left) + sse(right);
        if best.is_none_or(|b| score < b.0) {
            best = Some((score, feature, threshold));
        }
    }
    let Some((_, feature, threshold)) = best else {
        return here;
    };
    let mut split = 0;
    for j in 0..idx.len() {
        if x[idx[j]][feature] <= threshold {
            idx.swap(j, split);
            split += 1;
        }
    }
    let (l, r) = idx.split_at_mut(split);
    let left = build(x, y, l, min_leaf, rng, nodes);
    let right = build(x, y, r, min_leaf, rng, nodes);
    nodes[here] = Node::Split {
        feature,
        threshold,
        left,
        right,
    };
    here
}

impl Forest {
    /// Fit `trees` trees on rows `x` (all of one width) and targets `y`.
    pub fn fit(x: &[Vec<f64>], y: &[f64], trees: usize, min_leaf: usize, rng: &mut fastrand::Rng) -> Forest {
        assert_eq!(x.len(), y.len(), "one target per row");
        assert!(!x.is_empty(), "at least one observation");
        let trees = (0..trees)
            .map(|_| {
                let mut idx: Vec<usize> = (0..x.len()).collect();
                let mut nodes = Vec::new();
                build(x, y, &mut idx, min_leaf.max(1), rng, &mut nodes);
                Tree { nodes }
            })
            .collect();
        Forest { trees }
    }

    /// Mean and standard deviation of the trees' predictions at `x`.
    pub fn predict(&self, x: &[f64]) -> (f64, f64) {
        let n = self.trees.len() as f64;
        let (s, s2) = self
            .trees
            .iter()
            .map(|t| t.predict(x))
            .fold((0.0, 0.0), |(s, s2), v| (s + v, s2 + v * v));
        let m = s / n;
        (m, (s2 / n - m * m).max(0.0).sqrt())
    }
}
