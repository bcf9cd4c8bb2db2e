//! The eBPF crate is linked by `bpf-linker`: rebuild when that binary changes (cargo cannot
//! express the dependency on a tool).
fn main() {
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(err) => println!("cargo:warning=bpf-linker not found ({err}); run `cargo xtask setup`"),
    }
}
