use super::*;

const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const ID2: &str = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";
const UID: &str = "5f3c2b1a-9d8e-4c7b-a6f5-e4d3c2b1a098";
const UID_: &str = "5f3c2b1a_9d8e_4c7b_a6f5_e4d3c2b1a098";

fn containerd(id: &str) -> Option<ContainerRef> {
    Some(ContainerRef {
        runtime: Runtime::Containerd,
        id: id.to_owned(),
    })
}
fn crio(id: &str) -> Option<ContainerRef> {
    Some(ContainerRef {
        runtime: Runtime::Crio,
        id: id.to_owned(),
    })
}
fn docker(id: &str) -> Option<ContainerRef> {
    Some(ContainerRef {
        runtime: Runtime::Docker,
        id: id.to_owned(),
    })
}

/// (cgroup path, expected container, expected pod UID)
fn cases() -> Vec<(String, Option<ContainerRef>, Option<&'static str>)> {
    vec![
        // containerd, systemd driver (cgroup v2 and v1 name the same).
        (
            format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{ID}.scope"),
            containerd(ID),
            Some(UID),
        ),
        (
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope"),
            containerd(ID),
            Some(UID),
        ),
        // Guaranteed QoS: no QoS slice.
        (
            format!("/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope"),
            containerd(ID),
            Some(UID),
        ),
        // A process in a sub-cgroup of the container.
        (
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope/init.scope"),
            containerd(ID),
            Some(UID),
        ),
        // systemd running inside the container.
        (
            format!("/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope/system.slice/dbus.service"),
            containerd(ID),
            Some(UID),
        ),
        // Under a kubelet cgroup root, inside a kind node (itself a Docker container).
        (
            format!("/system.slice/docker-{ID2}.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{ID}.scope"),
            containerd(ID),
            Some(UID),
        ),
        // The kind node's own processes (kubelet, containerd): the node container.
        (
            format!("/system.slice/docker-{ID2}.scope/kubelet.slice"),
            docker(ID2),
            None,
        ),
        // Seen from a cgroup namespace that does not contain the process.
        (
            format!("/../../kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope"),
            containerd(ID),
            Some(UID),
        ),
        // containerd's unconverted systemd "slice:prefix:name" form.
        (
            format!("/system.slice/containerd.service/kubepods-burstable-pod{UID_}.slice:cri-containerd:{ID}"),
            containerd(ID),
            Some(UID),
        ),
        // containerd (or cri-dockerd), cgroupfs driver: bare id under the pod dir.
        (
            format!("/kubepods/burstable/pod{UID}/{ID}"),
            containerd(ID),
            Some(UID),
        ),
        (
            format!("/kubepods/besteffort/pod{UID}/{ID}"),
            containerd(ID),
            Some(UID),
        ),
        (format!("/kubepods/pod{UID}/{ID}"), containerd(ID), Some(UID)),
        (
            format!("/kubepods/burstable/pod{UID}/{ID}/init.scope"),
            containerd(ID),
            Some(UID),
        ),
        // The pod sandbox cgroup itself, no container.
        (format!("/kubepods/burstable/pod{UID}"), None, Some(UID)),
        (
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"),
            None,
            Some(UID),
        ),
        // Static pod: 32-hex UID without dashes.
        (
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0a1b2c3d4e5f60718293a4b5c6d7e8f9.slice/cri-containerd-{ID}.scope"),
            containerd(ID),
            Some("0a1b2c3d4e5f60718293a4b5c6d7e8f9"),
        ),
        // CRI-O, systemd and cgroupfs drivers.
        (
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-{ID}.scope"),
            crio(ID),
            Some(UID),
        ),
        (
            format!("/kubepods/burstable/pod{UID}/crio-{ID}"),
            crio(ID),
            Some(UID),
        ),
        // CRI-O conmon is not a container.
        (
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-conmon-{ID}.scope"),
            None,
            Some(UID),
        ),
        (
            format!("/kubepods/burstable/pod{UID}/crio-conmon-{ID}"),
            None,
            Some(UID),
        ),
        // Docker, systemd and cgroupfs drivers.
        (format!("/system.slice/docker-{ID}.scope"), docker(ID), None),
        (format!("/docker/{ID}"), docker(ID), None),
        // Docker in Docker: the innermost container wins.
        (format!("/docker/{ID2}/docker/{ID}"), docker(ID), None),
        // Not containers.
        ("/".to_owned(), None, None),
        (String::new(), None, None),
        ("/user.slice/user-1000.slice/session-3.scope".to_owned(), None, None),
        ("/user.slice/user-1000.slice/user@1000.service/app.slice/app-gnome-firefox-1234.scope".to_owned(), None, None),
        ("/system.slice/sshd.service".to_owned(), None, None),
        ("/system.slice/containerd.service".to_owned(), None, None),
        ("/system.slice/docker.service".to_owned(), None, None),
        ("/init.scope".to_owned(), None, None),
        ("/kubepods.slice/kubepods-burstable.slice".to_owned(), None, None),
        // Ids that are not exactly 64 lowercase hex.
        (format!("/system.slice/docker-{}.scope", &ID[..63]), None, None),
        (format!("/system.slice/docker-{ID}0.scope"), None, None),
        (format!("/system.slice/docker-{}.scope", ID.to_uppercase()), None, None),
        (
            format!("/system.slice/docker-{}g.scope", &ID[..63]),
            None,
            None,
        ),
        (format!("/docker/{}", &ID[..12]), None, None),
        // A bare id not under a pod or docker directory.
        (format!("/system.slice/{ID}"), None, None),
        // A bare id under something named pod… that is not in kubepods.
        (format!("/machine/pod{UID}/{ID}"), None, None),
        // Unknown prefix in the colon form.
        (format!("/system.slice/foo.slice:podman:{ID}"), None, None),
    ]
}

#[test]
fn container_ids() {
    for (path, want, _) in cases() {
        assert_eq!(container_id_from_cgroup(&path), want, "path {path:?}");
    }
}

#[test]
fn pod_uids() {
    for (path, _, want) in cases() {
        assert_eq!(pod_uid_from_cgroup(&path).as_deref(), want, "path {path:?}");
    }
}

#[test]
fn malformed_pod_uids() {
    for path in [
        "/kubepods/burstable/podnot-a-uid/",
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod.slice",
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod5F3C2B1A_9D8E_4C7B_A6F5_E4D3C2B1A098.slice",
        "/kubepods/burstable/pod5f3c2b1a-9d8e-4c7b-a6f5-e4d3c2b1a09",
        "/kubepods/burstable/pod5f3c2b1a--9d8e-4c7b-a6f5-e4d3c2b1a098",
        "/pod5f3c2b1a-9d8e-4c7b-a6f5-e4d3c2b1a098",
        "/system.slice/foo-pod5f3c2b1a_9d8e_4c7b_a6f5_e4d3c2b1a098.slice",
    ] {
        assert_eq!(pod_uid_from_cgroup(path), None, "path {path:?}");
    }
}

#[test]
fn runtime_names() {
    for (runtime, name) in [
        (Runtime::Containerd, "containerd"),
        (Runtime::Crio, "crio"),
        (Runtime::Docker, "docker"),
    ] {
        assert_eq!(runtime.to_string(), name);
        assert_eq!(
            serde_json::to_string(&runtime).expect("serialize runtime"),
            format!("\"{name}\"")
        );
    }
    let container = ContainerRef {
        runtime: Runtime::Crio,
        id: ID.to_owned(),
    };
    assert_eq!(
        serde_json::to_value(&container).expect("serialize container"),
        serde_json::json!({ "runtime": "crio", "id": ID })
    );
}

#[test]
fn k8s_container_ids() {
    for runtime in [Runtime::Containerd, Runtime::Crio, Runtime::Docker] {
        let container = ContainerRef {
            runtime,
            id: ID.to_owned(),
        };
        let text = container.k8s_container_id();
        assert_eq!(text.parse::<ContainerRef>().expect("parse"), container);
    }
    assert_eq!(
        format!("cri-o://{ID}").parse::<ContainerRef>().expect("parse"),
        crio(ID).expect("crio")
    );
    assert!(matches!(
        ID.parse::<ContainerRef>(),
        Err(Error::NoRuntimePrefix { .. })
    ));
    assert!(matches!(
        format!("rkt://{ID}").parse::<ContainerRef>(),
        Err(Error::UnknownRuntime { runtime, .. }) if runtime == "rkt"
    ));
    assert!(matches!(
        "docker://abc".parse::<ContainerRef>(),
        Err(Error::BadId { id, .. }) if id == "abc"
    ));
}
