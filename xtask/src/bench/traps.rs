//! What one uprobe hit costs the probed program, by the instruction the probe replaces. The
//! kernel emulates some instructions (jumps, calls, pushes, NOPs) and single-steps a copy of
//! the others out of line, a second trap: on a VM that second trap can cost ten times the
//! first. A C loop calls a function of eight labelled instructions; bpftrace counts the hits
//! of one probe at a time on one label. Printed: the loop's time per call with each probe,
//! over the loop without a probe, and the hits counted (`kernel.bpf_stats`). Where the Go
//! probes go follows from it (`agent/src/host/gobin/prologue.rs`, `call_check.rs`).
use std::{fs, process::Command, thread, time::Duration};

use super::{per_call, prog_stats, Lab, Report};
use crate::{Failed, Result};

/// The function under the probes: a Go-like stack check (`cmp`, `jbe`), then a body whose
/// every instruction has a label (RSI points at a zeroed buffer, so the jump is not taken).
const SOURCE: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
long f(long x);
#define L(name) ".globl " #name "\n.type " #name ",@function\n" #name ":\n"
__asm__(L(l_nop) " nop\n" L(l_cmp) " cmp %rsp, 16(%rsi)\n" L(l_jcc) " ja 1f\n"
        L(l_lea) " lea 1(%rdi,%rdi,2), %rax\n" L(l_push) " push %rbp\n" L(l_pop) " pop %rbp\n"
        L(l_mov) " mov %rax, %rax\n" L(l_ret) " ret\n1: ret\n.Lend:\n"
        ".size l_nop, .Lend-l_nop\n.size l_cmp, .Lend-l_cmp\n.size l_jcc, .Lend-l_jcc\n"
        ".size l_lea, .Lend-l_lea\n.size l_push, .Lend-l_push\n.size l_pop, .Lend-l_pop\n"
        ".size l_mov, .Lend-l_mov\n.size l_ret, .Lend-l_ret\n"
        ".globl f\n.set f, l_nop\n");
long buf[8];
int main(int argc, char **argv) {
    long n = atol(argv[1]), s = 0;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        register long *p asm("rsi") = buf;
        __asm__ volatile("" ::"r"(p));
        s += f(i);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.1f %ld\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n, s);
    return 0;
}
"#;

/// Each label, and what it is.
const SITES: [(&str, &str); 8] = [
    ("l_nop", "`nop`"),
    (
        "l_cmp",
        "`cmp rsp, [rsi+16]` (a Go function's first instruction: its stack check)",
    ),
    ("l_jcc", "`ja` (the stack check's jump)"),
    ("l_lea", "`lea`"),
    ("l_push", "`push rbp`"),
    ("l_pop", "`pop rbp`"),
    ("l_mov", "`mov`"),
    ("l_ret", "`ret`"),
];
const CALLS: u64 = 200_000;

/// Runs the loop once: ns per call.
fn time_loop(binary: &str) -> Result<f64> {
    let out = Command::new(binary)
        .arg(CALLS.to_string())
        .output()
        .map_err(|e| Failed(format!("{binary}: {e}")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .next()
        .and_then(|ns| ns.parse().ok())
        .ok_or_else(|| Failed(format!("{binary} said {text:?}")))
}

pub(super) fn traps_section(report: &mut Report) -> Result {
    let dir = std::env::temp_dir().join(format!("llbench-{}-traps", std::process::id()));
    fs::create_dir_all(&dir).map_err(|e| Failed(format!("{}: {e}", dir.display())))?;
    let source = dir.join("traps.c");
    fs::write(&source, SOURCE).map_err(|e| Failed(format!("{}: {e}", source.display())))?;
    let binary = dir.join("traps").to_str().expect("UTF-8 temp dir").to_owned();
    let built = Command::new("cc")
        .args(["-O1", "-o", &binary])
        .arg(&source)
        .status()
        .map_err(|e| Failed(format!("cc: {e}")))?;
    if !built.success() {
        return Err(Failed(format!("cc could not build {}", source.display())));
    }
    let bare = time_loop(&binary)?;
    eprintln!("no probe: {bare:.1} ns per call");
    let mut rows = Vec::new();
    for (label, what) in SITES {
        let mut lab = Lab::new()?;
        let pid = lab.bpftrace_running(&format!("uprobe:{binary}:{label} {{ @n = count(); }}"))?;
        let before = prog_stats(pid);
        let ns = time_loop(&binary)?;
        thread::sleep(Duration::from_millis(100));
        let hits: u64 = per_call(&before, &prog_stats(pid)).iter().map(|c| c.1).sum();
        lab.stop(pid);
        eprintln!("{label}: {ns:.1} ns per call, {hits} hits");
        if hits < CALLS {
            return Err(Failed(format!(
                "the probe on {label} counted {hits} hits of {CALLS} calls"
            )));
        }
        rows.push((what, ns, hits));
    }
    let _ = fs::remove_dir_all(&dir);

    report.line("## What a uprobe hit costs the probed program");
    report.line("");
    report.line(format!(
        "A C loop calls a function {CALLS} times, without a probe ({bare:.1} ns per call) and \
         with one bpftrace uprobe counting hits on one of its instructions. The kernel emulates \
         jumps, calls, pushes and NOPs, and single-steps the others out of line (a second \
         trap): the Go probes go on jumps (`agent/src/host/gobin/prologue.rs`, `call_check.rs`)."
    ));
    report.line("");
    report.line("| probed instruction | ns per call | per hit over no probe | hits |");
    report.line("| --- | ---: | ---: | ---: |");
    for (what, ns, hits) in rows {
        report.line(format!("| {what} | {ns:.0} | {:.0} ns | {hits} |", ns - bare));
    }
    report.line("");
    Ok(())
}
