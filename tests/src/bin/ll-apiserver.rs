//! `ll-apiserver`: a fake kube-apiserver that behaves like a real one on the wire, for the
//! fault-injection scenarios and the agent's Kubernetes features: TLS with ALPN `h2` /
//! `http/1.1`, discovery, list and watch with resourceVersion semantics, bookmarks, the
//! server-side watch timeout and a graceful SIGTERM; the `default/kubernetes` Service with its
//! EndpointSlice and Endpoints, Pods (ever-changing `web-*` ones plus any loaded), Nodes,
//! PodDisruptionBudgets, the pod eviction subresource and Events, as either API generation.
//!
//! ```text
//! ll-apiserver --listen ADDR --cert-dir DIR [--san IP|DNS]... [--event-interval DUR]
//!              [--bookmark-interval DUR] [--watch-timeout DUR] [--name NAME]
//!              [--generation new|old] [--server-version vX.Y.Z]
//!              [--service-ip IP] [--endpoint-ip IP]... [--endpoint-port PORT]
//!              [--pods FILE] [--pdbs FILE] [--strict-eviction]
//! ```
//!
//! DUR is `300ms`, `2s`, `1.5s`, `1m`. On start the server creates a CA in DIR (`ca.pem`,
//! `ca-key.pem`) unless one is there, then (re)issues `server.pem` / `server-key.pem` signed by it
//! for every `--san` plus 127.0.0.1, ::1 and localhost; a restart on the same DIR keeps the CA, so
//! clients keep trusting it. Once it accepts connections it prints `listening ADDR` on stdout.
//! Every request, connection and watch is logged as one line on stderr (writes also get a
//! `-> CODE` line).
//!
//! Generations (`--generation`, default `new`); discovery (`/api/v1`, `/apis`, `/apis/GROUP`,
//! `/apis/GROUP/VERSION`) says exactly what is served, and anything else is a 404 as on a real
//! server:
//! - `new`, a current apiserver (`/version` v1.30.4): core v1, `discovery.k8s.io/v1`
//!   (EndpointSlice), `policy/v1` (PodDisruptionBudget, and the `pods/eviction` subresource
//!   says `policy/v1`), `events.k8s.io/v1`.
//! - `old`, a 1.18 apiserver (`/version` v1.18.20): core v1, `discovery.k8s.io/v1beta1`,
//!   `policy/v1beta1`, `events.k8s.io/v1beta1`.
//!
//! `--server-version` overrides what `/version` says (nothing else).
//!
//! Objects (one store, one global resourceVersion sequence, every kind listable and watchable
//! at every group-version that serves it; namespaced kinds cluster-wide and per namespace):
//! - Namespaces `default`, `kube-node-lease`, `kube-public`, `kube-system` and those of loaded
//!   objects.
//! - Nodes: `lifeline-node-1` and every `spec.nodeName` of a pod; `GET /api/v1/nodes/NAME`
//!   answers for any name; PATCH works (`kubectl cordon`).
//! - Pods: `default/web-0..4` on `lifeline-node-1`, one of which changes every
//!   `--event-interval`, plus every pod in `--pods FILE` (a JSON array of Pod objects, with
//!   namespace `default`, phase `Running`, uid and creationTimestamp filled in if missing).
//!   create, get, list, watch, patch, delete.
//! - `default/kubernetes` Service: ClusterIP `--service-ip` (10.96.0.1), port 443 → targetPort
//!   `--endpoint-port` (6443). Its EndpointSlice `kubernetes` (label
//!   `kubernetes.io/service-name=kubernetes`, v1 or v1beta1 shape) and core Endpoints
//!   `kubernetes` hold the `--endpoint-ip`s (default: the listen address) on `--endpoint-port`.
//! - PodDisruptionBudgets from `--pdbs FILE` (JSON array; create/patch/delete work too).
//! - Events: created (`generateName` works) and patched (merge, strategic merge, JSON patch)
//!   through core v1 or events.k8s.io; one storage, each shown in its version's shape, as the
//!   real one. Creation is validated as the real ValidateEventCreate does (422 Invalid).
//!
//! Semantics (what a real apiserver does, simplified):
//! - resourceVersions are global and start at the start time in milliseconds, so they grow across
//!   restarts, as etcd's do across apiserver restarts.
//! - `?watch=1`: `resourceVersion` absent, empty or `0` → a synthetic `ADDED` for every current
//!   object, then live events (the real `RV=""`/`"0"` semantics). `resourceVersion=N` → every
//!   event after N from the history (which starts at this process's start), then live events; N
//!   older than the history (a restarted server) → one `ERROR` event with a 410 `Expired` Status,
//!   then the stream ends, like the real watch cache. N newer than the newest event: live events.
//! - `allowWatchBookmarks=true` → a `BOOKMARK` every `--bookmark-interval`.
//! - the stream ends cleanly after min(`timeoutSeconds`, `--watch-timeout`).
//! - `limit`/`continue` page lists; `labelSelector` (=, ==, !=, in, notin, exists, !exists) and
//!   `fieldSelector` (=, ==, != on the field labels the real server supports for the kind, e.g.
//!   `spec.nodeName` for pods; others are a 400) filter lists and watches; a watched object that
//!   stops (starts) matching is DELETED (ADDED), as in the real watch cache.
//! - `Accept: ...;as=Table;...` (kubectl's `get`) is answered with a `meta.k8s.io/v1` Table.
//! - `?dryRun=All` changes nothing. PATCH that changes nothing is a no-op (no new
//!   resourceVersion). A PATCH carrying a stale resourceVersion is a 409 Conflict.
//! - `POST /api/v1/namespaces/NS/pods/NAME/eviction`: the body's apiVersion must be one the
//!   server's scheme knows (`old`: `policy/v1beta1` only, so `policy/v1` is a 400 "cannot be
//!   handled as a Eviction"; `new`: `policy/v1` and also `policy/v1beta1`, as a real 1.22+ server
//!   accepts both on this subresource, unless `--strict-eviction` makes it a 400 "does not match
//!   the expected API version"); metadata.name must match the URL (400). Missing pod → 404. A
//!   terminal pod, or one no PodDisruptionBudget selects, is deleted at once (201 Status
//!   Success, a DELETED watch event). One matching PDB with `status.disruptionsAllowed` 0 → 429
//!   TooManyRequests with a `DisruptionBudget` cause; > 0 → decremented and the pod deleted; two
//!   or more matching PDBs → 500. An empty PDB selector matches every pod in policy/v1, none in
//!   v1beta1.
//! - authentication is not checked.
//! - SIGTERM/SIGINT: the listener is closed at once, connections are asked to shut down (h2
//!   GOAWAY, h1 close after the response in flight), open watches run until their timeout, and
//!   the process exits 0 once every connection closed, or after `--watch-timeout`.
//!
//! Fixture endpoints (not part of the Kubernetes API):
//! - `POST /fixture/endpoint-ips` with a JSON array of IPs (or `{"ips": [...], "port": N}`):
//!   replaces the addresses of the `kubernetes` EndpointSlice and Endpoints (a MODIFIED watch
//!   event for each); answers both objects.
//! - `GET /fixture/log`: `{"evictions": [...], "deletions": [...], "events": [...]}`: every
//!   eviction request (namespace, name, apiVersion, outcome `evicted`/`blocked`/`not-found`/
//!   `rejected`/`error`, code, pdb, message), every pod DELETE, every Event create and patch
//!   (verb, apiVersion, namespace, name, code, object).
use std::process::ExitCode;

fn main() -> ExitCode {
    lifeline_integration::apiserver::main()
}
