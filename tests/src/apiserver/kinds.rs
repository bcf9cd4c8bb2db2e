//! The kinds of objects `ll-apiserver` serves, the two generations of API group-versions it
//! can serve them at (a current apiserver or a 1.18-era one), and how each kind looks at each
//! group-version: objects are stored in one internal form (the newest version, or core v1 for
//! Events, as the real storage shares one Event for `v1` and `events.k8s.io`) and converted
//! when they go out or come in.
use std::net::IpAddr;

use serde_json::{json, Map, Value};

use super::util::{age_of, human_duration, parse_rfc3339, rfc3339, unix_now};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Namespace,
    Node,
    Pod,
    Service,
    Endpoints,
    EndpointSlice,
    Event,
    PodDisruptionBudget,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Namespace => "Namespace",
            Kind::Node => "Node",
            Kind::Pod => "Pod",
            Kind::Service => "Service",
            Kind::Endpoints => "Endpoints",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Event => "Event",
            Kind::PodDisruptionBudget => "PodDisruptionBudget",
        }
    }

    pub fn plural(self) -> &'static str {
        match self {
            Kind::Namespace => "namespaces",
            Kind::Node => "nodes",
            Kind::Pod => "pods",
            Kind::Service => "services",
            Kind::Endpoints => "endpoints",
            Kind::EndpointSlice => "endpointslices",
            Kind::Event => "events",
            Kind::PodDisruptionBudget => "poddisruptionbudgets",
        }
    }

    pub fn namespaced(self) -> bool {
        !matches!(self, Kind::Namespace | Kind::Node)
    }

    /// The field labels `fieldSelector` accepts besides `metadata.name` and
    /// `metadata.namespace`, as the real apiserver's for the kind.
    pub fn field_labels(self) -> &'static [&'static str] {
        match self {
            Kind::Pod => &[
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "spec.hostNetwork",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            ],
            Kind::Event => &[
                "involvedObject.kind",
                "involvedObject.namespace",
                "involvedObject.name",
                "involvedObject.uid",
                "involvedObject.apiVersion",
                "involvedObject.resourceVersion",
                "involvedObject.fieldPath",
                "reason",
                "reportingComponent",
                "source",
                "type",
            ],
            Kind::Node => &["spec.unschedulable"],
            Kind::Namespace => &["status.phase"],
            Kind::Service => &["spec.clusterIP", "spec.type"],
            _ => &[],
        }
    }

    /// A field's value for `fieldSelector`, from the internal form.
    pub fn field_value(self, object: &Value, field: &str) -> String {
        match (self, field) {
            (Kind::Event, "source") => super::select::dotted(object, "source.component"),
            (Kind::Pod, "spec.hostNetwork") | (Kind::Node, "spec.unschedulable") => {
                object["spec"][&field[5..]].as_bool().unwrap_or(false).to_string()
            }
            _ => super::select::dotted(object, field),
        }
    }
}

/// A group-version; the core group is `""`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gv {
    pub group: &'static str,
    pub version: &'static str,
}

pub const CORE: Gv = Gv {
    group: "",
    version: "v1",
};

impl Gv {
    /// `v1` or `group/version`, as in `apiVersion`.
    pub fn api_version(self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// A resource as served at one group-version.
#[derive(Clone, Copy, Debug)]
pub struct Resource {
    pub gv: Gv,
    pub kind: Kind,
    pub verbs: &'static [&'static str],
}

impl Resource {
    pub fn allows(&self, verb: &str) -> bool {
        self.verbs.contains(&verb)
    }

    fn short_names(&self) -> &'static [&'static str] {
        match self.kind {
            Kind::Namespace => &["ns"],
            Kind::Node => &["no"],
            Kind::Pod => &["po"],
            Kind::Service => &["svc"],
            Kind::Endpoints => &["ep"],
            Kind::Event => &["ev"],
            Kind::PodDisruptionBudget => &["pdb"],
            Kind::EndpointSlice => &[],
        }
    }

    fn storage_version_hash(&self) -> &'static str {
        match self.kind {
            Kind::Namespace => "Q3oi5N2YM8M=",
            Kind::Node => "XwShjMxG9Fs=",
            Kind::Pod => "xPOwRZ+Yhw8=",
            Kind::Service => "0/CO1lhkEBI=",
            Kind::Endpoints => "fWeeMqaN/OA=",
            Kind::EndpointSlice => "Nx3SIv6I0mE=",
            Kind::Event => "r2yiGXH7wu8=",
            Kind::PodDisruptionBudget => "6BGBu0kpHtk=",
        }
    }
}

const READ: &[&str] = &["get", "list", "watch"];
const READ_PATCH: &[&str] = &["get", "list", "patch", "watch"];
const WRITE: &[&str] = &["create", "delete", "get", "list", "patch", "watch"];

/// Which API generation the server plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Generation {
    /// A current apiserver (1.30): `discovery.k8s.io/v1`, `policy/v1`, `events.k8s.io/v1`.
    New,
    /// A 1.18 apiserver: `discovery.k8s.io/v1beta1`, `policy/v1beta1`, `events.k8s.io/v1beta1`.
    Old,
}

impl Generation {
    pub fn parse(s: &str) -> Result<Generation, String> {
        match s {
            "new" => Ok(Generation::New),
            "old" => Ok(Generation::Old),
            _ => Err(format!("bad --generation {s:?} (new, old)")),
        }
    }

    /// The version of every non-core group this generation serves.
    fn group_version(self) -> &'static str {
        match self {
            Generation::New => "v1",
            Generation::Old => "v1beta1",
        }
    }

    /// The non-core group-versions served, in discovery order.
    pub fn groups(self) -> Vec<Gv> {
        let version = self.group_version();
        ["events.k8s.io", "policy", "discovery.k8s.io"]
            .into_iter()
            .map(|group| Gv { group, version })
            .collect()
    }

    /// Whether `gv` is served.
    pub fn serves(self, gv: Gv) -> bool {
        gv == CORE || self.groups().contains(&gv)
    }

    /// The group-version the pod eviction subresource is served at.
    pub fn eviction_gv(self) -> Gv {
        Gv {
            group: "policy",
            version: self.group_version(),
        }
    }

    /// The Eviction group-versions the server's scheme can decode: a current apiserver still
    /// knows `policy/v1beta1` (and accepts it on the eviction subresource), a 1.18 one has never
    /// heard of `policy/v1`.
    pub fn eviction_known(self) -> &'static [&'static str] {
        match self {
            Generation::New => &["policy/v1", "policy/v1beta1"],
            Generation::Old => &["policy/v1beta1"],
        }
    }

    /// Every resource served at `gv` (None for a group-version not served).
    pub fn resources(self, gv: Gv) -> Option<Vec<Resource>> {
        if !self.serves(gv) {
            return None;
        }
        let r = |kind, verbs| Resource { gv, kind, verbs };
        Some(match gv.group {
            "" => vec![
                r(Kind::Endpoints, READ),
                r(Kind::Event, WRITE),
                r(Kind::Namespace, READ),
                r(Kind::Node, READ_PATCH),
                r(Kind::Pod, WRITE),
                r(Kind::Service, READ),
            ],
            "events.k8s.io" => vec![r(Kind::Event, WRITE)],
            "policy" => vec![r(Kind::PodDisruptionBudget, WRITE)],
            "discovery.k8s.io" => vec![r(Kind::EndpointSlice, READ)],
            _ => return None,
        })
    }

    /// The resource `plural` at `gv`, if served.
    pub fn resolve(self, gv: Gv, plural: &str) -> Option<Resource> {
        self.resources(gv)?
            .into_iter()
            .find(|r| r.kind.plural() == plural)
    }

    /// Finds the served group-version for path segments `group`, `version`.
    pub fn gv(self, group: &str, version: &str) -> Option<Gv> {
        self.groups()
            .into_iter()
            .chain([CORE])
            .find(|gv| gv.group == group && gv.version == version)
    }

    /// `/version`
    pub fn version_info(self, override_version: Option<&str>) -> Value {
        let (git, commit, build, go) = match self {
            Generation::New => (
                "v1.30.4",
                "a51b3b711150f57ffc1f526a640ec058514ed596",
                "2024-08-14T19:04:36Z",
                "go1.22.5",
            ),
            Generation::Old => (
                "v1.18.20",
                "1f3e19b7beb1cc0110255668c4238ed63dadb7ad",
                "2021-06-16T12:51:17Z",
                "go1.13.15",
            ),
        };
        let git = override_version.unwrap_or(git);
        let mut parts = git.trim_start_matches('v').split('.');
        let major = parts.next().unwrap_or("1");
        let minor = parts.next().unwrap_or("0");
        json!({
            "major": major,
            "minor": minor,
            "gitVersion": git,
            "gitCommit": commit,
            "gitTreeState": "clean",
            "buildDate": build,
            "goVersion": go,
            "compiler": "gc",
            "platform": "linux/amd64",
        })
    }

    /// `/apis`: every group with its (one) served version.
    pub fn group_list(self) -> Value {
        let groups: Vec<Value> = self.groups().into_iter().map(group_entry).collect();
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
    }

    /// `/apis/GROUP`
    pub fn group(self, group: &str) -> Option<Value> {
        let gv = self.groups().into_iter().find(|gv| gv.group == group)?;
        let mut entry = group_entry(gv);
        let map = entry.as_object_mut()?;
        let mut out = Map::new();
        out.insert("kind".into(), json!("APIGroup"));
        out.insert("apiVersion".into(), json!("v1"));
        out.append(map);
        Some(Value::Object(out))
    }

    /// `/api/v1` or `/apis/GROUP/VERSION`: an APIResourceList saying exactly what is served.
    pub fn resource_list(self, gv: Gv) -> Option<Value> {
        let mut resources = Vec::new();
        for r in self.resources(gv)? {
            let singular = match self {
                Generation::New => r.kind.name().to_ascii_lowercase(),
                Generation::Old => String::new(),
            };
            let mut entry = json!({
                "name": r.kind.plural(),
                "singularName": singular,
                "namespaced": r.kind.namespaced(),
                "kind": r.kind.name(),
                "verbs": r.verbs,
            });
            if !r.short_names().is_empty() {
                entry["shortNames"] = json!(r.short_names());
            }
            if r.kind == Kind::Pod {
                entry["categories"] = json!(["all"]);
            }
            if r.kind == Kind::Service {
                entry["categories"] = json!(["all"]);
            }
            entry["storageVersionHash"] = json!(r.storage_version_hash());
            resources.push(entry);
            if r.kind == Kind::Pod {
                let eviction = self.eviction_gv();
                resources.push(json!({
                    "name": "pods/eviction",
                    "singularName": "",
                    "namespaced": true,
                    "group": eviction.group,
                    "version": eviction.version,
                    "kind": "Eviction",
                    "verbs": ["create"],
                }));
            }
        }
        let mut list = json!({"kind": "APIResourceList"});
        // The real core list has no apiVersion; every group's has.
        if gv != CORE {
            list["apiVersion"] = json!("v1");
        }
        list["groupVersion"] = json!(gv.api_version());
        list["resources"] = json!(resources);
        Some(list)
    }

    /// `/`: the paths served.
    pub fn root_paths(self) -> Value {
        let mut paths = vec!["/api".to_string(), "/api/v1".into(), "/apis".into()];
        for gv in self.groups() {
            paths.push(format!("/apis/{}", gv.group));
            paths.push(format!("/apis/{}", gv.api_version()));
        }
        paths.extend(["/healthz", "/livez", "/readyz", "/version"].map(String::from));
        paths.sort();
        json!({ "paths": paths })
    }
}

fn group_entry(gv: Gv) -> Value {
    let version = json!({"groupVersion": gv.api_version(), "version": gv.version});
    json!({"name": gv.group, "versions": [version], "preferredVersion": version})
}

// ---------------------------------------------------------------------------------------------
// Conversion between the internal form and the served versions

/// core v1 Event field ↔ events.k8s.io Event field.
const EVENT_FIELDS: [(&str, &str); 7] = [
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reportingComponent", "reportingController"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];

fn rename_fields(object: &mut Value, pairs: impl Iterator<Item = (&'static str, &'static str)>) {
    let Some(map) = object.as_object_mut() else {
        return;
    };
    let moved: Vec<(&str, Option<Value>)> = pairs.map(|(from, to)| (to, map.remove(from))).collect();
    for (to, value) in moved {
        match value {
            Some(v) => {
                map.insert(to.to_string(), v);
            }
            None => {
                map.remove(to);
            }
        }
    }
}

/// Whether a JSON value is "unset" as Go's zero values are.
fn unset(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::Object(m) => m.values().all(unset),
        Value::Array(a) => a.is_empty(),
        Value::Bool(b) => !b,
    }
}

/// The object as served at `gv` (with `kind` and `apiVersion`), from the internal form.
pub fn render(kind: Kind, gv: Gv, internal: &Value) -> Value {
    let mut out = internal.clone();
    match kind {
        Kind::Event if gv.group == "events.k8s.io" => {
            rename_fields(&mut out, EVENT_FIELDS.into_iter());
            if let Some(map) = out.as_object_mut() {
                map.retain(|k, v| !(k.starts_with("deprecated") && unset(v)));
                map.entry("eventTime").or_insert(Value::Null);
            }
        }
        Kind::Event => {
            if let Some(map) = out.as_object_mut() {
                // What core v1 always shows, set or not.
                for key in ["firstTimestamp", "lastTimestamp", "eventTime"] {
                    map.entry(key).or_insert(Value::Null);
                }
                for key in ["reportingComponent", "reportingInstance"] {
                    map.entry(key).or_insert(json!(""));
                }
                map.entry("source").or_insert(json!({}));
            }
        }
        Kind::EndpointSlice if gv.version == "v1beta1" => {
            // v1beta1 has `topology` where v1 has nodeName and zone, and no hints.
            for endpoint in out["endpoints"].as_array_mut().into_iter().flatten() {
                let Some(map) = endpoint.as_object_mut() else {
                    continue;
                };
                let mut topology = map
                    .remove("deprecatedTopology")
                    .and_then(|t| t.as_object().cloned())
                    .unwrap_or_default();
                if let Some(node) = map.remove("nodeName") {
                    topology.insert("kubernetes.io/hostname".into(), node);
                }
                if let Some(zone) = map.remove("zone") {
                    topology.insert("topology.kubernetes.io/zone".into(), zone);
                }
                map.remove("hints");
                if !topology.is_empty() {
                    map.insert("topology".into(), Value::Object(topology));
                }
            }
        }
        _ => {}
    }
    let mut ordered = Map::new();
    ordered.insert("kind".into(), json!(kind.name()));
    ordered.insert("apiVersion".into(), json!(gv.api_version()));
    if let Some(map) = out.as_object_mut() {
        map.remove("kind");
        map.remove("apiVersion");
        ordered.append(map);
    }
    Value::Object(ordered)
}

/// The internal form of an object received at `gv`.
pub fn ingest(kind: Kind, gv: Gv, external: Value) -> Value {
    let mut out = external;
    match kind {
        Kind::Event if gv.group == "events.k8s.io" => {
            rename_fields(&mut out, EVENT_FIELDS.into_iter().map(|(a, b)| (b, a)));
            out["apiVersion"] = json!("v1");
        }
        Kind::EndpointSlice => out["apiVersion"] = json!("discovery.k8s.io/v1"),
        Kind::PodDisruptionBudget => out["apiVersion"] = json!("policy/v1"),
        _ => out["apiVersion"] = json!("v1"),
    }
    out["kind"] = json!(kind.name());
    out
}

/// A list item: real lists leave out each item's kind and apiVersion.
pub fn list_item(object: &Value) -> Value {
    let mut item = object.clone();
    if let Some(map) = item.as_object_mut() {
        map.remove("kind");
        map.remove("apiVersion");
    }
    item
}

/// Validation of an Event created at `gv`, as the real apiserver's ValidateEventCreate: the
/// legacy checks for every version, the strict ones for `events.k8s.io/v1`. Returns (field,
/// cause reason, message) for each error. `internal` is the core form.
pub fn validate_event(gv: Gv, internal: &Value) -> Vec<(String, &'static str, String)> {
    let mut errors: Vec<(String, &'static str, String)> = Vec::new();
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    let required = |field: &str| {
        (
            field.to_string(),
            "FieldValueRequired",
            "Required value".to_string(),
        )
    };
    let invalid = |field: &str, value: &str, msg: &str| {
        (
            field.to_string(),
            "FieldValueInvalid",
            format!("Invalid value: \"{value}\": {msg}"),
        )
    };
    let ns = s(&internal["metadata"]["namespace"]);
    let involved_ns = s(&internal["involvedObject"]["namespace"]);
    let event_time_set = !unset(&internal["eventTime"]);
    // legacyValidateEvent
    let ns_ok = match (event_time_set, involved_ns.is_empty()) {
        (false, true) => ns.is_empty() || ns == "default",
        (false, false) => ns == involved_ns,
        (true, true) => ns == "default" || ns == "kube-system",
        (true, false) => true,
    };
    if !ns_ok {
        errors.push(invalid(
            "involvedObject.namespace",
            &involved_ns,
            "does not match event.namespace",
        ));
    }
    if event_time_set {
        for (field, label) in [
            ("reportingComponent", "reportingController"),
            ("reportingInstance", "reportingInstance"),
            ("action", "action"),
            ("reason", "reason"),
        ] {
            if s(&internal[field]).is_empty() {
                errors.push(required(label));
            }
        }
    }
    if gv.group != "events.k8s.io" || gv.version == "v1beta1" {
        return errors;
    }
    // The strict checks of events.k8s.io/v1.
    if s(&internal["metadata"]["name"]).is_empty() && s(&internal["metadata"]["generateName"]).is_empty() {
        errors.push((
            "metadata.name".into(),
            "FieldValueRequired",
            "Required value: name or generateName is required".into(),
        ));
    }
    if let Some(series) = internal.get("series").filter(|s| !s.is_null()) {
        if series["count"].as_i64().unwrap_or(0) < 2 {
            errors.push(invalid("series.count", "", "should be at least 2"));
        }
        if unset(&series["lastObservedTime"]) {
            errors.push(required("series.lastObservedTime"));
        }
    }
    if !event_time_set {
        errors.push(required("eventTime"));
    }
    let ty = s(&internal["type"]);
    if ty != "Normal" && ty != "Warning" {
        errors.push(invalid("type", "", &format!("has invalid value: {ty}")));
    }
    for field in ["firstTimestamp", "lastTimestamp", "count", "source"] {
        if !unset(&internal[field]) {
            errors.push(invalid(field, "", "needs to be unset"));
        }
    }
    errors
}

// ---------------------------------------------------------------------------------------------
// Tables (`kubectl get`)

fn col(name: &str, ty: &str, format: &str, description: &str, priority: u8) -> Value {
    json!({"name": name, "type": ty, "format": format, "description": description, "priority": priority})
}

pub fn table_columns(kind: Kind) -> Value {
    let name = col(
        "Name",
        "string",
        "name",
        "Name must be unique within a namespace.",
        0,
    );
    let age = col(
        "Age",
        "string",
        "",
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
        0,
    );
    let s = |n: &str, d: &str, p: u8| col(n, "string", "", d, p);
    json!(match kind {
        Kind::Pod => vec![
            name,
            s(
                "Ready",
                "The aggregate readiness state of this pod for accepting traffic.",
                0
            ),
            s("Status", "The aggregate status of the containers in this pod.", 0),
            col(
                "Restarts",
                "integer",
                "",
                "The number of times the containers in this pod have been restarted.",
                0
            ),
            age,
            s(
                "IP",
                "IP address allocated to the pod. Routable at least within the cluster.",
                1
            ),
            s(
                "Node",
                "NodeName is a request to schedule this pod onto a specific node.",
                1
            ),
            s(
                "Nominated Node",
                "nominatedNodeName is set when this pod preempts other pods on the node.",
                1
            ),
            s(
                "Readiness Gates",
                "If specified, all readiness gates will be evaluated for pod readiness.",
                1
            ),
        ],
        Kind::Service => vec![
            name,
            s("Type", "type determines how the Service is exposed.", 0),
            s("Cluster-IP", "clusterIP is the IP address of the service.", 0),
            s("External-IP", "externalIPs is a list of IP addresses.", 0),
            s(
                "Port(s)",
                "The list of ports that are exposed by this service.",
                0
            ),
            age,
            s(
                "Selector",
                "Route service traffic to pods with label keys and values matching this selector.",
                1
            ),
        ],
        Kind::Endpoints => vec![name, s("Endpoints", "Endpoints of the service.", 0), age],
        Kind::EndpointSlice => vec![
            name,
            s("AddressType", "The IP protocol for this slice.", 0),
            s("Ports", "The ports for this slice.", 0),
            s("Endpoints", "The endpoints in this slice.", 0),
            age,
        ],
        Kind::Event => vec![
            s("Last Seen", "Time when this Event was last observed.", 0),
            s("Type", "Type of this event.", 0),
            s(
                "Reason",
                "This should be a short, machine understandable string.",
                0
            ),
            s("Object", "The object this event is about.", 0),
            s("Subobject", "The subobject this event is about.", 1),
            s("Source", "The component reporting this event.", 1),
            s(
                "Message",
                "A human-readable description of the status of this operation.",
                0
            ),
            s("First Seen", "The time at which the event was first recorded.", 1),
            col(
                "Count",
                "integer",
                "",
                "The number of times this event has occurred.",
                1
            ),
            col(
                "Name",
                "string",
                "name",
                "Name must be unique within a namespace.",
                1
            ),
        ],
        Kind::PodDisruptionBudget => vec![
            name,
            s(
                "Min Available",
                "The minimum number of pods that must be available.",
                0
            ),
            s(
                "Max Unavailable",
                "The maximum number of pods that may be unavailable.",
                0
            ),
            col(
                "Allowed Disruptions",
                "integer",
                "",
                "Number of pod disruptions that are currently allowed.",
                0
            ),
            age,
        ],
        Kind::Node => vec![
            name,
            s("Status", "The status of the node", 0),
            s("Roles", "The roles of the node", 0),
            age,
            s("Version", "Kubelet Version reported by the node.", 0),
            s("Internal-IP", "List of addresses reachable to the node.", 1),
            s("External-IP", "List of addresses reachable to the node.", 1),
            s("OS-Image", "OS Image reported by the node.", 1),
            s("Kernel-Version", "Kernel Version reported by the node.", 1),
            s(
                "Container-Runtime",
                "Container Runtime Version reported by the node.",
                1
            ),
        ],
        Kind::Namespace => vec![name, s("Status", "The status of the namespace", 0), age],
    })
}

fn or_none(v: &Value) -> Value {
    match v.as_str() {
        Some(s) if !s.is_empty() => json!(s),
        _ => json!("<none>"),
    }
}

fn since(time: &Value) -> String {
    match time.as_str().and_then(parse_rfc3339) {
        Some(t) => human_duration(unix_now().as_secs().saturating_sub(t)),
        None => "<unknown>".into(),
    }
}

/// The cells of one table row, from the internal form.
pub fn table_cells(kind: Kind, o: &Value) -> Vec<Value> {
    let name = o["metadata"]["name"].clone();
    let age = json!(age_of(o));
    let strs = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| a.iter().filter_map(|x| x.as_str().map(String::from)).collect())
            .unwrap_or_default()
    };
    match kind {
        Kind::Pod => {
            let statuses = o["status"]["containerStatuses"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let containers = o["spec"]["containers"].as_array().map_or(0, Vec::len);
            let ready = statuses.iter().filter(|s| s["ready"] == true).count();
            let restarts: i64 = statuses.iter().filter_map(|s| s["restartCount"].as_i64()).sum();
            let status = if o["metadata"]["deletionTimestamp"].is_string() {
                json!("Terminating")
            } else {
                o["status"]["phase"].clone()
            };
            vec![
                name,
                json!(format!("{ready}/{}", containers.max(statuses.len()))),
                status,
                json!(restarts),
                age,
                or_none(&o["status"]["podIP"]),
                or_none(&o["spec"]["nodeName"]),
                or_none(&o["status"]["nominatedNodeName"]),
                json!("<none>"),
            ]
        }
        Kind::Service => {
            let ports: Vec<String> = o["spec"]["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| format!("{}/{}", p["port"], p["protocol"].as_str().unwrap_or("TCP")))
                .collect();
            vec![
                name,
                o["spec"]["type"].clone(),
                or_none(&o["spec"]["clusterIP"]),
                json!("<none>"),
                json!(ports.join(",")),
                age,
                json!("<none>"),
            ]
        }
        Kind::Endpoints => {
            let mut eps = Vec::new();
            for subset in o["subsets"].as_array().into_iter().flatten() {
                for a in subset["addresses"].as_array().into_iter().flatten() {
                    for p in subset["ports"].as_array().into_iter().flatten() {
                        eps.push(format!("{}:{}", a["ip"].as_str().unwrap_or(""), p["port"]));
                    }
                }
            }
            let text = if eps.is_empty() {
                "<none>".to_string()
            } else if eps.len() > 3 {
                format!("{} + {} more...", eps[..3].join(","), eps.len() - 3)
            } else {
                eps.join(",")
            };
            vec![name, json!(text), age]
        }
        Kind::EndpointSlice => {
            let ports: Vec<String> = o["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| p["port"].to_string())
                .collect();
            let addrs: Vec<String> = o["endpoints"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|e| strs(&e["addresses"]))
                .collect();
            let addrs = match addrs.len() {
                0 => "<unset>".to_string(),
                1..=3 => addrs.join(","),
                n => format!("{} + {} more...", addrs[..3].join(","), n - 3),
            };
            let ports = if ports.is_empty() {
                "<unset>".into()
            } else {
                ports.join(",")
            };
            vec![name, o["addressType"].clone(), json!(ports), json!(addrs), age]
        }
        Kind::Event => {
            let last = [
                &o["series"]["lastObservedTime"],
                &o["lastTimestamp"],
                &o["eventTime"],
            ]
            .into_iter()
            .find(|v| v.is_string())
            .map_or("<unknown>".to_string(), since);
            let first = [&o["firstTimestamp"], &o["eventTime"]]
                .into_iter()
                .find(|v| v.is_string())
                .map_or("<unknown>".to_string(), since);
            let involved = &o["involvedObject"];
            let object = format!(
                "{}/{}",
                involved["kind"].as_str().unwrap_or("").to_ascii_lowercase(),
                involved["name"].as_str().unwrap_or("")
            );
            let source = match o["source"]["component"].as_str() {
                Some(c) if !c.is_empty() => c.to_string(),
                _ => o["reportingComponent"].as_str().unwrap_or("").to_string(),
            };
            let count = o["series"]["count"].as_i64().or(o["count"].as_i64()).unwrap_or(1);
            vec![
                json!(last),
                o["type"].clone(),
                o["reason"].clone(),
                json!(object),
                json!(involved["fieldPath"].as_str().unwrap_or("")),
                json!(source),
                json!(o["message"].as_str().unwrap_or("")),
                json!(first),
                json!(count),
                name,
            ]
        }
        Kind::PodDisruptionBudget => {
            let or_na = |v: &Value| match v {
                Value::Null => json!("N/A"),
                Value::String(s) => json!(s),
                other => json!(other.to_string()),
            };
            vec![
                name,
                or_na(&o["spec"]["minAvailable"]),
                or_na(&o["spec"]["maxUnavailable"]),
                json!(o["status"]["disruptionsAllowed"].as_i64().unwrap_or(0)),
                age,
            ]
        }
        Kind::Node => {
            let mut status = if o["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
            {
                "Ready".to_string()
            } else {
                "NotReady".to_string()
            };
            if o["spec"]["unschedulable"] == true {
                status.push_str(",SchedulingDisabled");
            }
            let addr = |ty: &str| {
                o["status"]["addresses"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|a| a["type"] == ty)
                    .map_or(json!("<none>"), |a| a["address"].clone())
            };
            let info = &o["status"]["nodeInfo"];
            vec![
                name,
                json!(status),
                json!("<none>"),
                age,
                info["kubeletVersion"].clone(),
                addr("InternalIP"),
                addr("ExternalIP"),
                info["osImage"].clone(),
                info["kernelVersion"].clone(),
                info["containerRuntimeVersion"].clone(),
            ]
        }
        Kind::Namespace => vec![name, o["status"]["phase"].clone(), age],
    }
}

// ---------------------------------------------------------------------------------------------
// Objects the server starts with

/// The namespace of the fixture's own pods.
pub const NAMESPACE: &str = "default";
/// How many `web-*` pods there are.
pub const PODS: usize = 5;
/// The node the `web-*` pods run on.
pub const NODE: &str = "lifeline-node-1";

/// A uid, unique per (start, n).
pub fn uid(start_secs: u64, n: u64) -> String {
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        start_secs as u32,
        n & 0xffff,
        (start_secs >> 32) & 0xfff,
        (n >> 16) & 0xfff,
        (start_secs ^ 0x5eed) & 0xffff_ffff_ffff
    )
}

/// The `web-{i}` pod (metadata.resourceVersion is set by the store).
pub fn web_pod(i: usize, start_secs: u64) -> Value {
    let name = format!("web-{i}");
    let created = rfc3339(start_secs.saturating_sub(3600 * (i as u64 + 1)));
    let ip = format!("10.244.0.{}", 10 + i);
    let image = "registry.k8s.io/pause:3.2";
    json!({
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": uid(start_secs, i as u64),
            "creationTimestamp": created,
            "labels": {"app": "web", "pod-template-hash": "6b7c9d5f8", "lifeline.test/counter": "0"},
            "annotations": {"lifeline.test/modified-at": created},
        },
        "spec": {
            "containers": [{
                "name": "app",
                "image": image,
                "resources": {},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "nodeName": NODE,
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "priority": 0,
            "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Initialized", "status": "True", "lastProbeTime": null, "lastTransitionTime": created},
                {"type": "Ready", "status": "True", "lastProbeTime": null, "lastTransitionTime": created},
                {"type": "ContainersReady", "status": "True", "lastProbeTime": null, "lastTransitionTime": created},
                {"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": created},
            ],
            "hostIP": "192.0.2.10",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": created,
            "containerStatuses": [{
                "name": "app",
                "state": {"running": {"startedAt": created}},
                "lastState": {},
                "ready": true,
                "restartCount": 0,
                "image": image,
                "imageID": "registry.k8s.io/pause@sha256:927d98197ec1141a368550822d18fa1c60bdae27b78b0c004f705f548c07814f",
                "containerID": format!("containerd://{:064x}", start_secs as u128 * 1000 + i as u128),
                "started": true,
            }],
            "qosClass": "BestEffort",
        },
    })
}

/// A pod loaded from `--pods`, with what the apiserver would have filled in.
pub fn loaded_pod(mut pod: Value) -> Result<Value, String> {
    if !pod.is_object() || !pod["metadata"]["name"].is_string() {
        return Err(format!("a pod needs metadata.name: {pod}"));
    }
    pod["kind"] = json!("Pod");
    pod["apiVersion"] = json!("v1");
    if !pod["metadata"]["namespace"].is_string() {
        pod["metadata"]["namespace"] = json!(NAMESPACE);
    }
    if !pod["spec"].is_object() {
        pod["spec"] = json!({});
    }
    if !pod["spec"]["containers"].is_array() {
        pod["spec"]["containers"] = json!([{"name": "app", "image": "registry.k8s.io/pause:3.2"}]);
    }
    if !pod["status"]["phase"].is_string() {
        pod["status"]["phase"] = json!("Running");
    }
    Ok(pod)
}

/// A PodDisruptionBudget loaded from `--pdbs` (internal form: policy/v1).
pub fn loaded_pdb(mut pdb: Value) -> Result<Value, String> {
    if !pdb.is_object() || !pdb["metadata"]["name"].is_string() {
        return Err(format!("a PodDisruptionBudget needs metadata.name: {pdb}"));
    }
    pdb["kind"] = json!("PodDisruptionBudget");
    pdb["apiVersion"] = json!("policy/v1");
    if !pdb["metadata"]["namespace"].is_string() {
        pdb["metadata"]["namespace"] = json!(NAMESPACE);
    }
    if !pdb["spec"].is_object() {
        pdb["spec"] = json!({});
    }
    if !pdb["status"].is_object() {
        pdb["status"] = json!({});
    }
    let status = &mut pdb["status"];
    for key in [
        "disruptionsAllowed",
        "currentHealthy",
        "desiredHealthy",
        "expectedPods",
    ] {
        if !status[key].is_i64() {
            status[key] = json!(0);
        }
    }
    Ok(pdb)
}

pub fn namespace(name: &str, start_secs: u64) -> Value {
    json!({
        "kind": "Namespace",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "creationTimestamp": rfc3339(start_secs.saturating_sub(86_400)),
            "labels": {"kubernetes.io/metadata.name": name},
        },
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    })
}

pub fn node(name: &str, generation: Generation, start_secs: u64) -> Value {
    let created = rfc3339(start_secs.saturating_sub(86_400));
    let now = rfc3339(unix_now().as_secs());
    let version = generation.version_info(None)["gitVersion"].clone();
    json!({
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "creationTimestamp": created,
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"]},
        "status": {
            "conditions": [{
                "type": "Ready",
                "status": "True",
                "lastHeartbeatTime": now,
                "lastTransitionTime": created,
                "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
            }],
            "addresses": [
                {"type": "InternalIP", "address": "192.0.2.10"},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": "0b4b4c0f6f0e4a1e9d1d6a3c2b1a0f9e",
                "systemUUID": "0b4b4c0f-6f0e-4a1e-9d1d-6a3c2b1a0f9e",
                "bootID": "5a4e1c7e-2f3b-4c5d-8e9f-0a1b2c3d4e5f",
                "kernelVersion": "6.1.0-fixture",
                "osImage": "Debian GNU/Linux 12 (bookworm)",
                "containerRuntimeVersion": "containerd://1.7.13",
                "kubeletVersion": version,
                "kubeProxyVersion": version,
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    })
}

/// The `default/kubernetes` Service.
pub fn kubernetes_service(generation: Generation, ip: IpAddr, target_port: u16, start_secs: u64) -> Value {
    let family = if ip.is_ipv4() { "IPv4" } else { "IPv6" };
    let mut spec = json!({
        "ports": [{"name": "https", "protocol": "TCP", "port": 443, "targetPort": target_port}],
        "clusterIP": ip.to_string(),
        "type": "ClusterIP",
        "sessionAffinity": "None",
    });
    if generation == Generation::New {
        spec["clusterIPs"] = json!([ip.to_string()]);
        spec["ipFamilies"] = json!([family]);
        spec["ipFamilyPolicy"] = json!("SingleStack");
        spec["internalTrafficPolicy"] = json!("Cluster");
    }
    json!({
        "kind": "Service",
        "apiVersion": "v1",
        "metadata": {
            "name": "kubernetes",
            "namespace": NAMESPACE,
            "creationTimestamp": rfc3339(start_secs.saturating_sub(86_400)),
            "labels": {"component": "apiserver", "provider": "kubernetes"},
        },
        "spec": spec,
        "status": {"loadBalancer": {}},
    })
}

/// The address type of `ips` (`IPv4` for none), or an error for a mix.
pub fn address_type(ips: &[IpAddr]) -> Result<&'static str, String> {
    match (ips.iter().any(IpAddr::is_ipv4), ips.iter().any(IpAddr::is_ipv6)) {
        (true, true) => Err("endpoint IPs must all be IPv4 or all IPv6".into()),
        (false, true) => Ok("IPv6"),
        _ => Ok("IPv4"),
    }
}

/// The `kubernetes` EndpointSlice (internal form, discovery.k8s.io/v1): what the spec part is
/// for `ips`, merged into `base` (the current object) if any.
pub fn kubernetes_slice(ips: &[IpAddr], port: u16, start_secs: u64) -> Result<Value, String> {
    let endpoints: Vec<Value> = ips
        .iter()
        .map(|ip| json!({"addresses": [ip.to_string()], "conditions": {"ready": true}}))
        .collect();
    Ok(json!({
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {
            "name": "kubernetes",
            "namespace": NAMESPACE,
            "creationTimestamp": rfc3339(start_secs.saturating_sub(86_400)),
            "generation": 1,
            "labels": {"kubernetes.io/service-name": "kubernetes"},
        },
        "addressType": address_type(ips)?,
        "endpoints": endpoints,
        "ports": [{"name": "https", "protocol": "TCP", "port": port}],
    }))
}

/// The core v1 `kubernetes` Endpoints for `ips`.
pub fn kubernetes_endpoints(generation: Generation, ips: &[IpAddr], port: u16, start_secs: u64) -> Value {
    let mut endpoints = json!({
        "kind": "Endpoints",
        "apiVersion": "v1",
        "metadata": {
            "name": "kubernetes",
            "namespace": NAMESPACE,
            "creationTimestamp": rfc3339(start_secs.saturating_sub(86_400)),
        },
    });
    if generation == Generation::New {
        endpoints["metadata"]["labels"] = json!({"endpointslice.kubernetes.io/skip-mirror": "true"});
    }
    if !ips.is_empty() {
        let addresses: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip.to_string()})).collect();
        endpoints["subsets"] = json!([{
            "addresses": addresses,
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        }]);
    }
    endpoints
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_convert_both_ways() {
        let external = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e", "namespace": "default"},
            "eventTime": "2024-01-01T00:00:00.000000Z", "reportingController": "lifeline.io/agent",
            "reportingInstance": "node-a", "action": "Evict", "reason": "Stuck", "type": "Warning",
            "note": "stuck", "regarding": {"kind": "Pod", "name": "p", "namespace": "default"},
        });
        let gv = Gv {
            group: "events.k8s.io",
            version: "v1",
        };
        let internal = ingest(Kind::Event, gv, external.clone());
        assert_eq!(internal["apiVersion"], "v1");
        assert_eq!(internal["message"], "stuck");
        assert_eq!(internal["involvedObject"]["name"], "p");
        assert_eq!(internal["reportingComponent"], "lifeline.io/agent");
        assert!(
            validate_event(gv, &internal).is_empty(),
            "{:?}",
            validate_event(gv, &internal)
        );
        assert_eq!(render(Kind::Event, gv, &internal), external);
        let core = render(Kind::Event, CORE, &internal);
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(core["firstTimestamp"], Value::Null);

        let mut bad = internal.clone();
        bad.as_object_mut().unwrap().remove("eventTime");
        bad["count"] = json!(3);
        let errors: Vec<String> = validate_event(gv, &bad).into_iter().map(|e| e.0).collect();
        assert_eq!(errors, ["eventTime", "count"]);
        // The same object through core v1 is fine (legacy validation only).
        assert!(validate_event(CORE, &bad).is_empty());
    }

    #[test]
    fn discovery_says_what_is_served() {
        let new = Generation::New.resource_list(CORE).unwrap();
        let eviction = new["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "pods/eviction")
            .unwrap()
            .clone();
        assert_eq!(
            (eviction["group"].clone(), eviction["version"].clone()),
            (json!("policy"), json!("v1"))
        );
        let old_gv = Gv {
            group: "policy",
            version: "v1beta1",
        };
        assert!(Generation::Old.resource_list(old_gv).is_some());
        assert!(Generation::New.resource_list(old_gv).is_none());
        assert!(Generation::Old.group("policy").unwrap()["preferredVersion"]["version"] == "v1beta1");
        assert!(Generation::New.group("apps").is_none());
    }

    #[test]
    fn slices_in_v1beta1_shape() {
        let mut slice = kubernetes_slice(&["10.0.0.1".parse().unwrap()], 6443, 0).unwrap();
        slice["endpoints"][0]["nodeName"] = json!("node-a");
        let beta = render(
            Kind::EndpointSlice,
            Gv {
                group: "discovery.k8s.io",
                version: "v1beta1",
            },
            &slice,
        );
        assert_eq!(beta["apiVersion"], "discovery.k8s.io/v1beta1");
        assert_eq!(
            beta["endpoints"][0]["topology"]["kubernetes.io/hostname"],
            "node-a"
        );
        assert!(beta["endpoints"][0].get("nodeName").is_none());
        assert!(address_type(&["10.0.0.1".parse().unwrap(), "::1".parse().unwrap()]).is_err());
    }
}
