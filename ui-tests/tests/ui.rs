//! Compile-fail tests (one mistake per file, with the reviewed `.stderr`) and
//! compile-pass tests (one signature shape per file).

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/fail/*.rs");
    cases.pass("tests/ui/pass/*.rs");
}
