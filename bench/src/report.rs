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
    if latencies.is_empty() {
        return f64::NAN;
    }
    let mut sorted = latencies.to_vec();
    sorted.sort_unstable();
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index].as_secs_f64() * 1e6
}
