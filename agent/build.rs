//! Builds the kernel programs (`ebpf/`) for the BPF target and leaves the object in `OUT_DIR`,
//! so a plain `cargo build` of the agent always embeds eBPF code built from the same tree.
//!
//! The programs are built the same way (release, for the BPF target) whatever the agent's
//! profile, so every build of the agent shares one eBPF build in `<target dir>/bpf`: `cargo
//! clippy`, the debug and the static release agent no longer build `core` and the programs
//! again each (~40 s each; three times a `cargo xtask test`).
//!
//! `AYA_BUILD_SKIP=1` skips the eBPF build (for `cargo check`/`clippy` on machines without
//! bpf-linker); an empty object is written instead and the agent refuses to load it at run time.
use std::{
    env,
    fs::{self, File},
    path::{Path, PathBuf},
};

use aya_build::{Package, Toolchain};

fn main() {
    revision();
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    if skip {
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
    let shared = shared_dir(&out);
    fs::create_dir_all(&shared).unwrap_or_else(|e| panic!("create {}: {e}", shared.display()));
    // One build script at a time builds into `shared` and copies out of it (two profiles may
    // build at once); held until this one has its copies.
    let lock = File::create(shared.join(".lock"))
        .unwrap_or_else(|e| panic!("create {}/.lock: {e}", shared.display()));
    lock.lock()
        .unwrap_or_else(|e| panic!("lock {}/.lock: {e}", shared.display()));
    // aya-build builds under, and copies the programs into, `OUT_DIR`: here the shared one.
    env::set_var("OUT_DIR", &shared);
    let built = aya_build::build_ebpf([ebpf], Toolchain::Custom("stable"));
    env::set_var("OUT_DIR", &out);
    if let Err(err) = built {
        panic!("building the eBPF programs failed: {err:#}\n(run `cargo xtask setup` once on a new machine)");
    }
    for program in ["lifeline", "lifeline-filter"] {
        let (from, to) = (shared.join(program), out.join(program));
        fs::copy(&from, &to).unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), to.display()));
    }
}

/// `<target dir>/bpf`: the target directory is the nearest ancestor of `out` that holds the
/// `CACHEDIR.TAG` cargo writes there; `out/bpf`, shared with nobody, if none does.
fn shared_dir(out: &Path) -> PathBuf {
    out.ancestors()
        .find(|dir| dir.join("CACHEDIR.TAG").is_file())
        .unwrap_or(out)
        .join("bpf")
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
