//! Figures of one workload, and how they print.

use super::*;

#[derive(Default)]
pub(crate) struct Report {
    pub(crate) workload: &'static str,
    pub(crate) ops: usize,
    pub(crate) elapsed: Duration,
    pub(crate) latencies: Vec<Duration>,
    pub(crate) extra: Vec<(&'static str, f64)>,
}

impl Report {
    pub(crate) fn percentile_us(&self, p: f64) -> f64 {
        percentile_us(&self.latencies, p)
    }

    pub(crate) fn p50(&self) -> f64 {
        self.percentile_us(0.50)
    }

    pub(crate) fn cross_p99(&self) -> f64 {
        self.extra("cross_task_handoff_p99_us")
    }

    pub(crate) fn per_second(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }

    pub(crate) fn extra(&self, name: &str) -> f64 {
        self.extra
            .iter()
            .find(|(k, _)| *k == name)
            .map_or(f64::NAN, |(_, v)| *v)
    }

    pub(crate) fn json(&self) -> String {
        let mut fields = vec![
            format!("\"workload\":\"{}\"", self.workload),
            format!("\"ops\":{}", self.ops),
            format!("\"ops_per_s\":{:.0}", self.per_second()),
        ];
        if !self.latencies.is_empty() {
            fields.push(format!("\"p50_us\":{:.1}", self.percentile_us(0.50)));
            fields.push(format!("\"p99_us\":{:.1}", self.percentile_us(0.99)));
        }
        fields.extend(self.extra.iter().map(|(k, v)| format!("\"{k}\":{v:.2}")));
        format!("{{{}}}", fields.join(","))
    }
}

pub(crate) fn percentile_us(latencies: &[Duration], p: f64) -> f64 {
    let mut sorted: Vec<f64> = latencies.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    sorted.sort_by(f64::total_cmp);
    percentile_of(&sorted, p)
}

/// The `p`-quantile (0..=1) of `sorted`, the nearest rank; NaN for none.
pub(crate) fn percentile_of(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// The median of `figures` (the upper one of an even count), NaN for none.
pub(crate) fn median(mut figures: Vec<f64>) -> f64 {
    figures.sort_by(f64::total_cmp);
    figures.get(figures.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The order `N` sides run in, in round `round`: each round starts one side
/// later, so over `N` rounds each side runs in each place once, and none
/// always follows another (what one leaves behind in the allocator, the
/// runtime or the server falls on every side alike).
pub(crate) fn turn_order<const N: usize>(round: usize) -> [usize; N] {
    std::array::from_fn(|turn| (round + turn) % N)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn over_n_rounds_each_side_runs_in_each_place_once() {
        fn check<const N: usize>() {
            let orders: Vec<[usize; N]> = (0..N).map(turn_order::<N>).collect();
            for order in &orders {
                let mut sides = order.to_vec();
                sides.sort_unstable();
                assert_eq!(sides, (0..N).collect::<Vec<_>>(), "a round runs every side once");
            }
            for place in 0..N {
                let mut sides: Vec<usize> = orders.iter().map(|order| order[place]).collect();
                sides.sort_unstable();
                assert_eq!(
                    sides,
                    (0..N).collect::<Vec<_>>(),
                    "place {place} holds every side once"
                );
            }
        }
        check::<2>();
        check::<3>();
    }

    #[test]
    fn the_median_is_the_middle_figure_whatever_the_order() {
        assert_eq!(median(vec![1.2, 0.9, 1.0]), 1.0);
        assert_eq!(median(vec![3.0, 1.0, 2.0, 4.0, 5.0]), 3.0);
        assert!(median(Vec::new()).is_nan());
    }
}
