//! `cargo xtask setup`, the Kubernetes part: what the real-cluster test tier (and the shipping
//! end-to-end test) run, built from Debian's packages only.
//!
//! - apt packages: Go, etcd, containerd, runc, the CNI plugins, conntrack, a JDK, a C compiler;
//! - Debian's `kubernetes` *source* package (1.20.2), fetched with `apt-get source` through a
//!   private `APT_CONFIG` whose deb-src entries are derived from the machine's deb822 sources
//!   (the machine's own lists stay untouched);
//! - the OpenAPI definitions the tarball lacks (`openapi-gen`, as `Makefile.generated_files`
//!   runs it), then `go build` of the server binaries in a GOPATH layout (`GO111MODULE=off`,
//!   `CGO_ENABLED=0`, tags `selinux,notest`, the version stamped by ldflags) and the static
//!   `pause` binary of the same tree.
//!
//! Everything lands in [`dir()`] (`/var/tmp/lifeline-k8s/v1.20.2/`); a stamp written last says
//! the build is complete, so a warm machine does nothing. A lock file serialises concurrent
//! setups. Every failure names the step that failed.
use std::{
    fmt, fs,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use crate::{Failed, Result};

/// The Kubernetes version Debian's `kubernetes` source package carries (bookworm).
pub const VERSION: &str = "v1.20.2";
/// Where builds are cached, one directory per version.
pub const ROOT: &str = "/var/tmp/lifeline-k8s";
/// The Go binaries built from the source tree (`cmd/NAME`).
pub const GO_BINARIES: [&str; 5] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kube-proxy",
    "kubelet",
];
/// The pause binary (`build/pause/linux/pause.c`, static): the pod sandbox image's only file.
pub const PAUSE: &str = "pause";

/// Debian packages the real-cluster tier and the node need (some may already be installed).
pub const APT_PACKAGES: [&str; 13] = [
    "golang-go",
    "dpkg-dev",
    "gcc",
    "libc6-dev",
    "etcd-server",
    "containerd",
    "runc",
    "containernetworking-plugins",
    "conntrack",
    // kube-proxy --cleanup also clears the ipvs mode's sets, and fails without the tool.
    "ipset",
    "iptables",
    "openjdk-17-jdk-headless",
    "python3-kubernetes",
];

/// `/var/tmp/lifeline-k8s/v1.20.2`
pub fn dir() -> PathBuf {
    Path::new(ROOT).join(VERSION)
}

/// `<dir>/bin`: the binaries.
pub fn bin_dir() -> PathBuf {
    dir().join("bin")
}

/// The stamp's content: what a complete build holds. A different recipe means a rebuild.
fn recipe() -> String {
    format!(
        "kubernetes {VERSION} from Debian's source package\ngo: {}\nc: {PAUSE}\nldflags: {}\n",
        GO_BINARIES.join(" "),
        ldflags()
    )
}

fn stamp() -> PathBuf {
    dir().join("COMPLETE")
}

/// True when the stamp matches the recipe and every binary is there.
pub fn is_built() -> bool {
    fs::read_to_string(stamp()).is_ok_and(|s| s == recipe())
        && GO_BINARIES
            .iter()
            .chain([&PAUSE])
            .all(|b| bin_dir().join(b).is_file())
}

/// The steps of the build, named in errors.
#[derive(Clone, Copy, Debug)]
enum Step {
    Lock,
    AptSources,
    AptUpdate,
    Download,
    Unpack,
    GoPath,
    OpenApiGenBuild,
    OpenApiGen,
    GoBuild,
    Pause,
    Install,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::Lock => "taking the build lock",
            Step::AptSources => "deriving deb-src entries for a private APT_CONFIG",
            Step::AptUpdate => "apt-get update (private lists, deb-src)",
            Step::Download => "apt-get source --download-only kubernetes",
            Step::Unpack => "dpkg-source -x (unpacking the source package)",
            Step::GoPath => "laying out the GOPATH",
            Step::OpenApiGenBuild => "building openapi-gen",
            Step::OpenApiGen => "generating pkg/generated/openapi",
            Step::GoBuild => "go build of the Kubernetes binaries",
            Step::Pause => "gcc -static of the pause binary",
            Step::Install => "installing the binaries and the stamp",
        })
    }
}

impl Step {
    fn fail(self, what: impl fmt::Display) -> Failed {
        Failed(format!("kubernetes {VERSION}: {self} failed: {what}"))
    }

    fn run(self, cmd: &mut Command) -> Result {
        crate::run(cmd).map_err(|Failed(e)| self.fail(e))
    }

    fn io<T>(self, path: &Path, r: std::io::Result<T>) -> Result<T> {
        r.map_err(|e| self.fail(format!("{}: {e}", path.display())))
    }
}

/// Installs the packages, then builds the binaries unless a complete build is cached.
pub fn setup() -> Result {
    crate::setup::apt(&APT_PACKAGES)?;
    if is_built() {
        eprintln!("kubernetes: {VERSION} binaries cached in {}", bin_dir().display());
        return Ok(());
    }
    fs::create_dir_all(ROOT).map_err(|e| Step::Lock.fail(format!("{ROOT}: {e}")))?;
    let _lock = Lock::take(&Path::new(ROOT).join("build.lock"))?;
    // Someone else may have finished the build while we waited for the lock.
    if is_built() {
        return Ok(());
    }
    let started = Instant::now();
    build()?;
    eprintln!(
        "kubernetes: built {} and {PAUSE} in {:.0} s (cold: source download and unpacking included) into {}",
        GO_BINARIES.join(", "),
        started.elapsed().as_secs_f64(),
        bin_dir().display()
    );
    Ok(())
}

fn build() -> Result {
    let work = dir().join("work");
    // The tree sits in its GOPATH place itself: through a symlink, the go tool would see the
    // resolved working directory, outside GOPATH, and find no vendored package.
    let gopath = work.join("gopath");
    let checkout = gopath.join("src/k8s.io/kubernetes");
    let source = checkout.as_path();
    // Written once the tree is unpacked and checked: an interrupted unpack is done again.
    let unpacked = work.join("source-unpacked");
    if !unpacked.is_file() {
        let parent = checkout.parent().expect("has a parent");
        Step::GoPath.io(parent, fs::create_dir_all(parent))?;
        fetch_source(&work, source)?;
        Step::Unpack.io(&unpacked, fs::write(&unpacked, VERSION))?;
    }
    let go = |step: Step| GoEnv {
        step,
        gopath: &gopath,
        checkout: &checkout,
    };
    openapi(&go(Step::OpenApiGenBuild), &go(Step::OpenApiGen), source, &work)?;
    let staging = work.join("bin");
    let _ = fs::remove_dir_all(&staging);
    Step::GoBuild.io(&staging, fs::create_dir_all(&staging))?;
    let mut cmd = go(Step::GoBuild).command();
    cmd.args(["build", "-tags", "selinux,notest", "-ldflags", &ldflags(), "-o"])
        .arg(format!("{}/", staging.display()))
        .args(GO_BINARIES.map(|b| format!("./cmd/{b}")));
    Step::GoBuild.run(&mut cmd)?;
    Step::Pause.run(
        Command::new("gcc")
            .args([
                "-Os",
                "-Wall",
                "-Werror",
                "-static",
                "-DVERSION=v3.4-lifeline",
                "-o",
            ])
            .arg(staging.join(PAUSE))
            .arg(source.join("build/pause/linux/pause.c")),
    )?;
    let bin = bin_dir();
    let _ = fs::remove_dir_all(&bin);
    Step::Install.io(&bin, fs::rename(&staging, &bin))?;
    Step::Install.io(&stamp(), fs::write(stamp(), recipe()))
}

/// `apt-get source kubernetes` into `work`, unpacked (Debian's patches applied) at `source`.
fn fetch_source(work: &Path, source: &Path) -> Result {
    let apt = work.join("apt");
    for sub in ["sources.list.d", "lists/partial", "cache/archives/partial"] {
        let d = apt.join(sub);
        Step::AptSources.io(&d, fs::create_dir_all(&d))?;
    }
    let stanzas = deb_src_from(Path::new("/etc/apt/sources.list.d"))?;
    let src_file = apt.join("sources.list.d/lifeline-deb-src.sources");
    Step::AptSources.io(&src_file, fs::write(&src_file, stanzas))?;
    let empty = apt.join("sources.list");
    Step::AptSources.io(&empty, fs::write(&empty, ""))?;
    let conf = apt.join("apt.conf");
    let text = format!(
        "Dir::Etc::sourcelist \"{a}/sources.list\";\nDir::Etc::sourceparts \"{a}/sources.list.d\";\n\
Dir::State::Lists \"{a}/lists\";\nDir::Cache \"{a}/cache\";\nAPT::Sandbox::User \"root\";\n",
        a = apt.display()
    );
    Step::AptSources.io(&conf, fs::write(&conf, text))?;
    let apt_get = || {
        let mut cmd = Command::new("apt-get");
        cmd.env("APT_CONFIG", &conf).current_dir(work);
        cmd
    };
    Step::AptUpdate.run(apt_get().args(["update", "-qq"]))?;
    let downloads = work.join("download");
    let _ = fs::remove_dir_all(&downloads);
    Step::Download.io(&downloads, fs::create_dir_all(&downloads))?;
    Step::Download.run(apt_get().current_dir(&downloads).args([
        "source",
        "--download-only",
        "-qq",
        "kubernetes",
    ]))?;
    let dsc = Step::Unpack
        .io(&downloads, fs::read_dir(&downloads))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "dsc"))
        .ok_or_else(|| Step::Unpack.fail(format!("no .dsc in {}", downloads.display())))?;
    let _ = fs::remove_dir_all(source);
    Step::Unpack.run(Command::new("dpkg-source").arg("-x").arg(&dsc).arg(source))?;
    let changelog = source.join("debian/changelog");
    let first = Step::Unpack.io(&changelog, fs::read_to_string(&changelog))?;
    let found = upstream_version(first.lines().next().unwrap_or(""));
    if found != Some(VERSION.trim_start_matches('v')) {
        return Err(Step::Unpack.fail(format!(
            "{} is Kubernetes {found:?}, not {VERSION} (first line of {})",
            dsc.display(),
            changelog.display()
        )));
    }
    let _ = fs::remove_dir_all(&downloads);
    Ok(())
}

/// deb-src entries for every `Types: deb` entry of the deb822 files (`*.sources`) in `parts`.
fn deb_src_from(parts: &Path) -> Result<String> {
    crate::debian::from_sources(parts, |text| crate::debian::stanzas(text, "deb-src", None))
        .map_err(|Failed(why)| Step::AptSources.fail(why))
}

/// The upstream version of a `debian/changelog` entry line: `kubernetes (1.20.5+really1.20.2-1.1)
/// bookworm; ...` → `1.20.2` (Debian's `+really` marks a version rolled back to an older one).
fn upstream_version(line: &str) -> Option<&str> {
    let version = line.split_once('(')?.1.split_once(')')?.0;
    let version = version.rsplit_once("really").map_or(version, |(_, v)| v);
    let version = version.split_once(':').map_or(version, |(_, v)| v);
    Some(version.rsplit_once('-').map_or(version, |(v, _)| v))
}

/// The go tool in the GOPATH layout the tree builds in.
struct GoEnv<'a> {
    step: Step,
    gopath: &'a Path,
    checkout: &'a Path,
}

impl GoEnv<'_> {
    fn command(&self) -> Command {
        self.command_of(Path::new("go"))
    }

    /// `program` run in the checkout with the GOPATH environment (openapi-gen loads packages
    /// through go/build too).
    fn command_of(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        cmd.current_dir(self.checkout)
            .env("GOPATH", self.gopath)
            .env("GO111MODULE", "off")
            .env("GOFLAGS", "")
            .env("CGO_ENABLED", "0")
            // Kept across builds: an interrupted build resumes where it stopped.
            .env("GOCACHE", Path::new(ROOT).join("gocache"));
        cmd
    }

    fn run(&self, args: &[&str]) -> Result {
        self.step.run(self.command().args(args))
    }
}

/// `pkg/generated/openapi/zz_generated.openapi.go`, as the Makefile's `gen_openapi` makes it
/// for the `KUBE` target: every package with a `+k8s:openapi-gen=` tag outside `vendor/`
/// (staging included, under its vendor name), but code-generator and sample-apiserver.
fn openapi(build: &GoEnv, generate: &GoEnv, source: &Path, work: &Path) -> Result {
    let out = source.join("pkg/generated/openapi/zz_generated.openapi.go");
    if out.is_file() {
        return Ok(());
    }
    let tool = work.join("openapi-gen");
    build.run(&[
        "build",
        "-o",
        &tool.display().to_string(),
        "./vendor/k8s.io/kube-openapi/cmd/openapi-gen",
    ])?;
    let dirs = openapi_dirs(source).map_err(|e| generate.step.fail(e))?;
    if dirs.is_empty() {
        return Err(generate.step.fail(format!(
            "no package with a +k8s:openapi-gen= tag under {}",
            source.display()
        )));
    }
    let inputs: Vec<String> = dirs.iter().map(|d| format!("k8s.io/kubernetes/{d}")).collect();
    let report = work.join("openapi-violations.report");
    let mut cmd = generate.command_of(&tool);
    cmd.args(["--logtostderr", "-i", &inputs.join(",")])
        .args(["-p", "k8s.io/kubernetes/pkg/generated/openapi"])
        .args(["-O", "zz_generated.openapi"])
        .args(["-h", "hack/boilerplate/boilerplate.generatego.txt"])
        .arg("-r")
        .arg(&report);
    generate.step.run(&mut cmd)?;
    if !out.is_file() {
        return Err(generate
            .step
            .fail(format!("openapi-gen wrote no {}", out.display())));
    }
    Ok(())
}

/// The directories (relative to the tree, `staging/src/` shown as `vendor/`) holding a Go file
/// with a `// +k8s:` tag line and a `+k8s:openapi-gen=` tag, as the Makefile finds them.
fn openapi_dirs(source: &Path) -> std::result::Result<Vec<String>, String> {
    let mut dirs = std::collections::BTreeSet::new();
    let mut stack = vec![source.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = fs::read_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        for entry in entries.filter_map(|e| e.ok()) {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let file_type = entry
                .file_type()
                .map_err(|e| format!("{}: {e}", path.display()))?;
            if file_type.is_dir() {
                let top = d == source;
                if !(top && (name.starts_with('_') || name.starts_with('.') || name == "vendor")) {
                    stack.push(path);
                }
            } else if name.ends_with(".go") {
                let text = fs::read_to_string(&path).unwrap_or_default();
                if has_openapi_tag(&text) {
                    let rel = d
                        .strip_prefix(source)
                        .expect("under the source")
                        .to_string_lossy();
                    let rel = match rel.strip_prefix("staging/src/") {
                        Some(r) => format!("vendor/{r}"),
                        None => rel.into_owned(),
                    };
                    if !(rel.starts_with("vendor/k8s.io/code-generator/")
                        || rel.starts_with("vendor/k8s.io/sample-apiserver/"))
                    {
                        dirs.insert(rel);
                    }
                }
            }
        }
    }
    Ok(dirs.into_iter().collect())
}

/// A file the Makefile feeds to openapi-gen: a line `^// *+k8s:` and the text
/// `+k8s:openapi-gen=` anywhere.
fn has_openapi_tag(text: &str) -> bool {
    text.contains("+k8s:openapi-gen=")
        && text.lines().any(|l| {
            l.strip_prefix("//")
                .is_some_and(|r| r.trim_start_matches(' ').starts_with("+k8s:"))
        })
}

/// `-s -w` and the version variables `hack/lib/version.sh` sets, for component-base and
/// client-go (vendored: in GOPATH mode their import paths sit under k8s.io/kubernetes/vendor).
fn ldflags() -> String {
    let (major, minor) = {
        let mut parts = VERSION.trim_start_matches('v').split('.');
        (parts.next().unwrap_or("1"), parts.next().unwrap_or("0"))
    };
    let mut flags = vec!["-s".to_owned(), "-w".to_owned()];
    for package in ["component-base/version", "client-go/pkg/version"] {
        let p = format!("k8s.io/kubernetes/vendor/k8s.io/{package}");
        for (key, value) in [
            ("gitVersion", VERSION),
            ("gitMajor", major),
            ("gitMinor", minor),
            ("gitTreeState", "clean"),
            ("buildDate", "1970-01-01T00:00:00Z"),
        ] {
            flags.push(format!("-X {p}.{key}={value}"));
        }
    }
    flags.join(" ")
}

/// An exclusive `flock` on a file, released on drop.
struct Lock(fs::File);

impl Lock {
    fn take(path: &Path) -> Result<Lock> {
        let file = Step::Lock.io(
            path,
            fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(path),
        )?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(Step::Lock.fail(format!("{}: {}", path.display(), std::io::Error::last_os_error())));
        }
        Ok(Lock(file))
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_without_deb_entries_fail_naming_the_step() {
        let dir = std::env::temp_dir().join(format!("ll-xtask-sources-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("only.list"), "deb http://x y main\n").unwrap();
        let Err(Failed(e)) = deb_src_from(&dir) else {
            panic!("no deb822 entry must fail")
        };
        assert!(
            e.contains("deriving deb-src entries") && e.contains("no `Types: deb` entry"),
            "{e}"
        );
        fs::write(
            dir.join("debian.sources"),
            "Types: deb\nURIs: http://x\nSuites: s\nComponents: main\n",
        )
        .unwrap();
        assert!(deb_src_from(&dir).is_ok_and(|s| s.starts_with("Types: deb-src\n")));
        let Err(Failed(e)) = deb_src_from(&dir.join("missing")) else {
            panic!("a missing directory must fail")
        };
        assert!(e.contains("missing"), "{e}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn upstream_version_of_a_changelog_entry() {
        let v = |l| upstream_version(l);
        assert_eq!(
            v("kubernetes (1.20.5+really1.20.2-1.1+deb12u1) bookworm; urgency=medium"),
            Some("1.20.2")
        );
        assert_eq!(
            v("kubernetes (1.28.3-1) unstable; urgency=medium"),
            Some("1.28.3")
        );
        assert_eq!(v("golang-defaults (2:1.19~1) unstable"), Some("1.19~1"));
        assert_eq!(v("garbage"), None);
    }

    #[test]
    fn openapi_tags_are_found_as_the_makefile_finds_them() {
        assert!(has_openapi_tag("package v1\n// +k8s:openapi-gen=true\n"));
        assert!(has_openapi_tag(
            "//+k8s:deepcopy-gen=package\n// x +k8s:openapi-gen=false\n"
        ));
        assert!(!has_openapi_tag("// +k8s:deepcopy-gen=package\n"));
        assert!(!has_openapi_tag("/* +k8s:openapi-gen=true */\n"));
    }

    #[test]
    fn ldflags_stamp_both_version_packages() {
        let f = ldflags();
        assert!(f.starts_with("-s -w "), "{f}");
        for p in ["component-base/version", "client-go/pkg/version"] {
            assert!(
                f.contains(&format!(
                    "-X k8s.io/kubernetes/vendor/k8s.io/{p}.gitVersion=v1.20.2"
                )),
                "{f}"
            );
            assert!(f.contains(&format!("k8s.io/{p}.gitMinor=20")), "{f}");
        }
    }
}
