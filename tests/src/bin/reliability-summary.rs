//! Prints the summary table of the fault suite's reports
//! (`target/reliability/*.json`); `.ci/run` calls it after the tests.
//! `--last-line` prints only the verdicts' count (the README's test command
//! ends with it); `--strict` exits 1 when a scenario did not pass: a FAIL,
//! or an INVALID run (starved, so it proved nothing), which `.ci/run`
//! counts as a defect.

fn main() {
    let (table, counts) = lock_tests::report::summary_and_counts();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--last-line") {
        println!("fault suite: {counts}");
    } else {
        print!("{table}");
    }
    if args.iter().any(|a| a == "--strict") && counts.not_passed() > 0 {
        eprintln!(
            "{} fault scenario(s) did not pass (FAIL or INVALID): see the table",
            counts.not_passed()
        );
        std::process::exit(1);
    }
}
