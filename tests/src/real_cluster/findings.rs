//! Failed expectations of one test case, collected and reported together, so one run of a
//! slow case (a cluster takes a minute to start) shows every one of them.
use std::cell::RefCell;
use std::fmt::Write as _;

/// How much of each finding the headlines keep.
const HEADLINE_CHARS: usize = 240;

thread_local! {
    /// The headlines of the findings this thread panicked with: the first line of each,
    /// shortened. The run directory's drop prints them last, so a failure reads from the tail
    /// of a long output too (CI shows its head and its tail).
    static HEADLINES: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// The headlines of the findings this thread panicked with, if it did.
pub fn take_headlines() -> Option<String> {
    HEADLINES.with(|h| h.borrow_mut().take())
}

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
            let mut headlines = text.clone();
            for (i, f) in self.found.iter().enumerate() {
                let _ = writeln!(text, "{}. {f}", i + 1);
                let first = f.lines().next().unwrap_or_default();
                let short: String = first.chars().take(HEADLINE_CHARS).collect();
                let more = if short.len() < f.len() { " […]" } else { "" };
                let _ = writeln!(headlines, "{}. {short}{more}", i + 1);
            }
            HEADLINES.with(|h| *h.borrow_mut() = Some(headlines));
            panic!("{text}");
        }
    }
}
