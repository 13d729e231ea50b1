//! Kueue (kueue.x-k8s.io): a gang as one pod group.
//!
//! Where the namespace has a LocalQueue (or `kubernetes.yaml` names one),
//! every pod of a gang carries the queue's label, the cluster's pod group
//! name and the group's size; Kueue's webhook gates each pod as it is
//! created and its controller keeps one Workload for the group, admitted
//! (the gates lifted on every pod at once) only when the ClusterQueue's
//! quota holds the whole group. A gang Kueue does not admit within the
//! launch timeout is deleted and reported as [`ErrorKind::Capacity`] with
//! the Workload's own words.
//!
//! A group stays retriable while it runs: a pod of it that is lost (its
//! node gone, or reclaimed) is removed by gangway, Kueue's finalizer
//! lifted with it, and a replacement pod created with the same group
//! label, total and spec joins the admitted Workload, which keeps its
//! quota meanwhile; Kueue lifts the new pod's gate as it did the others'.
//! A group that ends as a whole (`down`, a failed launch) is first marked
//! `retriable-in-group: "false"` on every pod (Kueue's documented way to
//! end a pod group): Kueue then finishes the Workload, lifts its
//! finalizers once the pods have ended, and releases the quota.

use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::core::GroupVersionKind;

use crate::config::{Config, Topology};
use crate::{api_err, err, ErrorKind, Result};
use k8s_openapi::api::core::v1 as core;

/// The label naming a pod's LocalQueue.
pub const QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// The label naming a pod's group (and the group's Workload).
pub const GROUP_LABEL: &str = "kueue.x-k8s.io/pod-group-name";
/// The annotation giving the group's size.
pub const TOTAL_ANNOTATION: &str = "kueue.x-k8s.io/pod-group-total-count";
/// `"false"`: Kueue does not wait for replacements of the group's failed
/// pods. Without it a gang whose pods were deleted (`down`, a failed
/// launch) leaves them held by Kueue's finalizer and its Workload holding
/// quota until as many new pods join the group. Set on every pod of a
/// group just before the group is deleted as a whole, never at creation:
/// a running group must take a replacement for a lost pod (Kueue refuses
/// to make an unretriable group retriable again).
pub const RETRIABLE_ANNOTATION: &str = "kueue.x-k8s.io/retriable-in-group";
/// The finalizer Kueue's webhook puts on each pod it manages.
pub const FINALIZER: &str = "kueue.x-k8s.io/managed";
/// Topology-aware scheduling: every pod in one domain of this level.
pub const REQUIRED_TOPOLOGY: &str = "kueue.x-k8s.io/podset-required-topology";
/// Topology-aware scheduling: as few domains of this level as can be.
pub const PREFERRED_TOPOLOGY: &str = "kueue.x-k8s.io/podset-preferred-topology";
/// The scheduling gate Kueue's webhook puts on a pod until admission.
pub const ADMISSION_GATE: &str = "kueue.x-k8s.io/admission";

/// What a launch puts on its pods for Kueue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// The LocalQueue.
    pub queue: String,
    /// The pod group's name (the cluster's pod name prefix).
    pub name: String,
    /// How many pods the group has.
    pub total: u32,
    /// Topology-aware scheduling, if asked.
    pub topology: Option<Topology>,
}

impl Group {
    /// Adds the group's labels and annotations.
    pub fn mark(
        &self,
        labels: &mut std::collections::BTreeMap<String, String>,
        annotations: &mut std::collections::BTreeMap<String, String>,
    ) {
        labels.insert(QUEUE_LABEL.into(), self.queue.clone());
        labels.insert(GROUP_LABEL.into(), self.name.clone());
        annotations.insert(TOTAL_ANNOTATION.into(), self.total.to_string());
        match &self.topology {
            Some(Topology::Required(level)) => {
                annotations.insert(REQUIRED_TOPOLOGY.into(), level.clone());
            }
            Some(Topology::Preferred(level)) => {
                annotations.insert(PREFERRED_TOPOLOGY.into(), level.clone());
            }
            None => {}
        }
    }
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", kind),
        plural,
    )
}

/// The LocalQueue a launch in `namespace` uses: the one `kubernetes.yaml`
/// names for the context (it must exist), else the namespace's only one
/// (or the one named `default` among several); `None` without Kueue (its
/// CRD absent) or without a LocalQueue there.
pub async fn queue(
    client: &kube::Client,
    cfg: &Config,
    context: &str,
    namespace: &str,
    loc: &str,
) -> Result<Option<String>> {
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &resource("LocalQueue", "localqueues"),
    );
    // `listed`: false where the list is not ours to read (RBAC narrower
    // than Kueue's user roles): a queue kubernetes.yaml names is then
    // taken on trust, and without one the pods are plain.
    let (found, listed) = match api.list(&ListParams::default()).await {
        Ok(l) => (
            l.items
                .into_iter()
                .filter_map(|q| q.metadata.name)
                .collect::<Vec<_>>(),
            true,
        ),
        // No such resource: Kueue is not installed.
        Err(kube::Error::Api(s)) if s.code == 404 => (Vec::new(), true),
        Err(kube::Error::Api(s)) if s.code == 403 => {
            tracing::warn!("{loc}: cannot list Kueue's LocalQueues: {}", s.message);
            (Vec::new(), false)
        }
        Err(e) => return Err(api_err(loc, "cannot list Kueue's LocalQueues", e)),
    };
    if let Some(q) = cfg.queue_for(context) {
        if listed && !found.iter().any(|f| f == q) {
            return Err(err(
                ErrorKind::InvalidRequest,
                loc,
                format!(
                    "kubernetes.yaml names Kueue queue '{q}', but namespace {namespace} has {}",
                    if found.is_empty() {
                        "no LocalQueue (or no Kueue)".to_string()
                    } else {
                        format!("LocalQueues {}", found.join(", "))
                    }
                ),
            ));
        }
        return Ok(Some(q.to_string()));
    }
    match found.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(one.clone())),
        many if many.iter().any(|q| q == "default") => Ok(Some("default".into())),
        many => Err(err(
            ErrorKind::InvalidRequest,
            loc,
            format!(
                "namespace {namespace} has several Kueue LocalQueues ({}); name one as queue: in kubernetes.yaml",
                many.join(", ")
            ),
        )),
    }
}

/// The pod group a pod belongs to, if any.
pub fn group_of(pod: &core::Pod) -> Option<&str> {
    pod.metadata
        .labels
        .as_ref()?
        .get(GROUP_LABEL)
        .map(String::as_str)
}

/// Whether the pod is already marked as not to be replaced in its group.
pub fn unretriable(pod: &core::Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RETRIABLE_ANNOTATION))
        .is_some_and(|v| v == "false")
}

/// Whether Kueue's finalizer still holds the pod.
pub fn finalized(pod: &core::Pod) -> bool {
    pod.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER))
}

/// Whether Kueue still holds the pod back.
pub fn gated(pod: &core::Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| g.iter().any(|g| g.name == ADMISSION_GATE))
}

/// Kueue's words on why the group's Workload is not admitted: the message
/// of its QuotaReserved (else Admitted) condition that is not True.
pub async fn why_not_admitted(
    client: &kube::Client,
    namespace: &str,
    group: &str,
) -> Option<String> {
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &resource("Workload", "workloads"),
    );
    let wl = api.get_opt(group).await.ok()??;
    let conds = wl.data.get("status")?.get("conditions")?.as_array()?;
    let cond = |t: &str| {
        conds
            .iter()
            .find(|c| c.get("type").and_then(|v| v.as_str()) == Some(t))
    };
    for t in ["QuotaReserved", "Admitted"] {
        if let Some(c) = cond(t) {
            if c.get("status").and_then(|v| v.as_str()) != Some("True") {
                let m = c
                    .get("message")
                    .and_then(|v| v.as_str())
                    .or_else(|| c.get("reason").and_then(|v| v.as_str()))?;
                return Some(m.to_string());
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_group_marks_every_pod_for_kueue() {
        let mut g = Group {
            queue: "lq".into(),
            name: "gw-train-3f2a9c1d-00beef".into(),
            total: 4,
            topology: Some(Topology::Required("t/block".into())),
        };
        let (mut l, mut a) = (BTreeMap::new(), BTreeMap::new());
        g.mark(&mut l, &mut a);
        assert_eq!(l[QUEUE_LABEL], "lq");
        assert_eq!(l[GROUP_LABEL], "gw-train-3f2a9c1d-00beef");
        assert_eq!(a[TOTAL_ANNOTATION], "4");
        // A running group takes replacements; it is ended explicitly.
        assert!(!a.contains_key(RETRIABLE_ANNOTATION));
        assert_eq!(a[REQUIRED_TOPOLOGY], "t/block");
        assert!(!a.contains_key(PREFERRED_TOPOLOGY));
        g.topology = Some(Topology::Preferred("t/block".into()));
        let (mut l, mut a) = (BTreeMap::new(), BTreeMap::new());
        g.mark(&mut l, &mut a);
        assert_eq!(a[PREFERRED_TOPOLOGY], "t/block");
        assert!(!a.contains_key(REQUIRED_TOPOLOGY));
    }

    #[test]
    fn only_kueues_own_gate_counts_as_gated() {
        let mut p = core::Pod::default();
        assert!(!gated(&p));
        p.spec = Some(core::PodSpec {
            scheduling_gates: Some(vec![core::PodSchedulingGate {
                name: "example.com/other".into(),
            }]),
            ..Default::default()
        });
        assert!(!gated(&p));
        p.spec.as_mut().unwrap().scheduling_gates = Some(vec![core::PodSchedulingGate {
            name: ADMISSION_GATE.into(),
        }]);
        assert!(gated(&p));
    }
}
