//! Builds the kernel programs (`ebpf/`) for the BPF target and leaves the object in `OUT_DIR`,
//! so a plain `cargo build` of the agent always embeds eBPF code built from the same tree.
//!
//! `AYA_BUILD_SKIP=1` skips the eBPF build (for `cargo check`/`clippy` on machines without
//! bpf-linker); an empty object is written instead and the agent refuses to load it at run time.
use std::{env, fs, path::PathBuf};

use aya_build::{Package, Toolchain};

fn main() {
    revision();
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
        fs::write(out.join("lifeline"), []).expect("write placeholder eBPF object");
        return;
    }
    let ebpf = Package {
        name: "lifeline-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../ebpf"),
        ..Default::default()
    };
    // The installed stable compiler builds `core` for the BPF target with RUSTC_BOOTSTRAP=1
    // (set here, so nobody has to remember it); no nightly toolchain is needed.
    env::set_var("RUSTC_BOOTSTRAP", "1");
    if let Err(err) = aya_build::build_ebpf([ebpf], Toolchain::Custom("stable")) {
        panic!("building the eBPF programs failed: {err:#}\n(run `cargo xtask setup` once on a new machine)");
    }
}

/// `LIFELINE_REVISION`: the git revision this binary was built from (for `--version` and
/// `lifeline_build_info`).
fn revision() {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let rev = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    println!(
        "cargo:rustc-env=LIFELINE_REVISION={rev}{}",
        if dirty { "-dirty" } else { "" }
    );
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        println!("cargo:rerun-if-changed={dir}/index");
    }
}
