//! Scenario reports: one JSON record per scenario under
//! `target/reliability/`, and the summary table `.ci/run` prints from them.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};

/// `target/reliability` of the workspace.
pub fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/reliability")
}

/// The `redis-server --version` line the scenarios ran against.
pub fn redis_version() -> &'static str {
    static VERSION: OnceLock<String> = OnceLock::new();
    VERSION.get_or_init(|| {
        std::process::Command::new(crate::redis_server_binary())
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_else(|e| format!("unknown ({e})"))
    })
}

/// Writes `target/reliability/<id>.json`: `record` plus the scenario id,
/// versions, and the seed when the scenario used one.
pub fn write(id: &str, mut record: Value) {
    if let Some(fields) = record.as_object_mut() {
        fields.insert("id".into(), json!(id));
        fields.insert(
            "versions".into(),
            json!({ "lock-runtime": env!("CARGO_PKG_VERSION"), "redis": redis_version() }),
        );
    }
    let dir = dir();
    std::fs::create_dir_all(&dir).expect("report dir");
    let text = serde_json::to_string(&record).expect("report is JSON");
    std::fs::write(dir.join(format!("{id}.json")), &text).expect("write report");
    println!("{text}");
}

/// What a scenario's run proved.
///
/// The assumption monitor (`monitor.rs`) excuses a violation: a run in
/// which a process was starved past the bound proves nothing about the
/// violation it saw, and is re-run or reported INVALID. It does not excuse
/// a clean run: a property that held while a process was starved held in
/// harsher conditions than it assumes, and the run is a PASS (recorded as
/// starved, with its lateness). INVALID is therefore rare, and each one
/// is a scenario to size better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// No violation.
    Pass,
    /// A violation while every process kept to the assumptions.
    Fail,
    /// A violation while a process was starved past the bound.
    Invalid,
}

impl Verdict {
    /// The verdict of a run that saw a violation or not, starved or not.
    pub fn judge(violated: bool, starved: bool) -> Verdict {
        match (violated, starved) {
            (false, _) => Verdict::Pass,
            (true, false) => Verdict::Fail,
            (true, true) => Verdict::Invalid,
        }
    }

    /// `PASS`, `FAIL` or `INVALID`, as the reports write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Invalid => "INVALID",
        }
    }
}

/// The `p`-quantile (0..=1) of sorted durations, in ms.
pub fn quantile_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3
}

/// `{min, p50, p99, max}` of durations, in ms.
pub fn spread_ms(mut values: Vec<Duration>) -> Value {
    values.sort();
    json!({
        "n": values.len(),
        "min": round(quantile_ms(&values, 0.0)),
        "p50": round(quantile_ms(&values, 0.5)),
        "p99": round(quantile_ms(&values, 0.99)),
        "max": round(quantile_ms(&values, 1.0)),
    })
}

fn round(ms: f64) -> Value {
    if ms.is_finite() {
        json!((ms * 100.0).round() / 100.0)
    } else {
        Value::Null
    }
}

/// The summary table of every report in `target/reliability`, one row per
/// scenario in id order.
pub fn summary() -> String {
    summary_and_counts().0
}

/// How many scenario records gave each verdict (`PASS`, `FAIL`, `INVALID`),
/// and how many of them ran with a process starved beyond the monitor's
/// bound. Its `Display` is the summary's closing line.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counts {
    /// Records per verdict word.
    pub verdicts: std::collections::BTreeMap<String, usize>,
    /// Records marked `starved`.
    pub starved: usize,
}

impl Counts {
    /// Records whose verdict is not `PASS` (a failure, a run that proved
    /// nothing, or a record without a verdict).
    pub fn not_passed(&self) -> usize {
        self.verdicts
            .iter()
            .filter(|(word, _)| word.as_str() != "PASS")
            .map(|(_, n)| n)
            .sum()
    }
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let words: Vec<String> = self
            .verdicts
            .iter()
            .map(|(word, n)| format!("{word} {n}"))
            .collect();
        write!(
            f,
            "verdicts of {} scenarios: {} ({} with a process starved beyond the monitor's bound)",
            self.verdicts.values().sum::<usize>(),
            words.join(", "),
            self.starved
        )
    }
}

/// The summary table (as [`summary`]) and the verdicts' counts.
pub fn summary_and_counts() -> (String, Counts) {
    let mut rows: Vec<Value> = std::fs::read_dir(dir())
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|text| serde_json::from_str(&text).ok())
        .collect();
    rows.sort_by_key(|r| sort_key(r["id"].as_str().unwrap_or("")));
    let cell = |v: &Value| match v {
        Value::Null => "–".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let slack = |v: &Value| match (&v["min"], &v["p50"]) {
        (Value::Null, _) => "–".to_owned(),
        (min, p50) => format!("{} / {}", cell(min), cell(p50)),
    };
    let mut table = String::from(
        "| id | scenario | verdict | acquisitions | faults | overlaps | token regressions | lost slack ms min / p50 | key figure |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut counts = Counts::default();
    for r in &rows {
        let verdict = cell(&r["verdict"]);
        let word = verdict.split([' ', ';']).next().unwrap_or("").to_owned();
        *counts.verdicts.entry(word).or_insert(0) += 1;
        let verdict = if r["starved"] == json!(true) {
            counts.starved += 1;
            format!("{verdict} (starved {} ms)", cell(&r["worst_lateness_ms"]))
        } else {
            verdict
        };
        table.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            cell(&r["id"]),
            cell(&r["scenario"]),
            verdict,
            cell(&r["acquisitions"]),
            cell(&r["faults"]),
            cell(&r["overlaps"]),
            cell(&r["token_regressions"]),
            slack(&r["lost_slack_ms"]),
            cell(&r["key_figure"]),
        ));
    }
    table.push_str(&format!("\n{counts}\n"));
    (table, counts)
}

/// S2 before S10, R before C before X.
fn sort_key(id: &str) -> (usize, u32, String) {
    let family = "SRPCX".find(id.chars().next().unwrap_or('Z')).unwrap_or(9);
    let number = id[1..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>();
    (family, number.parse().unwrap_or(0), id.to_owned())
}

#[cfg(test)]
mod tests {
    use super::Counts;

    #[test]
    fn only_pass_counts_as_passed_and_the_line_says_how_many_starved() {
        let mut counts = Counts::default();
        counts.verdicts.insert("PASS".to_owned(), 3);
        assert_eq!(counts.not_passed(), 0);
        counts.verdicts.insert("INVALID".to_owned(), 1);
        counts.starved = 2;
        assert_eq!(counts.not_passed(), 1);
        assert_eq!(
            counts.to_string(),
            "verdicts of 4 scenarios: INVALID 1, PASS 3 (2 with a process starved beyond the monitor's bound)"
        );
    }
}
