//! Pod eviction through the Eviction API (`pods/eviction`), never a plain delete, so that
//! PodDisruptionBudgets are honoured.
use kube::core::Status;
use serde_json::{json, Value};

use super::discovery::EvictionApi;

/// What an eviction request achieved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EvictOutcome {
    /// The apiserver accepted the eviction: the pod is being deleted gracefully.
    Evicted,
    /// 429 Too Many Requests: a PodDisruptionBudget does not allow it now (or the apiserver is
    /// shedding load); `reason` is the apiserver's message.
    Blocked { reason: String },
    /// The pod does not exist (any more).
    NotFound,
}

/// `POST` path of the eviction subresource.
pub fn path(namespace: &str, name: &str) -> String {
    format!("/api/v1/namespaces/{namespace}/pods/{name}/eviction")
}

/// The Eviction body in the API version the apiserver takes.
pub fn body(api: EvictionApi, namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": api.api_version(),
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    })
}

/// A refusal that is not one of the [`EvictOutcome`]s.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    pub code: u16,
    pub reason: String,
    pub message: String,
}

/// Classifies the apiserver's answer: `Ok(())` for a 2xx, else the `Status` it returned.
///
/// A 404 is `NotFound` only when it is about the pod (`details.kind: pods`); a 404 without
/// that (the eviction subresource is not served in that version) is a refusal.
pub fn classify(answer: Result<(), &Status>) -> Result<EvictOutcome, Refused> {
    let status = match answer {
        Ok(()) => return Ok(EvictOutcome::Evicted),
        Err(status) => status,
    };
    match status.code {
        429 => Ok(EvictOutcome::Blocked {
            reason: if status.message.is_empty() {
                "429 Too Many Requests".to_owned()
            } else {
                status.message.clone()
            },
        }),
        404 if status.details.as_ref().is_some_and(|d| d.kind == "pods") => Ok(EvictOutcome::NotFound),
        code => Err(Refused {
            code,
            reason: status.reason.clone(),
            message: status.message.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(text: &str) -> Status {
        serde_json::from_str(text).expect("status")
    }

    #[test]
    fn bodies_per_version() {
        assert_eq!(path("ops", "p"), "/api/v1/namespaces/ops/pods/p/eviction");
        assert_eq!(
            body(EvictionApi::PolicyV1beta1, "ops", "p"),
            json!({"apiVersion": "policy/v1beta1", "kind": "Eviction", "metadata": {"name": "p", "namespace": "ops"}})
        );
        assert_eq!(body(EvictionApi::PolicyV1, "ops", "p")["apiVersion"], "policy/v1");
    }

    #[test]
    fn answers_of_a_real_apiserver() {
        assert_eq!(classify(Ok(())), Ok(EvictOutcome::Evicted));
        // A PodDisruptionBudget blocks it (1.20 and 1.33 answer alike).
        let pdb = status(
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Cannot evict pod as it would violate the pod's disruption budget.","reason":"TooManyRequests","details":{"causes":[{"reason":"DisruptionBudget","message":"The disruption budget notifier-pdb needs 1 healthy pods and has 1 currently"}]},"code":429}"#,
        );
        assert_eq!(
            classify(Err(&pdb)),
            Ok(EvictOutcome::Blocked {
                reason: "Cannot evict pod as it would violate the pod's disruption budget.".into()
            })
        );
        let gone = status(
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \"p\" not found","reason":"NotFound","details":{"name":"p","kind":"pods"},"code":404}"#,
        );
        assert_eq!(classify(Err(&gone)), Ok(EvictOutcome::NotFound));
        let unserved = status(
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","details":{},"code":404}"#,
        );
        assert_eq!(classify(Err(&unserved)).unwrap_err().code, 404);
        let forbidden = status(
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \"p\" is forbidden: User \"system:serviceaccount:lifeline:lifeline\" cannot create resource \"pods/eviction\" in API group \"\" in the namespace \"ops\"","reason":"Forbidden","details":{"name":"p","kind":"pods"},"code":403}"#,
        );
        let refused = classify(Err(&forbidden)).unwrap_err();
        assert_eq!((refused.code, refused.reason.as_str()), (403, "Forbidden"));
        assert!(refused.message.contains("pods/eviction"));
    }
}
