//! OCI image archives built from files on this machine, for a node without a registry:
//! `ctr -n k8s.io images import` takes an archive holding `oci-layout`, `index.json` (with the
//! `io.containerd.image.name` annotation) and the blobs. Name images `localhost/NAME:TAG`: a
//! name without a domain (`local/x`) is normalised to docker.io and pulled.
use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use ring::digest::{digest, SHA256};
use serde_json::json;

/// An image being assembled: one layer of files, an entrypoint.
pub struct Image {
    name: String,
    /// (path in the image, contents, mode)
    files: Vec<(String, Vec<u8>, u32)>,
    entrypoint: Vec<String>,
    env: Vec<String>,
}

impl Image {
    /// `name` as `localhost/NAME:TAG`.
    pub fn new(name: &str) -> Image {
        assert!(
            name.starts_with("localhost/") && name.contains(':'),
            "image name {name:?}: use localhost/NAME:TAG (other names are pulled from docker.io)"
        );
        Image {
            name: name.to_owned(),
            files: Vec::new(),
            entrypoint: Vec::new(),
            env: vec!["PATH=/bin:/usr/bin".into()],
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Adds `contents` at `path` (absolute, in the image) with `mode`.
    pub fn file(mut self, path: &str, contents: Vec<u8>, mode: u32) -> Image {
        assert!(path.starts_with('/'), "image path {path:?} must be absolute");
        self.files.push((path.to_owned(), contents, mode));
        self
    }

    /// Adds the host file `host` at `path`, executable.
    pub fn binary(self, host: &Path, path: &str) -> Image {
        let contents = fs::read(host).unwrap_or_else(|e| panic!("read {}: {e}", host.display()));
        self.file(path, contents, 0o755)
    }

    /// Adds the host program `host` at `path` and every shared library `ldd` says it needs,
    /// at their host paths (a dynamically linked program in an otherwise empty image).
    pub fn program_with_libraries(mut self, host: &Path, path: &str) -> Image {
        let out = Command::new("ldd")
            .arg(host)
            .output()
            .unwrap_or_else(|e| panic!("ldd {}: {e}", host.display()));
        for lib in ldd_paths(&String::from_utf8_lossy(&out.stdout)) {
            let contents = fs::read(&lib).unwrap_or_else(|e| panic!("read {lib}: {e}"));
            self.files.push((lib, contents, 0o755));
        }
        self.binary(host, path)
    }

    pub fn entrypoint(mut self, argv: &[&str]) -> Image {
        self.entrypoint = argv.iter().map(|a| (*a).to_owned()).collect();
        self
    }

    /// Writes the OCI archive to `path`.
    pub fn write(&self, path: &Path) -> PathBuf {
        let layer = self.layer();
        let layer_digest = sha256(&layer);
        let config = serde_json::to_vec(&json!({
            "architecture": "amd64",
            "os": "linux",
            "config": { "Entrypoint": self.entrypoint, "Env": self.env },
            "rootfs": { "type": "layers", "diff_ids": [layer_digest] },
        }))
        .expect("config JSON");
        let config_digest = sha256(&config);
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": config.len(),
            },
            "layers": [{
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": layer_digest,
                "size": layer.len(),
            }],
        }))
        .expect("manifest JSON");
        let manifest_digest = sha256(&manifest);
        let tag = self.name.rsplit(':').next().expect("a tag");
        let index = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": manifest.len(),
                "annotations": {
                    "io.containerd.image.name": self.name,
                    "org.opencontainers.image.ref.name": tag,
                },
            }],
        }))
        .expect("index JSON");
        let mut archive = Tar::default();
        archive.file("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#, 0o644);
        archive.file("index.json", &index, 0o644);
        for dir in ["blobs", "blobs/sha256"] {
            archive.dir(dir);
        }
        for blob in [&layer, &config, &manifest] {
            let hex = sha256(blob).trim_start_matches("sha256:").to_owned();
            archive.file(&format!("blobs/sha256/{hex}"), blob, 0o644);
        }
        fs::write(path, archive.finish()).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        path.to_path_buf()
    }

    /// The one layer: the files, with their parent directories.
    fn layer(&self) -> Vec<u8> {
        let mut tar = Tar::default();
        let mut dirs = BTreeSet::new();
        for (path, _, _) in &self.files {
            let mut parent = Path::new(path.trim_start_matches('/')).parent();
            while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
                dirs.insert(p.to_string_lossy().into_owned());
                parent = p.parent();
            }
        }
        for dir in &dirs {
            tar.dir(dir);
        }
        for (path, contents, mode) in &self.files {
            tar.file(path.trim_start_matches('/'), contents, *mode);
        }
        tar.finish()
    }
}

fn sha256(data: &[u8]) -> String {
    let d = digest(&SHA256, data);
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The absolute library paths in `ldd` output (`libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6
/// (0x...)`, and the loader `/lib64/ld-linux-x86-64.so.2 (0x...)`).
fn ldd_paths(ldd: &str) -> Vec<String> {
    ldd.lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| path.to_owned())
        })
        .collect()
}

/// A ustar archive writer: regular files and directories, names under 100 bytes.
#[derive(Default)]
struct Tar(Vec<u8>);

impl Tar {
    fn header(&mut self, name: &str, size: usize, mode: u32, kind: u8) {
        assert!(name.len() < 100, "tar name {name:?} too long");
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        let octal = |h: &mut [u8; 512], at: usize, width: usize, value: u64| {
            let text = format!("{value:0w$o}", w = width - 1);
            h[at..at + width - 1].copy_from_slice(text.as_bytes());
        };
        octal(&mut h, 100, 8, u64::from(mode));
        octal(&mut h, 108, 8, 0);
        octal(&mut h, 116, 8, 0);
        octal(&mut h, 124, 12, size as u64);
        octal(&mut h, 136, 12, 0);
        h[156] = kind;
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
        let text = format!("{sum:06o}\0 ");
        h[148..156].copy_from_slice(text.as_bytes());
        self.0.extend_from_slice(&h);
    }

    fn file(&mut self, name: &str, contents: &[u8], mode: u32) {
        self.header(name, contents.len(), mode, b'0');
        self.0.extend_from_slice(contents);
        let pad = (512 - contents.len() % 512) % 512;
        self.0.extend(std::iter::repeat_n(0, pad));
    }

    fn dir(&mut self, name: &str) {
        self.header(&format!("{name}/"), 0, 0o755, b'5');
    }

    fn finish(mut self) -> Vec<u8> {
        self.0.extend(std::iter::repeat_n(0, 1024));
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_is_an_oci_layout_tar_can_read() {
        let dir = std::env::temp_dir().join(format!("ll-image-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let archive = Image::new("localhost/hello:1")
            .file("/etc/hello", b"hi\n".to_vec(), 0o644)
            .entrypoint(&["/bin/hello"])
            .write(&dir.join("hello.tar"));
        let out = Command::new("tar").arg("-tvf").arg(&archive).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let listing = String::from_utf8_lossy(&out.stdout);
        for name in ["oci-layout", "index.json", "blobs/sha256/"] {
            assert!(listing.contains(name), "{name} in {listing}");
        }
        let extract = dir.join("x");
        fs::create_dir_all(&extract).unwrap();
        let out = Command::new("tar")
            .arg("-xf")
            .arg(&archive)
            .arg("-C")
            .arg(&extract)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let index: serde_json::Value =
            serde_json::from_slice(&fs::read(extract.join("index.json")).unwrap()).unwrap();
        let m = &index["manifests"][0];
        assert_eq!(m["annotations"]["io.containerd.image.name"], "localhost/hello:1");
        let digest = m["digest"].as_str().unwrap().trim_start_matches("sha256:");
        let manifest = fs::read(extract.join("blobs/sha256").join(digest)).unwrap();
        assert_eq!(
            sha256(&manifest),
            m["digest"].as_str().unwrap(),
            "blob content matches its name"
        );
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn ldd_output_gives_absolute_paths() {
        let text =
            "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\
\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            ldd_paths(text),
            ["/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"]
        );
    }

    #[test]
    #[should_panic(expected = "localhost/NAME:TAG")]
    fn names_outside_localhost_are_refused() {
        Image::new("local/x:1");
    }
}
