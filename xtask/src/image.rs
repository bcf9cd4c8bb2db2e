//! `cargo xtask image`: the agent's container image as an OCI image archive, built without a
//! container engine.
//!
//! The agent is linked statically (glibc's static libc: `-C target-feature=+crt-static`; no musl
//! toolchain is needed), so the image holds one layer with only what the binary uses:
//!
//! | path | why |
//! | --- | --- |
//! | `/usr/local/bin/lifeline` | the agent; the entrypoint, and on `PATH` for `kubectl exec ... -- lifeline status` |
//! | `/etc/ssl/certs/ca-certificates.crt` | public CAs (the build machine's Debian bundle), for https receivers and kubeconfigs that name no CA |
//! | `/etc/nsswitch.conf` | `hosts: files dns`: without it glibc asks DNS before `/etc/hosts` |
//!
//! The same files are staged in `target/image/rootfs/` for `Containerfile`.
//!
//! The archive is an OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/…`) that also
//! carries Docker's `manifest.json`, so `ctr images import`, `podman load`, `docker load` and
//! `skopeo copy oci-archive:` all read it. Entries, timestamps (the commit's time) and
//! compression are deterministic: one commit gives one archive.
use std::{
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use flate2::{write::GzEncoder, Compression, GzBuilder};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::{cargo, run, show, workspace, Failed, Result};

/// The repository the manifests name (deploy/daemonset.yaml); the local name replaces it.
pub const REGISTRY_NAME: &str = "ghcr.io/lifeline-dev/lifeline";
/// Where an image built here is named when it is imported on a node (deploy/local/).
pub const LOCAL_NAME: &str = "localhost/lifeline";
/// Where the agent sits in the image.
const BINARY_PATH: &str = "usr/local/bin/lifeline";
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const MEDIA_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// What `cargo xtask image` was asked for.
#[derive(Default)]
pub struct Options {
    pub out: Option<PathBuf>,
    /// Image names (`repo:tag`); default `localhost/lifeline:<version>`.
    pub names: Vec<String>,
    /// Use the binary already built.
    pub no_build: bool,
    /// Import the archive into a private containerd and run the binary from it.
    pub verify: bool,
}

/// Builds the image; returns where the archive was written.
pub fn image(options: Options) -> Result<PathBuf> {
    let target = host_target()?;
    let arch = oci_arch(&target)?;
    if !options.no_build {
        let linker = Command::new("bpf-linker").arg("--version").output();
        if !linker.is_ok_and(|o| o.status.success()) {
            // A fresh machine: the eBPF toolchain first (as `cargo xtask setup` installs it).
            crate::setup::toolchain()?;
        }
        build_static(&target)?;
    }
    let binary = static_binary(&target);
    ensure_static(&binary)?;
    let (version, revision) = binary_version(&binary)?;
    let expected = env!("CARGO_PKG_VERSION");
    if version != expected {
        return Err(Failed(format!(
            "{} says version {version}, the workspace is {expected}: rebuild without --no-build",
            binary.display()
        )));
    }
    let names = if options.names.is_empty() {
        vec![format!("{LOCAL_NAME}:{version}")]
    } else {
        options.names.clone()
    };
    for name in &names {
        tag_of(name)?;
    }
    let created = commit_time()?;
    let files = vec![
        LayerFile::new(BINARY_PATH, 0o755, read(&binary)?),
        LayerFile::new(
            CA_BUNDLE.trim_start_matches('/'),
            0o644,
            read(Path::new(CA_BUNDLE))?,
        ),
        LayerFile::new("etc/nsswitch.conf", 0o644, b"hosts: files dns\n".to_vec()),
    ];
    let spec = ImageSpec {
        arch,
        version: &version,
        revision: &revision,
        created: &created,
        names: &names,
    };
    stage_rootfs(&files)?;
    let archive = spec.archive(&files)?;
    let out = options.out.clone().unwrap_or_else(|| {
        workspace()
            .join("target/image")
            .join(format!("lifeline-{version}-{arch}.tar"))
    });
    if let Some(dir) = out.parent() {
        fs::create_dir_all(dir).map_err(|e| Failed(format!("{}: {e}", dir.display())))?;
    }
    fs::write(&out, &archive.bytes).map_err(|e| Failed(format!("{}: {e}", out.display())))?;
    eprintln!(
        "image: {} ({:.1} MiB, {arch}, lifeline {version} rev {revision})\n  names: {}\n  manifest {}\n  import on a node:  ctr -n k8s.io images import {}\n  or:               podman load -i … | docker load -i … | skopeo copy oci-archive:… docker://REGISTRY/lifeline:{version}",
        out.display(),
        archive.bytes.len() as f64 / (1024.0 * 1024.0),
        names.join(", "),
        archive.manifest_digest,
        out.display(),
    );
    if options.verify {
        verify(&out, &names[0], &version, &revision)?;
    }
    Ok(out)
}

/// Where the layer's files are also written, for `Containerfile` (docker/podman/buildah).
pub const ROOTFS: &str = "target/image/rootfs";

/// Writes the layer's files under [`ROOTFS`] (replacing what was there).
fn stage_rootfs(files: &[LayerFile]) -> Result {
    let root = workspace().join(ROOTFS);
    let _ = fs::remove_dir_all(&root);
    for file in files {
        let path = root.join(&file.path);
        let dir = path.parent().expect("files sit in directories");
        fs::create_dir_all(dir).map_err(|e| Failed(format!("{}: {e}", dir.display())))?;
        fs::write(&path, &file.data).map_err(|e| Failed(format!("{}: {e}", path.display())))?;
        fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(file.mode))
            .map_err(|e| Failed(format!("{}: {e}", path.display())))?;
    }
    Ok(())
}

/// `rustc -vV`'s host triple: the image is for the machine it is built on.
pub(crate) fn host_target() -> Result<String> {
    let out = output(Command::new("rustc").arg("-vV"))?;
    out.lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_owned)
        .ok_or_else(|| Failed("rustc -vV names no host triple".into()))
}

fn oci_arch(target: &str) -> Result<&'static str> {
    match target.split('-').next() {
        Some("x86_64") => Ok("amd64"),
        Some("aarch64") => Ok("arm64"),
        _ => Err(Failed(format!(
            "no image architecture for the target {target} (x86_64 and aarch64 are known)"
        ))),
    }
}

/// `cargo build --release` for the host triple named explicitly, with glibc linked in: the
/// explicit `--target` keeps the static flag off build scripts and off the eBPF build.
pub(crate) fn build_static(target: &str) -> Result {
    let var = format!(
        "CARGO_TARGET_{}_RUSTFLAGS",
        target.to_uppercase().replace('-', "_")
    );
    run(cargo().env(var, "-C target-feature=+crt-static").args([
        "build",
        "--release",
        "-p",
        "lifeline",
        "--target",
        target,
    ]))
}

pub(crate) fn static_binary(target: &str) -> PathBuf {
    workspace().join("target").join(target).join("release/lifeline")
}

/// Fails unless `binary` is an ELF executable without a program interpreter (`PT_INTERP`): a
/// dynamically linked one would not start in an image without a C library.
pub(crate) fn ensure_static(binary: &Path) -> Result {
    let bytes = read(binary)?;
    match elf_interpreter(&bytes) {
        Ok(None) => Ok(()),
        Ok(Some(interp)) => Err(Failed(format!(
            "{} is dynamically linked (interpreter {interp}): the image has no C library; build it with `cargo xtask image` (without --no-build)",
            binary.display()
        ))),
        Err(why) => Err(Failed(format!("{}: {why}", binary.display()))),
    }
}

/// The program interpreter a 64-bit little-endian ELF file asks for, if any.
fn elf_interpreter(elf: &[u8]) -> std::result::Result<Option<String>, String> {
    const PT_INTERP: u32 = 3;
    if elf.len() < 64 || &elf[..4] != b"\x7fELF" {
        return Err("not an ELF file".into());
    }
    if elf[4] != 2 || elf[5] != 1 {
        return Err("not a 64-bit little-endian ELF file".into());
    }
    let u16_at = |at: usize| {
        elf.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
    };
    let u64_at = |at: usize| {
        elf.get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize)
    };
    let truncated = || "truncated ELF program headers".to_owned();
    let phoff = u64_at(0x20).ok_or_else(truncated)?;
    let phentsize = u16_at(0x36).ok_or_else(truncated)?;
    let phnum = u16_at(0x38).ok_or_else(truncated)?;
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        let p_type = elf
            .get(ph..ph + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .ok_or_else(truncated)?;
        if p_type == PT_INTERP {
            let offset = u64_at(ph + 8).ok_or_else(truncated)?;
            let size = u64_at(ph + 32).ok_or_else(truncated)?;
            let name = elf.get(offset..offset + size).ok_or_else(truncated)?;
            return Ok(Some(
                String::from_utf8_lossy(name).trim_end_matches('\0').to_owned(),
            ));
        }
    }
    Ok(None)
}

/// `lifeline --version` → (version, revision): the labels then say what the binary says.
fn binary_version(binary: &Path) -> Result<(String, String)> {
    let out = output(Command::new(binary).arg("--version"))?;
    parse_version(out.trim()).ok_or_else(|| {
        Failed(format!(
            "{} --version printed {out:?}, not `lifeline VERSION (rev REVISION)`",
            binary.display()
        ))
    })
}

fn parse_version(line: &str) -> Option<(String, String)> {
    let rest = line.strip_prefix("lifeline ")?;
    let (version, rev) = rest.split_once(" (rev ")?;
    Some((version.to_owned(), rev.strip_suffix(')')?.to_owned()))
}

/// The commit's time, UTC, RFC 3339: the image's `created` and every file's mtime.
fn commit_time() -> Result<(i64, String)> {
    let out = output(
        Command::new("git")
            .current_dir(workspace())
            .env("TZ", "UTC")
            .args([
                "log",
                "-1",
                "--format=%ct %cd",
                "--date=format-local:%Y-%m-%dT%H:%M:%SZ",
            ]),
    )?;
    let (epoch, date) = out
        .trim()
        .split_once(' ')
        .ok_or_else(|| Failed(format!("git log printed {out:?}")))?;
    let epoch = epoch
        .parse()
        .map_err(|_| Failed(format!("git log printed {out:?}")))?;
    Ok((epoch, date.to_owned()))
}

/// The tag of `repo:tag` (a digest reference or a name without a tag is refused).
fn tag_of(name: &str) -> Result<&str> {
    let last = name.rsplit('/').next().unwrap_or(name);
    match last.split_once(':') {
        Some((_, tag)) if !tag.is_empty() && !name.contains('@') => Ok(tag),
        _ => Err(Failed(format!(
            "image name {name:?}: expected REPOSITORY:TAG (e.g. {LOCAL_NAME}:{})",
            env!("CARGO_PKG_VERSION")
        ))),
    }
}

/// One regular file of the layer.
struct LayerFile {
    path: String,
    mode: u32,
    data: Vec<u8>,
}

impl LayerFile {
    fn new(path: &str, mode: u32, data: Vec<u8>) -> Self {
        Self {
            path: path.to_owned(),
            mode,
            data,
        }
    }
}

/// What the JSON documents say about the image.
struct ImageSpec<'a> {
    arch: &'static str,
    version: &'a str,
    revision: &'a str,
    /// (seconds since the epoch, RFC 3339)
    created: &'a (i64, String),
    names: &'a [String],
}

/// A finished archive.
struct Archive {
    bytes: Vec<u8>,
    manifest_digest: String,
}

/// A content-addressed blob.
struct Blob {
    digest: String,
    bytes: Vec<u8>,
}

impl Blob {
    fn new(bytes: Vec<u8>) -> Self {
        Self {
            digest: sha256(&bytes),
            bytes,
        }
    }

    fn json(value: &serde_json::Value) -> Self {
        Self::new(serde_json::to_vec(value).expect("JSON values serialize"))
    }

    fn descriptor(&self, media_type: &str) -> serde_json::Value {
        json!({ "mediaType": media_type, "digest": self.digest, "size": self.bytes.len() })
    }

    fn path(&self) -> String {
        format!("blobs/sha256/{}", self.digest.trim_start_matches("sha256:"))
    }
}

fn sha256(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

impl ImageSpec<'_> {
    fn labels(&self) -> serde_json::Value {
        json!({
            "org.opencontainers.image.title": "lifeline",
            "org.opencontainers.image.description": "Node agent that watches every controller's connection to the Kubernetes apiserver from the kernel",
            "org.opencontainers.image.version": self.version,
            "org.opencontainers.image.revision": self.revision,
            "org.opencontainers.image.created": self.created.1,
            "org.opencontainers.image.licenses": "Apache-2.0",
        })
    }

    fn archive(&self, files: &[LayerFile]) -> Result<Archive> {
        let layer_tar = tarball(&layer_entries(files), self.created.0)?;
        let diff_id = sha256(&layer_tar);
        let layer = Blob::new(gzip(&layer_tar)?);
        let config = Blob::json(&json!({
            "created": self.created.1,
            "architecture": self.arch,
            "os": "linux",
            "config": {
                "Entrypoint": [format!("/{BINARY_PATH}")],
                "Cmd": ["run"],
                "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
                "WorkingDir": "/",
                "Labels": self.labels(),
            },
            "rootfs": { "type": "layers", "diff_ids": [diff_id] },
            "history": [{ "created": self.created.1, "created_by": "cargo xtask image" }],
        }));
        let manifest = Blob::json(&json!({
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": config.descriptor(MEDIA_CONFIG),
            "layers": [layer.descriptor(MEDIA_LAYER)],
            "annotations": self.labels(),
        }));
        // One index entry per name: containerd names each imported image after
        // `io.containerd.image.name`; OCI tools use the tag in `ref.name`.
        let entries: Vec<serde_json::Value> = self
            .names
            .iter()
            .map(|name| {
                let mut d = manifest.descriptor(MEDIA_MANIFEST);
                d["platform"] = json!({ "architecture": self.arch, "os": "linux" });
                d["annotations"] = json!({
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": tag_of(name).expect("checked before"),
                });
                d
            })
            .collect();
        let index = json!({ "schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": entries });
        // Docker before 25 reads only this file; newer Docker, podman and containerd prefer the
        // index. Both point at the same blobs.
        let docker = json!([{
            "Config": config.path(),
            "RepoTags": self.names,
            "Layers": [layer.path()],
        }]);
        let mut entries = vec![
            Entry::file("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(), 0o644),
            Entry::file("index.json", json_bytes(&index), 0o644),
            Entry::file("manifest.json", json_bytes(&docker), 0o644),
            Entry::dir("blobs"),
            Entry::dir("blobs/sha256"),
        ];
        let manifest_digest = manifest.digest.clone();
        for blob in [config, manifest, layer] {
            entries.push(Entry::file(&blob.path(), blob.bytes, 0o644));
        }
        Ok(Archive {
            bytes: tarball(&entries, self.created.0)?,
            manifest_digest,
        })
    }
}

fn json_bytes(value: &serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(value).expect("JSON values serialize")
}

/// One tar entry: a directory (`data` None) or a regular file.
struct Entry {
    path: String,
    mode: u32,
    data: Option<Vec<u8>>,
}

impl Entry {
    fn dir(path: &str) -> Self {
        Self {
            path: path.to_owned(),
            mode: 0o755,
            data: None,
        }
    }

    fn file(path: &str, data: Vec<u8>, mode: u32) -> Self {
        Self {
            path: path.to_owned(),
            mode,
            data: Some(data),
        }
    }
}

/// The layer's entries: every parent directory once, before its contents, in path order.
fn layer_entries(files: &[LayerFile]) -> Vec<Entry> {
    let mut dirs = std::collections::BTreeSet::new();
    for file in files {
        let mut parent = Path::new(&file.path).parent();
        while let Some(dir) = parent.filter(|d| !d.as_os_str().is_empty()) {
            dirs.insert(dir.to_string_lossy().into_owned());
            parent = dir.parent();
        }
    }
    let mut entries: Vec<Entry> = dirs.iter().map(|d| Entry::dir(d)).collect();
    entries.extend(files.iter().map(|f| Entry::file(&f.path, f.data.clone(), f.mode)));
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    entries
}

/// A ustar archive of `entries`, owned by root, all with modification time `mtime`.
fn tarball(entries: &[Entry], mtime: i64) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        let mut header = tar::Header::new_ustar();
        header.set_mode(entry.mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(u64::try_from(mtime).unwrap_or(0));
        header
            .set_username("root")
            .and_then(|()| header.set_groupname("root"))
            .map_err(|e| Failed(format!("tar header: {e}")))?;
        let (path, data): (String, &[u8]) = match &entry.data {
            None => {
                header.set_entry_type(tar::EntryType::Directory);
                (format!("{}/", entry.path), &[])
            }
            Some(data) => {
                header.set_entry_type(tar::EntryType::Regular);
                (entry.path.clone(), data)
            }
        };
        header.set_size(data.len() as u64);
        builder
            .append_data(&mut header, &path, data)
            .map_err(|e| Failed(format!("tar entry {path}: {e}")))?;
    }
    builder
        .into_inner()
        .map_err(|e| Failed(format!("finishing a tar archive: {e}")))
}

/// gzip without a file name or time stamp in its header (reproducible).
fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    let mut encoder: GzEncoder<Vec<u8>> = GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), Compression::default());
    encoder
        .write_all(bytes)
        .and_then(|()| encoder.finish())
        .map_err(|e| Failed(format!("gzip: {e}")))
}

fn read(path: &Path) -> Result<Vec<u8>> {
    fs::read(path).map_err(|e| Failed(format!("{}: {e}", path.display())))
}

/// What `cmd` printed on stdout; an error naming it, its status and its stderr if it failed.
pub(crate) fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().map_err(|e| Failed(format!("{}: {e}", show(cmd))))?;
    if !out.status.success() {
        return Err(Failed(format!(
            "{} exited with {}: {}",
            show(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A containerd of our own (own root, state and socket in a temporary directory), stopped and
/// removed on drop.
struct PrivateContainerd {
    dir: PathBuf,
    child: Child,
}

impl PrivateContainerd {
    fn start() -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("lifeline-image-verify-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).map_err(|e| Failed(format!("{}: {e}", dir.display())))?;
        // No CRI plugin: nothing but the image store, the snapshotter and the runtime.
        let config = dir.join("config.toml");
        fs::write(
            &config,
            "version = 2\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n",
        )
        .map_err(|e| Failed(format!("{}: {e}", config.display())))?;
        let log = fs::File::create(dir.join("containerd.log"))
            .map_err(|e| Failed(format!("{}: {e}", dir.display())))?;
        let mut cmd = Command::new("containerd");
        cmd.arg("--config")
            .arg(&config)
            .arg("--root")
            .arg(dir.join("root"))
            .arg("--state")
            .arg(dir.join("state"))
            .arg("--address")
            .arg(dir.join("containerd.sock"))
            .stdout(Stdio::null())
            .stderr(log);
        let child = cmd
            .spawn()
            .map_err(|e| Failed(format!("{}: {e} (apt-get install containerd)", show(&cmd))))?;
        let containerd = Self { dir, child };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !containerd.socket().exists() {
            if Instant::now() > deadline {
                return Err(Failed(format!(
                    "containerd did not open {} within 20 s (log: {})",
                    containerd.socket().display(),
                    containerd.dir.join("containerd.log").display()
                )));
            }
            thread::sleep(Duration::from_millis(100));
        }
        Ok(containerd)
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    fn ctr(&self) -> Command {
        let mut cmd = Command::new("ctr");
        cmd.arg("--address")
            .arg(self.socket())
            .args(["--namespace", "lifeline-verify"]);
        cmd
    }
}

impl Drop for PrivateContainerd {
    fn drop(&mut self) {
        // SAFETY: plain syscall on the pid of the child we spawned and still own.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Imports the archive into a private containerd, as a node would, and runs the image's binary
/// (`lifeline --version`) from it.
fn verify(archive: &Path, name: &str, version: &str, revision: &str) -> Result {
    let containerd = PrivateContainerd::start()?;
    run(containerd
        .ctr()
        .args(["images", "import", "--snapshotter", "native"])
        .arg(archive))?;
    let listed = output(containerd.ctr().args(["images", "ls", "-q"]))?;
    if !listed.lines().any(|l| l.trim() == name) {
        return Err(Failed(format!(
            "after the import containerd lists {listed:?}, not {name}"
        )));
    }
    let id = format!("lifeline-verify-{}", std::process::id());
    let said = output(containerd.ctr().args([
        "run",
        "--rm",
        "--snapshotter",
        "native",
        name,
        &id,
        &format!("/{BINARY_PATH}"),
        "--version",
    ]))?;
    let expected = format!("lifeline {version} (rev {revision})");
    if said.trim() != expected {
        return Err(Failed(format!(
            "the imported image's binary says {said:?}, expected {expected:?}"
        )));
    }
    eprintln!("image: verified: containerd imported {name}, and its binary says {expected:?}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_need_a_tag() {
        assert_eq!(tag_of("localhost/lifeline:0.1.0").ok(), Some("0.1.0"));
        assert_eq!(tag_of("registry:5000/team/lifeline:v1").ok(), Some("v1"));
        for bad in [
            "localhost/lifeline",
            "registry:5000/lifeline",
            "x@sha256:ab",
            "x:",
        ] {
            assert!(tag_of(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn version_line() {
        assert_eq!(
            parse_version("lifeline 0.1.0 (rev ff1b9a3d3e72-dirty)"),
            Some(("0.1.0".into(), "ff1b9a3d3e72-dirty".into()))
        );
        assert_eq!(parse_version("lifeline 0.1.0"), None);
    }

    #[test]
    fn elf_interpreter_of_dynamic_and_static_files() {
        // This test binary is dynamically linked (cargo test does not link statically).
        let me = fs::read(std::env::current_exe().expect("test binary")).expect("read test binary");
        let interp = elf_interpreter(&me).expect("an ELF file");
        assert!(
            interp.as_deref().is_some_and(|i| i.contains("ld-linux")),
            "{interp:?}"
        );
        // The same headers with the PT_INTERP entry's type changed: no interpreter.
        let mut patched = me.clone();
        let phoff = u64::from_le_bytes(patched[0x20..0x28].try_into().unwrap()) as usize;
        let size = u16::from_le_bytes([patched[0x36], patched[0x37]]) as usize;
        let count = u16::from_le_bytes([patched[0x38], patched[0x39]]) as usize;
        for i in 0..count {
            let at = phoff + i * size;
            if patched[at..at + 4] == 3u32.to_le_bytes() {
                patched[at..at + 4].copy_from_slice(&6u32.to_le_bytes());
            }
        }
        assert_eq!(elf_interpreter(&patched), Ok(None));
        assert!(elf_interpreter(b"#!/bin/sh\n").is_err());
        assert!(elf_interpreter(&me[..0x30]).is_err());
    }

    #[test]
    fn layer_lists_each_directory_once_before_its_files() {
        let files = [
            LayerFile::new("usr/local/bin/lifeline", 0o755, b"x".to_vec()),
            LayerFile::new("etc/ssl/certs/ca.crt", 0o644, b"y".to_vec()),
            LayerFile::new("etc/nsswitch.conf", 0o644, b"z".to_vec()),
        ];
        let paths: Vec<String> = layer_entries(&files)
            .iter()
            .map(|e| format!("{}{}", e.path, if e.data.is_none() { "/" } else { "" }))
            .collect();
        assert_eq!(
            paths,
            [
                "etc/",
                "etc/nsswitch.conf",
                "etc/ssl/",
                "etc/ssl/certs/",
                "etc/ssl/certs/ca.crt",
                "usr/",
                "usr/local/",
                "usr/local/bin/",
                "usr/local/bin/lifeline"
            ]
        );
    }

    /// The documents point at each other by digest and size, and one input gives one archive.
    #[test]
    fn archive_is_self_consistent_and_reproducible() {
        let names = vec![format!("{LOCAL_NAME}:9.9.9"), format!("{REGISTRY_NAME}:9.9.9")];
        let created = (1_700_000_000, "2023-11-14T22:13:20Z".to_owned());
        let spec = ImageSpec {
            arch: "amd64",
            version: "9.9.9",
            revision: "abc",
            created: &created,
            names: &names,
        };
        let files = [LayerFile::new(BINARY_PATH, 0o755, b"\x7fELF fake".to_vec())];
        let first = spec.archive(&files).expect("archive");
        let second = spec.archive(&files).expect("archive");
        assert!(first.bytes == second.bytes, "two builds of one input differ");

        let mut blobs = std::collections::HashMap::new();
        let mut tar = tar::Archive::new(first.bytes.as_slice());
        for entry in tar.entries().expect("entries") {
            let mut entry = entry.expect("entry");
            assert_eq!(entry.header().mtime().expect("mtime"), 1_700_000_000);
            let path = entry.path().expect("path").to_string_lossy().into_owned();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut data).expect("read");
            blobs.insert(path, data);
        }
        let doc = |path: &str| -> serde_json::Value {
            serde_json::from_slice(&blobs[path]).unwrap_or_else(|e| panic!("{path}: {e}"))
        };
        let blob = |descriptor: &serde_json::Value| -> Vec<u8> {
            let digest = descriptor["digest"].as_str().expect("digest");
            let bytes = blobs[&format!("blobs/sha256/{}", &digest[7..])].clone();
            assert_eq!(sha256(&bytes), digest);
            assert_eq!(descriptor["size"], bytes.len());
            bytes
        };
        let index = doc("index.json");
        let refs: Vec<&str> = index["manifests"]
            .as_array()
            .expect("manifests")
            .iter()
            .map(|m| {
                m["annotations"]["io.containerd.image.name"]
                    .as_str()
                    .expect("name")
            })
            .collect();
        assert_eq!(refs, names);
        let manifest: serde_json::Value =
            serde_json::from_slice(&blob(&index["manifests"][0])).expect("manifest");
        assert_eq!(index["manifests"][0]["digest"], first.manifest_digest);
        let config: serde_json::Value = serde_json::from_slice(&blob(&manifest["config"])).expect("config");
        assert_eq!(config["config"]["Entrypoint"], json!(["/usr/local/bin/lifeline"]));
        assert_eq!(
            config["config"]["Labels"]["org.opencontainers.image.version"],
            "9.9.9"
        );
        assert_eq!(
            config["config"]["Labels"]["org.opencontainers.image.revision"],
            "abc"
        );
        let layer = blob(&manifest["layers"][0]);
        let mut plain = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(layer.as_slice()), &mut plain)
            .expect("gunzip");
        assert_eq!(config["rootfs"]["diff_ids"][0], sha256(&plain));
        let mut layer_tar = tar::Archive::new(plain.as_slice());
        let binary = layer_tar
            .entries()
            .expect("layer entries")
            .map(|e| e.expect("layer entry"))
            .find(|e| e.path().expect("path").to_string_lossy() == BINARY_PATH)
            .expect("the binary is in the layer");
        assert_eq!(binary.header().mode().expect("mode"), 0o755);
        let docker = doc("manifest.json");
        assert_eq!(docker[0]["RepoTags"], json!(names));
        assert_eq!(
            docker[0]["Config"],
            format!(
                "blobs/sha256/{}",
                &manifest["config"]["digest"].as_str().unwrap()[7..]
            )
        );
        assert_eq!(doc("oci-layout")["imageLayoutVersion"], "1.0.0");
    }
}
