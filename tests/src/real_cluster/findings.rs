//! Failed expectations of one test case, collected and reported together, so one run of a
//! slow case (a cluster takes a minute to start) shows every one of them.
use std::fmt::Write as _;

#[derive(Default)]
pub struct Findings(Vec<String>);

impl Findings {
    /// Records a failed expectation (and prints it at once).
    pub fn add(&mut self, what: impl Into<String>) {
        let what = what.into();
        eprintln!("FINDING: {what}");
        self.0.push(what);
    }

    /// Records `what()` unless `ok`.
    pub fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.add(what());
        }
    }

    /// Panics listing every finding of `case`, if there is one.
    pub fn assert_none(self, case: &str) {
        if !self.0.is_empty() {
            let mut text = format!("{case}: {} failed expectation(s):\n", self.0.len());
            for (i, f) in self.0.iter().enumerate() {
                let _ = writeln!(text, "{}. {f}", i + 1);
            }
            panic!("{text}");
        }
    }
}
