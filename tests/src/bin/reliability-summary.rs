//! Prints the summary table of the fault suite's reports
//! (`target/reliability/*.json`); `.ci/run` calls it after the tests.

fn main() {
    print!("{}", lock_tests::report::summary());
}
