use super::*;

fn ep(s: &str) -> Endpoint {
    Endpoint::parse_all(s).expect("endpoint").remove(0)
}

fn strings(entries: &[Entry]) -> Vec<String> {
    entries
        .iter()
        .map(|(e, s)| format!("{e} {}", s.as_str()))
        .collect()
}

/// `default/kubernetes` as kube-apiserver 1.18 returns it (no `clusterIPs` yet).
const SERVICE_1_18: &str = r#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"kubernetes","namespace":"default","selfLink":"/api/v1/namespaces/default/services/kubernetes","uid":"9b1c8a4e-2f1b-4b7e-8d0a-3c2f1e0d9b8a","resourceVersion":"152","creationTimestamp":"2024-03-01T10:00:00Z","labels":{"component":"apiserver","provider":"kubernetes"}},"spec":{"ports":[{"name":"https","protocol":"TCP","port":443,"targetPort":6443}],"clusterIP":"10.96.0.1","type":"ClusterIP","sessionAffinity":"None"},"status":{"loadBalancer":{}}}"#;

/// As 1.33 returns it on a dual-stack cluster.
const SERVICE_1_33: &str = r#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"kubernetes","namespace":"default","uid":"0d6c2a8e-7f3b-4c1e-9a2d-5b4e3f2a1c0d","resourceVersion":"204","creationTimestamp":"2025-05-01T10:00:00Z","labels":{"component":"apiserver","provider":"kubernetes"}},"spec":{"ports":[{"name":"https","protocol":"TCP","port":443,"targetPort":6443}],"clusterIP":"10.96.0.1","clusterIPs":["10.96.0.1","fd00:10:96::1"],"type":"ClusterIP","sessionAffinity":"None","ipFamilies":["IPv4","IPv6"],"ipFamilyPolicy":"RequireDualStack","internalTrafficPolicy":"Cluster"},"status":{"loadBalancer":{}}}"#;

/// Core Endpoints `default/kubernetes` of a three-apiserver 1.20 cluster, one not ready.
const ENDPOINTS_1_20: &str = r#"{"kind":"Endpoints","apiVersion":"v1","metadata":{"name":"kubernetes","namespace":"default","uid":"4a3b2c1d-0e9f-4a8b-b7c6-d5e4f3a2b1c0","resourceVersion":"199","creationTimestamp":"2024-03-01T10:00:00Z","labels":{"endpointslice.kubernetes.io/skip-mirror":"true"}},"subsets":[{"addresses":[{"ip":"192.168.10.2"},{"ip":"192.168.10.3"}],"notReadyAddresses":[{"ip":"192.168.10.4"}],"ports":[{"name":"https","port":6443,"protocol":"TCP"}]}]}"#;

/// EndpointSlices of `default/kubernetes` as 1.33 returns them (one per family).
const SLICE_V4_1_33: &str = r#"{"kind":"EndpointSlice","apiVersion":"discovery.k8s.io/v1","metadata":{"name":"kubernetes","namespace":"default","uid":"7e6d5c4b-3a2f-4e1d-8c0b-9a8f7e6d5c4b","resourceVersion":"206","generation":1,"creationTimestamp":"2025-05-01T10:00:00Z","labels":{"kubernetes.io/service-name":"kubernetes"}},"addressType":"IPv4","endpoints":[{"addresses":["192.168.10.2"],"conditions":{"ready":true}},{"addresses":["192.168.10.3"],"conditions":{"ready":false,"serving":false,"terminating":true}}],"ports":[{"name":"https","protocol":"TCP","port":6443}]}"#;
const SLICE_V6_1_33: &str = r#"{"kind":"EndpointSlice","apiVersion":"discovery.k8s.io/v1","metadata":{"name":"kubernetes-v6","namespace":"default","labels":{"kubernetes.io/service-name":"kubernetes"}},"addressType":"IPv6","endpoints":[{"addresses":["fd00::2"],"conditions":{"ready":true}}],"ports":[{"name":"https","protocol":"TCP","port":6443},{"name":"dns","protocol":"UDP","port":53},{"name":"all"}]}"#;

#[test]
fn services_of_both_generations() {
    let old: Service = serde_json::from_str(SERVICE_1_18).expect("service 1.18");
    assert_eq!(strings(&service_entries(&old)), ["10.96.0.1:443 service"]);
    let new: Service = serde_json::from_str(SERVICE_1_33).expect("service 1.33");
    assert_eq!(
        strings(&service_entries(&new)),
        ["10.96.0.1:443 service", "[fd00:10:96::1]:443 service"]
    );
    let headless: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "x"},
        "spec": {"clusterIP": "None", "clusterIPs": ["None"], "ports": [{"port": 443}]}
    }))
    .expect("headless");
    assert!(service_entries(&headless).is_empty());
}

#[test]
fn core_endpoints_include_not_ready_addresses() {
    let ep: Endpoints = serde_json::from_str(ENDPOINTS_1_20).expect("endpoints");
    assert_eq!(
        strings(&endpoints_entries(&ep)),
        [
            "192.168.10.2:6443 endpoints",
            "192.168.10.3:6443 endpoints",
            "192.168.10.4:6443 endpoints"
        ]
    );
    let empty: Endpoints =
        serde_json::from_str(r#"{"kind":"Endpoints","apiVersion":"v1","metadata":{"name":"kubernetes"}}"#)
            .expect("empty endpoints");
    assert!(endpoints_entries(&empty).is_empty());
}

#[test]
fn slices_of_both_families_tcp_ports_only() {
    let v4: EndpointSlice = serde_json::from_str(SLICE_V4_1_33).expect("v4 slice");
    assert_eq!(
        strings(&slice_entries(&v4)),
        [
            "192.168.10.2:6443 endpointslice",
            "192.168.10.3:6443 endpointslice"
        ]
    );
    let v6: EndpointSlice = serde_json::from_str(SLICE_V6_1_33).expect("v6 slice");
    assert_eq!(strings(&slice_entries(&v6)), ["[fd00::2]:6443 endpointslice"]);
    let fqdn: EndpointSlice = serde_json::from_value(serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "f"}, "addressType": "FQDN",
        "endpoints": [{"addresses": ["api.example"]}], "ports": [{"port": 6443}]
    }))
    .expect("fqdn slice");
    assert!(slice_entries(&fqdn).is_empty());
}

fn slice(name: &str, ip: &str) -> EndpointSlice {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "default"}, "addressType": "IPv4",
        "endpoints": [{"addresses": [ip]}], "ports": [{"port": 6443, "protocol": "TCP"}]
    }))
    .expect("slice")
}

#[test]
fn objects_follow_the_watch_protocol() {
    let mut objects: Objects<Vec<Entry>> = Objects::default();
    let all = |o: &Objects<Vec<Entry>>| -> Vec<String> { o.values().flat_map(|v| strings(v)).collect() };
    assert!(!objects.apply(watcher::Event::Init, slice_entries));
    assert!(!objects.apply(watcher::Event::InitApply(slice("a", "10.0.0.1")), slice_entries));
    assert!(
        !objects.listed() && all(&objects).is_empty(),
        "nothing before InitDone"
    );
    assert!(objects.apply(watcher::Event::<EndpointSlice>::InitDone, slice_entries));
    assert_eq!(all(&objects), ["10.0.0.1:6443 endpointslice"]);
    assert!(objects.apply(watcher::Event::Apply(slice("b", "10.0.0.2")), slice_entries));
    assert!(objects.apply(watcher::Event::Apply(slice("a", "10.0.0.3")), slice_entries));
    assert_eq!(
        all(&objects),
        ["10.0.0.3:6443 endpointslice", "10.0.0.2:6443 endpointslice"]
    );
    assert!(objects.apply(watcher::Event::Delete(slice("b", "10.0.0.2")), slice_entries));
    assert!(!objects.apply(watcher::Event::Delete(slice("b", "10.0.0.2")), slice_entries));
    // A relist keeps the old state visible until it is complete, then replaces it.
    objects.apply(watcher::Event::Init, slice_entries);
    objects.apply(watcher::Event::InitApply(slice("c", "10.0.0.4")), slice_entries);
    assert_eq!(all(&objects), ["10.0.0.3:6443 endpointslice"]);
    objects.apply(watcher::Event::<EndpointSlice>::InitDone, slice_entries);
    assert_eq!(all(&objects), ["10.0.0.4:6443 endpointslice"]);
}

#[test]
fn tracker_retains_removed_entries_for_a_while() {
    let t0 = Instant::now();
    let retain = Duration::from_secs(600);
    let mut t = Tracker::new(retain);
    let a = (ep("10.0.0.1:6443"), Source::EndpointSlice);
    let b = (ep("10.0.0.2:6443"), Source::EndpointSlice);
    let svc = (ep("10.96.0.1:443"), Source::Service);
    assert!(!t.has(Feed::Backends));
    t.update(Feed::Service, t0, [svc]);
    let change = t.update(Feed::Backends, t0, [a, b]);
    assert_eq!(change.added, vec![a, b]);
    assert!(t.has(Feed::Backends));
    assert_eq!(t.set().iter().count(), 3);
    // b leaves (its apiserver restarts): still watched until the retention ends.
    let t1 = t0 + Duration::from_secs(10);
    let change = t.update(Feed::Backends, t1, [a]);
    assert_eq!(change.removed, vec![b]);
    assert_eq!(t.set().iter().count(), 3);
    assert_eq!(t.next_expiry(), Some(t1 + retain));
    assert!(t.expire(t1 + retain - Duration::from_secs(1)).is_empty());
    // b comes back before that: no longer pending removal.
    t.update(Feed::Backends, t1 + Duration::from_secs(60), [a, b]);
    assert_eq!(t.next_expiry(), None);
    // b leaves for good: gone after the retention.
    let t2 = t1 + Duration::from_secs(120);
    t.update(Feed::Backends, t2, [a]);
    assert_eq!(t.expire(t2 + retain), vec![b]);
    let left: Vec<String> = t.set().iter().map(|(e, _)| e.to_string()).collect();
    assert_eq!(left, ["10.0.0.1:6443", "10.96.0.1:443"]);
    // The same address from two feeds carries both sources.
    t.update(Feed::Server, t2, [(ep("10.96.0.1:443"), Source::InCluster)]);
    let set = t.set();
    let sources: Vec<_> = set
        .iter()
        .filter(|(e, _)| **e == svc.0)
        .map(|(_, s)| s.to_vec())
        .collect();
    assert_eq!(sources, vec![vec![Source::InCluster, Source::Service]]);
}

#[test]
fn merge_and_server_entries() {
    let mut base = EndpointSet::default();
    base.insert(ep("10.0.0.9:6443"), Source::Flag);
    let mut t = Tracker::new(RETAIN_REMOVED);
    let ips: Vec<IpAddr> = vec!["10.0.0.9".parse().unwrap(), "::ffff:10.0.0.8".parse().unwrap()];
    t.update(
        Feed::Server,
        Instant::now(),
        server_entries(ips, 6443, Source::Kubeconfig),
    );
    merge_into(&mut base, &t.set());
    let got: Vec<(String, Vec<Source>)> = base.iter().map(|(e, s)| (e.to_string(), s.to_vec())).collect();
    assert_eq!(
        got,
        vec![
            ("10.0.0.8:6443".to_owned(), vec![Source::Kubeconfig]),
            ("10.0.0.9:6443".to_owned(), vec![Source::Flag, Source::Kubeconfig]),
        ]
    );
}

#[test]
fn source_names_match_their_json() {
    for s in [
        Source::Kubeconfig,
        Source::InCluster,
        Source::Service,
        Source::EndpointSlice,
        Source::Endpoints,
        Source::KubeletKubeconfig,
        Source::LocalApiserver,
    ] {
        assert_eq!(
            serde_json::to_value(s).expect("serialize"),
            serde_json::json!(s.as_str())
        );
    }
}
