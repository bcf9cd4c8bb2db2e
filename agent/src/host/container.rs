//! Container and pod identity from a process's cgroup path.
//!
//! Every container runtime puts a container's processes into a cgroup whose name carries the
//! container id; the kubelet puts every pod's containers under a cgroup whose name carries the
//! pod UID. This module recognises those names. It only looks at strings: the caller reads
//! `/proc/<pid>/cgroup` (see `process.rs`).
//!
//! Layouts recognised, for cgroup v1 and v2 alike (the names are the same, only the hierarchy
//! they live in differs):
//!
//! | runtime    | cgroup driver | container component                                   |
//! |------------|---------------|-------------------------------------------------------|
//! | containerd | systemd       | `cri-containerd-<id>.scope`                           |
//! | containerd | systemd, "slice:prefix:name" left unconverted | `kubepods-…-pod<uid>.slice:cri-containerd:<id>` |
//! | containerd | cgroupfs      | bare `<id>` directly under `/kubepods/[<qos>/]pod<uid>/` |
//! | CRI-O      | systemd       | `crio-<id>.scope` (`crio-conmon-<id>.scope` is conmon, not a container) |
//! | CRI-O      | cgroupfs      | `crio-<id>` (`crio-conmon-<id>` is conmon)              |
//! | Docker     | systemd       | `docker-<id>.scope`                                   |
//! | Docker     | cgroupfs      | `/docker/<id>`                                        |
//!
//! The bare `<id>` under a kubepods pod directory is ambiguous: the cgroupfs driver of every CRI
//! runtime (containerd, and dockershim / cri-dockerd) names the container cgroup by the bare id.
//! It is reported as [`Runtime::Containerd`], the CRI default; the id itself is right either way.
//!
//! Paths are searched component by component from the end and the first component that names
//! a container wins. Components below the container's own cgroup (`init.scope`, or the
//! `system.slice/…` tree of a container that runs systemd, or cgroups a container made for
//! itself) are skipped over: a process in them is still in that container. Searching from the
//! end also makes the innermost container win when containers nest (a kind node is a Docker
//! container holding containerd containers). Components such as `..`, which appear when the
//! reader's cgroup namespace does not contain the process's cgroup, are skipped like any other
//! non-container component.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

/// Failures turning text into container identities.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes container id (`<runtime>://<id>`) had no `://` separator.
    #[error("container id {input:?} has no \"<runtime>://\" prefix")]
    NoRuntimePrefix { input: String },
    /// A Kubernetes container id named a runtime this agent does not know.
    #[error("container id {input:?} names unknown runtime {runtime:?}")]
    UnknownRuntime { input: String, runtime: String },
    /// A container id was not 64 lowercase hexadecimal characters.
    #[error("container id {input:?}: {id:?} is not 64 lowercase hex characters")]
    BadId { input: String, id: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The container runtime that created a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    Containerd,
    Crio,
    Docker,
}

impl Runtime {
    /// The lowercase name: `containerd`, `crio` or `docker` (the same as the serde form).
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Containerd => "containerd",
            Runtime::Crio => "crio",
            Runtime::Docker => "docker",
        }
    }

    /// The scheme Kubernetes uses for this runtime in `status.containerStatuses[].containerID`
    /// (`containerd://…`, `cri-o://…`, `docker://…`).
    pub fn k8s_scheme(self) -> &'static str {
        match self {
            Runtime::Containerd => "containerd",
            Runtime::Crio => "cri-o",
            Runtime::Docker => "docker",
        }
    }
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One container: which runtime made it and its id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct ContainerRef {
    /// The runtime that created the container (see the module docs for the one ambiguous case).
    pub runtime: Runtime,
    /// The full container id: exactly 64 lowercase hex characters.
    pub id: String,
}

impl ContainerRef {
    /// The id as Kubernetes writes it in `status.containerStatuses[].containerID`,
    /// e.g. `containerd://0123…`.
    #[cfg_attr(not(test), expect(dead_code, reason = "used by pod enrichment (issue 4)"))]
    pub fn k8s_container_id(&self) -> String {
        format!("{}://{}", self.runtime.k8s_scheme(), self.id)
    }
}

impl FromStr for ContainerRef {
    type Err = Error;

    /// Parses the Kubernetes form `<scheme>://<64 hex>` (`containerd`, `cri-o` or `docker`),
    /// the inverse of [`ContainerRef::k8s_container_id`].
    fn from_str(input: &str) -> Result<Self> {
        let Some((scheme, id)) = input.split_once("://") else {
            return Err(Error::NoRuntimePrefix {
                input: input.to_owned(),
            });
        };
        let runtime = match scheme {
            "containerd" => Runtime::Containerd,
            "cri-o" | "crio" => Runtime::Crio,
            "docker" => Runtime::Docker,
            _ => {
                return Err(Error::UnknownRuntime {
                    input: input.to_owned(),
                    runtime: scheme.to_owned(),
                })
            }
        };
        if !is_container_id(id) {
            return Err(Error::BadId {
                input: input.to_owned(),
                id: id.to_owned(),
            });
        }
        Ok(ContainerRef {
            runtime,
            id: id.to_owned(),
        })
    }
}

/// The container a cgroup path (as in `/proc/<pid>/cgroup`) belongs to, or `None` if the path
/// names no container (host services, user sessions, the root, a CRI-O conmon).
///
/// See the module docs for the layouts recognised and how the path is searched.
pub fn container_id_from_cgroup(path: &str) -> Option<ContainerRef> {
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    for (i, component) in components.iter().enumerate().rev() {
        match classify(component, &components[..i]) {
            Component::Container(container) => return Some(container),
            // conmon sits beside the container in the pod's cgroup, never inside a container:
            // nothing above it can be the container this process belongs to.
            Component::Conmon => return None,
            Component::Other => {}
        }
    }
    None
}

/// The UID of the Kubernetes pod a cgroup path belongs to, or `None` if it is not under a pod.
///
/// Recognises the systemd driver's `kubepods[-<qos>]-pod<uid>.slice` (the UID's `-` are written
/// as `_` there and are converted back), also with a kubelet cgroup-root prefix such as kind's
/// `kubelet-kubepods-…-pod<uid>.slice`, and the cgroupfs driver's `pod<uid>` directory under a
/// `kubepods` directory. The UID must have 32 hex digits: a UUID (`8-4-4-4-12`) or the bare
/// 32-digit hash the kubelet gives static pods. The innermost pod directory wins.
#[cfg_attr(not(test), expect(dead_code, reason = "used by pod enrichment (issue 4)"))]
pub fn pod_uid_from_cgroup(path: &str) -> Option<String> {
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    for (i, component) in components.iter().enumerate().rev() {
        // containerd's unconverted systemd form `kubepods-…-pod<uid>.slice:cri-containerd:<id>`
        // carries the pod slice before the first colon.
        let component = component.split(':').next().unwrap_or(component);
        if let Some(uid) = systemd_pod_uid(component) {
            return Some(uid);
        }
        if let Some(uid) = cgroupfs_pod_uid(component, &components[..i]) {
            return Some(uid.to_owned());
        }
    }
    None
}

/// What one cgroup path component says about containers.
enum Component {
    /// The component is a container's own cgroup.
    Container(ContainerRef),
    /// The component is a CRI-O conmon (container monitor) cgroup.
    Conmon,
    /// Anything else.
    Other,
}

/// Classifies `component`, given the components above it (`ancestors`, root first).
fn classify(component: &str, ancestors: &[&str]) -> Component {
    let found = |runtime: Runtime, id: &str| {
        Component::Container(ContainerRef {
            runtime,
            id: id.to_owned(),
        })
    };

    // containerd / runc "slice:prefix:name" form, e.g.
    // `kubepods-burstable-pod<uid>.slice:cri-containerd:<id>`.
    if component.contains(':') {
        let mut parts = component.splitn(3, ':');
        let (_slice, prefix, id) = (parts.next(), parts.next(), parts.next());
        let runtime = match prefix {
            Some("cri-containerd") => Runtime::Containerd,
            Some("crio") => Runtime::Crio,
            Some("docker") => Runtime::Docker,
            _ => return Component::Other,
        };
        return match id {
            Some(id) if is_container_id(id) => found(runtime, id),
            _ => Component::Other,
        };
    }

    // Prefixed names: systemd driver `<prefix>-<id>.scope`, CRI-O's cgroupfs `crio-<id>`.
    let name = component.strip_suffix(".scope").unwrap_or(component);
    if name.starts_with("crio-conmon-") {
        return Component::Conmon;
    }
    for (prefix, runtime) in [
        ("cri-containerd-", Runtime::Containerd),
        ("crio-", Runtime::Crio),
        ("docker-", Runtime::Docker),
    ] {
        if let Some(id) = name.strip_prefix(prefix) {
            if is_container_id(id) {
                return found(runtime, id);
            }
        }
    }

    // Bare ids: cgroupfs driver.
    if is_container_id(component) {
        match ancestors.split_last() {
            Some((&"docker", _)) => return found(Runtime::Docker, component),
            Some((parent, above)) if cgroupfs_pod_uid(parent, above).is_some() => {
                return found(Runtime::Containerd, component)
            }
            _ => {}
        }
    }
    Component::Other
}

/// The pod UID in a systemd-driver pod slice name `…kubepods…-pod<uid_with_underscores>.slice`.
fn systemd_pod_uid(component: &str) -> Option<String> {
    let name = component.strip_suffix(".slice")?;
    let at = name.rfind("-pod")?;
    if !name[..at].contains("kubepods") {
        return None;
    }
    let uid = name[at + "-pod".len()..].replace('_', "-");
    is_pod_uid(&uid).then_some(uid)
}

/// The pod UID in a cgroupfs-driver pod directory `pod<uid>` somewhere under a `kubepods`
/// directory (`ancestors` are the components above it, root first).
fn cgroupfs_pod_uid<'a>(component: &'a str, ancestors: &[&str]) -> Option<&'a str> {
    let uid = component.strip_prefix("pod")?;
    (is_pod_uid(uid) && ancestors.iter().any(|a| a.contains("kubepods"))).then_some(uid)
}

/// Whether `id` is a full container id: exactly 64 lowercase hex characters.
fn is_container_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether `uid` looks like a pod UID: lowercase hex and `-` only, with exactly 32 hex digits,
/// either dash-free (static pods) or in the 36-character UUID layout.
fn is_pod_uid(uid: &str) -> bool {
    let hex = uid
        .bytes()
        .filter(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        .count();
    let dashes = uid.bytes().filter(|&b| b == b'-').count();
    hex + dashes == uid.len() && hex == 32 && (dashes == 0 || uid.len() == 36)
}

#[cfg(test)]
mod tests;
