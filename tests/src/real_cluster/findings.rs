//! Failed expectations of one test case, collected and reported together, so one run of a
//! slow case (a cluster takes a minute to start) shows every one of them.
use std::fmt::Write as _;

#[derive(Default)]
pub struct Findings {
    found: Vec<String>,
    /// A trial run of checks that will be repeated: nothing printed.
    quiet: bool,
}

impl Findings {
    /// Findings of a trial: recorded, not printed.
    pub fn quiet() -> Findings {
        Findings {
            found: Vec::new(),
            quiet: true,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.found.is_empty()
    }

    /// Records a failed expectation (and prints it at once, unless quiet).
    pub fn add(&mut self, what: impl Into<String>) {
        let what = what.into();
        if !self.quiet {
            eprintln!("FINDING: {what}");
        }
        self.found.push(what);
    }

    /// Records `what()` unless `ok`.
    pub fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.add(what());
        }
    }

    /// Panics listing every finding of `case`, if there is one.
    pub fn assert_none(self, case: &str) {
        if !self.found.is_empty() {
            let mut text = format!("{case}: {} failed expectation(s):\n", self.found.len());
            for (i, f) in self.found.iter().enumerate() {
                let _ = writeln!(text, "{}. {f}", i + 1);
            }
            panic!("{text}");
        }
    }
}
